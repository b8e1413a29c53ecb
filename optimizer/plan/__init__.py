"""Stage 3, plan: from a fleet snapshot to moves, purchases and the order to carry them out in.

Owns the planner's problem (``problem``), the CP-SAT model (``model``), its bound and rounding (``bound``,
``rounding``), pools of identical nodes (``pools``), purchases (``purchases``), the order of moves
(``ordering``), cutting a solve short (``interrupt``), the plan with its reasons (``recommend``) and plans
rendered for people and programs (``render``). May import ``optimizer.decide``, ``optimizer.ingest``, ``agent``
and ``collectors``."""
