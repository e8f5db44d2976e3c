"""The armid driver daemon: transports to the drives, the 1 kHz control cycle, the ZeroMQ state stream and command server, and the recorder."""

from firmware_bridge.runtime.moved_modules import alias_moved_modules

# modules that moved, importable at their old paths too
alias_moved_modules({
    "driver.recording": "firmware_bridge.recording",
    "driver.mcap_schema": "firmware_bridge.mcap_schema",
})
