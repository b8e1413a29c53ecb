"""Stage 1, ingest: a telemetry window becomes the optimizer's state of the fleet.

Owns the digest of a window (``digest``), each workload's long history (``history``), the fleet's state fed one
MQTT message at a time (``fleet``), GPU shares of a node's devices (``shares``) and the ingest lag (``lag``).
May import ``agent`` and ``collectors``; nothing else of the optimizer."""
