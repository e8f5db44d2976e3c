"""The armid driver daemon: transports to the drives, the 1 kHz control cycle, the ZeroMQ state stream and command server, and the recorder."""
