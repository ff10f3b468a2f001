"""The fronts of the ``framegraph`` commands: each module defines ``add_arguments(parser)`` and ``run(args)``,
imports only light modules at its top, and its ``run`` imports the command's implementation (the rule:
``apps/cli.py``'s docstring). ``bench/`` holds one front per benchmark."""
