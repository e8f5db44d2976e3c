"""Every wire format the arm's firmware speaks (CiA 402 objects and PDO maps, serial frames, gateway registers, the state stream), defined once, and the helpers every layer of armid shares."""

from firmware_bridge.runtime.moved_modules import alias_moved_modules

# modules that moved, importable at their old paths too
alias_moved_modules({
    "firmware_bridge.errors": "firmware_bridge.runtime.errors",
    "firmware_bridge.log_throttle": "firmware_bridge.runtime.log_throttle",
    "firmware_bridge.rt_timing": "firmware_bridge.runtime.rt_timing",
    "firmware_bridge.json_requests": "firmware_bridge.runtime.json_requests",
    "firmware_bridge.setpoint_buffer": "firmware_bridge.runtime.setpoint_buffer",
    "firmware_bridge.transport": "firmware_bridge.runtime.transport_contract",
})
