"""Stage 5, the command line: ``fleetfit`` and its subcommands, the demo and the offline tools.

Owns the entry point (``cli``, the console script), argument checks (``cliargs``), the demo and where it keeps its
state (``demo``, ``demostate``), offline classification (``offline``), what-if purchases (``buy``) and the catalog
view (``catalog_view``). May import every stage of the optimizer, ``agent`` and ``collectors``; nothing imports
it."""
