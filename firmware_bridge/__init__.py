"""armid firmware_bridge package (grows with its issue)."""
