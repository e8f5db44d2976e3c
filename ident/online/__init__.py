"""Identification on the live stream: recursive least squares (`rls`), the online identifier on a sample
stream (`identifier`), payload tracking (`payload_tracking`), and the service that feeds them from the
driver's ZeroMQ stream (`service`, the one module of ident with sockets).

`from ident.online import OnlineIdentifier` gives the online identifier.
"""
from ident.online.identifier import (MAX_KERNEL_EDGE, Counters, EstimateFileError, JointWeightedRLS,
                                     OnlineIdentifier, Report, SampleWindow, WindowRows, zero_phase_kernels)

__all__ = ["OnlineIdentifier", "JointWeightedRLS", "SampleWindow", "WindowRows", "EstimateFileError", "Counters",
           "Report", "zero_phase_kernels", "MAX_KERNEL_EDGE"]
