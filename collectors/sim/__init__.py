"""The simulated backend: virtual nodes whose GPUs, NICs and disks behave the way real hardware does.

Owns the simulated node (``node``), the shared workload types it and the workload models agree on (``spec``),
the production workload models (``workloads``), node profiles from vendor specifications (``profiles``), the
demo's and the benches' scenarios (``scenarios``) and the speed of one GPU model against another (``speed``).
May import the real collectors' base and ``agent.protocol``; the real collectors never import it."""
