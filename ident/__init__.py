"""armid: dynamics and kinematics identification of serial robot arms (models and mathematics, no hardware I/O)."""
