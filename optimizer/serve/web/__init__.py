"""The optimizer's HTTP layer: the JSON API, the console pages people use, health and self-metrics.

It depends on the optimizer and nothing in the optimizer depends on it: the daemon (or the demo) builds a
``WebServer`` around an ``Optimizer`` and attaches it."""
