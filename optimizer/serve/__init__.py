"""Stage 4, serve: the optimizer daemon and everything it keeps, publishes and posts.

Owns the daemon (``service``), its configuration (``config``), which optimizer plans which site
(``ownership``), self-metrics (``selfmetrics``), the demo's embedded broker (``broker``), the time-series store
(``store``, ``lineproto``, ``series``), the state file (``statedb``), the recommendation lifecycle and the
outcomes of applied moves (``lifecycle``, ``outcomes``), showback (``report``, ``report_chat``), the HTTP layer
(``web/``) and chat alerts (``alerts/``). May import every stage below it (``plan``, ``decide``, ``ingest``),
``agent`` and ``collectors``."""
