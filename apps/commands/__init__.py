"""The fronts of the ``framegraph`` commands.

Each module defines ``add_arguments(parser)`` and ``run(args)``. It imports only light modules at its top. Its
``run`` imports the command's implementation. ``apps/cli.py``'s docstring states the rule. ``bench/`` holds one
front per benchmark."""
