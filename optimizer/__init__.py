"""The fleetfit optimizer: ingests telemetry, classifies workloads and plans rebalancing moves."""
