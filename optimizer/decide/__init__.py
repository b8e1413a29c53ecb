"""Stage 2, decide: what each workload is, what it costs where, and what is misplaced.

Owns the hardware catalog and its sourced figures (``catalog``, ``data/``, ``performance``), cost and fit
(``costs``), the plausibility of a node's claimed hardware (``inventory``), features, shape and classification
(``features``, ``shape``, ``classify``), the fleet snapshot the planner reads (``snapshot``) and misplacement
findings (``findings``). May import ``optimizer.ingest``, ``agent`` and ``collectors``."""
