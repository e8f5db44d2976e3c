"""armid sim package (grows with its issue)."""
