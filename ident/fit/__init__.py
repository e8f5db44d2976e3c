"""Fitting the model to recordings: preprocessing (`preprocess`, `resample`), excitation design
(`excitation`), least squares with uncertainties (`estimate`), the physically consistent fit (`consistent`),
drive gains (`drive_gains`), the fit's checks (`checks`) and the batch pipeline that joins them (`batch`)."""
