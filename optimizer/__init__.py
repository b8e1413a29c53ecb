"""The fleetfit optimizer, in the stages a telemetry window goes through, each a sub-package that imports only
the ones before it: ``ingest`` → ``decide`` → ``plan`` → ``serve`` → ``commands`` (docs/layout.md)."""
