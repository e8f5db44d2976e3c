"""Runtime helpers every layer of armid shares, beside the wire formats: the input-error base (`errors`),
rate-limited logging (`log_throttle`), waiting for deadlines (`rt_timing`), bounded JSON requests
(`json_requests`), the setpoint buffer of streamed targets (`setpoint_buffer`), the transport contract
(`transport_contract`), declared transport options (`options`), counters as a dataclass (`counters`), and old
module paths kept importable (`moved_modules`)."""
