"""The fleetfit per-node agent: samples GPU, NIC and storage telemetry and publishes it over MQTT."""

__version__ = "0.1.0"
