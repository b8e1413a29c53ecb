"""Telemetry sources, one module each, behind the small interface in :mod:`collectors.base`; the simulated
backend lives apart in :mod:`collectors.sim`.

The collectors import two modules of the agent and no other: ``agent.protocol`` (the wire protocol, which
both sides import) and ``agent.metrics`` (metric families); both import nothing of the project."""
