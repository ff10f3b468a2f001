"""``framegraph bench NAME``'s implementations, one module per benchmark.

Each module's ``run`` measures and writes the JSON; its ``figure`` draws it. Shared modules: ``meta`` writes
metadata, JSON and PNG. ``measure`` holds timing, percentiles and memory. ``speech`` makes test speech. ``report``
is ``bench report``. Each bench's options are declared by its front, ``apps/commands/bench/NAME.py``.
:data:`~framegraph.apps.commands.bench.BENCHES` lists them."""
