"""Parse ``framegraph`` command lines the way ``framegraph`` does, without running them: one per line on stdin,
``NAME<TAB>ARG ARG ...`` (arguments split on spaces); prints ``ok NAME`` or ``FAIL NAME: argparse's message`` per
line and exits 2 when one fails. ``benchmarks/gpu_run.sh --dry-run`` checks every step's command with it.

    printf 'render\tbench render --out r.json --case-cap 50\n' | python benchmarks/check_command.py
"""
import contextlib
import io
import sys

from framegraph.apps.cli import build_parser


def parses(argv: list[str]) -> str | None:
    """None when ``argv`` parses, else argparse's message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser(argv).parse_args(argv)
    except SystemExit as exc:
        if exc.code:
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
    return None


def main() -> int:
    failed = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        name, _, args = line.rstrip("\n").partition("\t")
        problem = parses(args.split())
        print(f"ok {name}" if problem is None else f"FAIL {name}: {problem}")
        failed |= problem is not None
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
