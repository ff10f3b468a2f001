"""Collects benchmark JSON files into one HTML page, with plots embedded, and a summary PNG.

    framegraph bench report --inputs benchmarks/results --out out/report.html

Each JSON is drawn by the bench that wrote it, with that bench's ``figure``. Its ``"benchmark"`` field names
the bench. Older files without the name are recognised by their content:

- ``hop_overhead``: the runtime bench;
- ``results`` with ``op``: the kernel bench;
- ``results`` keyed by backend: the render bench.

Anything else is shown as a table of its numbers. Nothing is re-measured. The page shows what the files say,
with their device, versions and commands.
"""
from __future__ import annotations

import argparse
import base64
import glob
import html
import io
import json
import os

from ..commands.bench import BENCHES, implementation
from .meta import pyplot


def _load(paths: list[str]) -> list[tuple[str, dict]]:
    files: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(glob.glob(os.path.join(p, "**", "*.json"), recursive=True))
        elif os.path.exists(p):
            files.append(p)
        else:
            raise FileNotFoundError(f"bench report: {p}: no such file or folder")
    out = []
    for f in files:
        try:
            with open(f) as fh:
                data = json.load(fh)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"bench report: {f}: not valid JSON ({exc})") from None
        if isinstance(data, dict):
            out.append((f, data))
    if not out:
        raise ValueError(f"bench report: no benchmark JSON found in {', '.join(paths)}")
    return out


def kind_of(data: dict) -> str:
    """The name of the bench that wrote ``data``, a key of ``BENCHES``, or ``"other"``."""
    if data.get("benchmark") in BENCHES:
        return data["benchmark"]
    if "hop_overhead" in data:
        return "runtime"
    results = data.get("results")
    if isinstance(results, list) and results and isinstance(results[0], dict) and "op" in results[0]:
        return "kernels"
    if isinstance(results, dict) and any(isinstance(v, dict) and "fps" in v for v in results.values()):
        return "render"
    return "other"


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _table(rows: list[tuple[str, object]]) -> str:
    cells = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(_fmt(v))}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _flat_numbers(data, prefix="") -> list[tuple[str, object]]:
    out = []
    for k, v in data.items() if isinstance(data, dict) else []:
        key = f"{prefix}{k}"
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((key, v))
        elif isinstance(v, dict) and len(out) < 200:
            out += _flat_numbers(v, key + ".")
    return out


def build_report(inputs: list[str]) -> tuple[str, list]:
    """HTML of the report, and the matplotlib figures it holds for the summary PNG."""
    plt = pyplot()
    sections, figures = [], []
    for path, data in _load(inputs):
        kind = kind_of(data)
        img = ""
        if kind in BENCHES:
            fig = implementation(kind).figure(data, plt)
            figures.append(fig)
            img = f'<img src="data:image/png;base64,{_png(fig)}">'
        versions = data.get("versions") or {k: data.get(k) for k in ("torch", "triton") if data.get(k)}
        meta = [("device", data.get("device")), ("command", data.get("command")),
                ("git commit", data.get("git_commit")), ("date", data.get("date")),
                ("versions", ", ".join(f"{k} {v}" for k, v in (versions or {}).items() if v))]
        source = data["summary"] if isinstance(data.get("summary"), dict) else \
            {k: v for k, v in data.items() if k not in ("versions", "cuda")}
        numbers = _table(_flat_numbers(source)[:60])
        if data.get("note"):
            meta.append(("note", data["note"]))
        sections.append(f"<section><h2>{html.escape(kind)}: {html.escape(os.path.basename(path))}</h2>"
                        f"{_table([m for m in meta if m[1]])}{img}<details><summary>numbers</summary>"
                        f"{numbers}</details></section>")
    page = ("<!doctype html><meta charset='utf-8'><title>framegraph benchmarks</title><style>"
            "body{font-family:sans-serif;max-width:1100px;margin:2em auto}td{padding:2px 8px;"
            "border-bottom:1px solid #ddd;font-size:13px}img{max-width:100%}</style>"
            "<h1>framegraph benchmarks</h1><p>Every figure comes from a recorded JSON file; device, versions "
            "and the exact command are shown with each.</p>" + "".join(sections))
    return page, figures


def run(args: argparse.Namespace) -> int:
    page, figures = build_report(args.inputs)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(page)
    png = os.path.splitext(args.out)[0] + ".png"
    if figures:
        plt = pyplot()
        imgs = []
        for fig in figures:
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
            buf.seek(0)
            imgs.append(plt.imread(buf))
            plt.close(fig)
        summary, axes = plt.subplots(len(imgs), 1, figsize=(12, 3.6 * len(imgs)))
        for ax, im in zip(axes if len(imgs) > 1 else [axes], imgs):
            ax.imshow(im)
            ax.axis("off")
        summary.savefig(png, dpi=80, bbox_inches="tight")
        plt.close(summary)
    print(f"wrote {args.out}" + (f" and {png}" if figures else ""))
    return 0
