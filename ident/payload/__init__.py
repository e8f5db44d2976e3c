"""Payload identification: the body a tool, gripper or workpiece adds at the flange.

- `body`: `payload_parameters(mass, com, inertia)`, the 10 standard parameters about the flange origin
  that `ident.model.dynamics.load_regressor` and `merge_payload` use.
- `result`: `PayloadEstimate`, what every identification method returns.
- The methods: the three dynamic methods of Zhang, Qin and Zou (2017) (`dynamic`), the torque balance of
  Gao, Zhao and Li (2025) (`balance`), the general static method (`static`), and online tracking (`online`).
"""
from ident.payload.body import payload_parameters
from ident.payload.result import PARAMETER_NAMES, PayloadEstimate

__all__ = ["payload_parameters", "PayloadEstimate", "PARAMETER_NAMES"]
