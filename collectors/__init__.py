"""Telemetry sources, one module each, behind the small interface in :mod:`collectors.base`."""
