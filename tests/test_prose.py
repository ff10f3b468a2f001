"""The docstrings read in short sentences (#45 item 1): per package, the median sentence is at most 11 words and
parentheses are at most 4.2 per 100 words.

A sentence ends at ``.``, ``!`` or ``?`` before a capital, at a line that starts a list item or an argument
(``- ``, ``name: ``), and at a blank line. Code and diagrams are not prose: lines after ``::``, lines with
box-drawing arrows, and indented lines that assign or call. Run ``python tests/test_prose.py [package ...]`` for
the figures and the longest sentences.
"""
from __future__ import annotations

import ast
import re
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("stream", "kernels", "renderers", "models", "apps")
MAX_MEDIAN_WORDS = 11
MAX_PARENS_PER_100_WORDS = 4.2

_DIAGRAM = re.compile(r"[─│┌┐└┘├┤┬┴┼▶◀]")
_CODE = re.compile(r"^\s{4,}(\S+\s*=[^=]|[\w.]+\(|>>>|\$ )")
_ITEM = re.compile(r"^\s*(- |\* |\d+\. |[\w*]+( \([^)]*\))?: |``[^`]+``: )")
_HEADER = re.compile(r"^\s*(Args|Returns|Raises|Ports|Yields|Attributes|Example|Examples|Note|Notes):\s*$")
_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*(\"'])")


def prose_lines(doc: str) -> list[str]:
    """The docstring's prose lines: code blocks, diagrams and section headers left out."""
    lines, out, code_indent = doc.splitlines(), [], None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if code_indent is not None:
            if not line.strip() or indent > code_indent:
                continue
            code_indent = None
        if line.rstrip().endswith("::"):
            code_indent = indent
            line = line.rstrip()[:-1]
        if _DIAGRAM.search(line) or _CODE.match(line) or _HEADER.match(line):
            continue
        out.append(line)
    return out


def sentences(doc: str) -> list[str]:
    """The docstring's sentences (see the module docstring)."""
    chunks, current = [], []
    for line in prose_lines(doc):
        if not line.strip() or _ITEM.match(line):
            if current:
                chunks.append(" ".join(current))
            current = [line.strip()] if line.strip() else []
        else:
            current.append(line.strip())
    if current:
        chunks.append(" ".join(current))
    return [s for chunk in chunks for s in _END.split(chunk) if s.split()]


def docstrings(package: str):
    """(path, docstring) of every module, class and function of ``package``."""
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    yield path.relative_to(ROOT), doc


def measure(package: str) -> dict:
    """The package's docstring sentences: count, median words, parentheses per 100 words, the longest ten."""
    found = [(len(s.split()), s.count("("), str(path), s) for path, doc in docstrings(package) for s in sentences(doc)]
    words = sum(n for n, *_ in found)
    return {"sentences": len(found), "median_words": statistics.median(n for n, *_ in found),
            "parens_per_100_words": 100 * sum(p for _, p, *_ in found) / max(words, 1),
            "longest": sorted(found, reverse=True)[:10]}


@pytest.mark.parametrize("package", PACKAGES)
def test_docstring_sentences_are_short(package):
    m = measure(package)
    longest = "\n".join(f"  {n} words, {path}: {s[:160]}" for n, _, path, s in m["longest"][:3])
    assert m["median_words"] <= MAX_MEDIAN_WORDS, \
        f"{package}: median docstring sentence {m['median_words']} words (at most {MAX_MEDIAN_WORDS}); " \
        f"longest:\n{longest}"
    assert m["parens_per_100_words"] <= MAX_PARENS_PER_100_WORDS, \
        f"{package}: {m['parens_per_100_words']:.1f} parentheses per 100 words (at most {MAX_PARENS_PER_100_WORDS})"


if __name__ == "__main__":
    for package in sys.argv[1:] or PACKAGES:
        m = measure(package)
        print(f"{package}: {m['sentences']} sentences, median {m['median_words']} words, "
              f"{m['parens_per_100_words']:.1f} parentheses per 100 words")
        for n, _, path, s in m["longest"]:
            print(f"  {n:3d}  {path}: {s[:150]}")
