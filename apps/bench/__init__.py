"""``framegraph bench NAME``'s implementations: one module per benchmark (``run`` measures and writes the JSON,
``figure`` draws it), and what they share — ``meta`` (metadata, JSON and PNG writing), ``measure`` (timing,
percentiles, memory), ``speech`` (test speech), ``report`` (``bench report``). Each bench's options are declared by
its front, ``apps/commands/bench/NAME.py``, where :data:`~framegraph.apps.commands.bench.BENCHES` lists them."""
