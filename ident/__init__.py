"""armid's identification of serial robot arms, by role: the model and its kernels (`model`), fitting
recordings (`fit`), what the user gets (`outputs`), identification on the live stream (`online`, the one
subpackage with sockets), payloads (`payload`) and kinematic calibration (`calibration`)."""

from firmware_bridge.runtime.moved_modules import alias_moved_modules

# modules that moved, importable at their old paths too
alias_moved_modules({
    "ident.kernels": "ident.model.kernels",
    "ident.spatial": "ident.model.spatial",
    "ident.dynamics": "ident.model.dynamics",
    "ident.base_params": "ident.model.base_params",
    "ident.gautier_khalil": "ident.model.gautier_khalil",
    "ident.urdf": "ident.model.urdf",
    "ident.urdf_export": "ident.model.urdf_export",
    "ident.frames": "ident.model.frames",
    "ident.load_separated": "ident.model.load_separated",
    "ident.limits": "ident.model.limits",
    "ident.preprocess": "ident.fit.preprocess",
    "ident.resample": "ident.fit.resample",
    "ident.excitation": "ident.fit.excitation",
    "ident.estimate": "ident.fit.estimate",
    "ident.consistent": "ident.fit.consistent",
    "ident.fit_checks": "ident.fit.checks",
    "ident.batch": "ident.fit.batch",
    "ident.drive_gains": "ident.fit.drive_gains",
    "ident.results": "ident.outputs.results",
    "ident.report": "ident.outputs.report",
    "ident.report_html": "ident.outputs.report_html",
    "ident.provenance": "ident.outputs.provenance",
    "ident.reference": "ident.outputs.reference",
    "ident.fleet": "ident.outputs.fleet",
    "ident.fleet_report": "ident.outputs.fleet_report",
    "ident.rls": "ident.online.rls",
    "ident.service": "ident.online.service",
    "ident.payload.online": "ident.online.payload_tracking",
})
