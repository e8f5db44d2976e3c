"""Kinematic calibration after Pashkevich (2004): elementary-transform models, identifiability and minimal model
synthesis, the per-axis SVD fit and Gauss-Newton identification, pose planning, files and reports."""
