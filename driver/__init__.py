"""armid driver package (grows with its issue)."""
