"""Collects benchmark JSON files into one HTML page (plots embedded) and a summary PNG.

    framegraph bench report --inputs benchmarks/results --out out/report.html

Each JSON is recognised by its content: the runtime bench (``hop_overhead``), the kernel bench
(``results`` with ``op``), the render bench (``results`` keyed by backend), the avatar bench (``benchmark``
``"avatar"`` with per-size rows), the client (``glass to glass`` summaries) — and anything else is shown
as a table of its numbers. Nothing is re-measured: the page shows
what the files say, with their device, versions and commands.
"""
from __future__ import annotations

import argparse
import base64
import glob
import html
import io
import json
import os


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
    if "hop_overhead" in data:
        return "runtime"
    if data.get("benchmark") == "avatar" and isinstance(data.get("sizes"), list):
        return "avatar"
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


def _plot_runtime(data: dict, plt):
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    h = data["hop_overhead"]["hop_latency_us"]
    axes[0].bar(["p50", "p95", "p99"], [h["p50"], h["p95"], h["p99"]], color="#4477aa")
    axes[0].set_title("hand-off latency per hop (µs)")
    o = data["overload"]
    axes[1].bar(["p50", "p95", "p99"], [o["end_to_end_ms"][k] for k in ("p50_ms", "p95_ms", "p99_ms")],
                color="#ee6677")
    axes[1].axhline(o["bound_ms"], color="k", ls="--", label=f"bound {o['bound_ms']:.0f} ms")
    axes[1].legend()
    axes[1].set_title("end-to-end latency, 2× overload (ms)")
    xs, ys = zip(*data["memory"]["rss_mib_samples"])
    axes[2].plot(xs, ys, marker=".")
    axes[2].ticklabel_format(useOffset=False)
    axes[2].set_title("RSS (MiB) over frames")
    return fig


def _plot_kernels(data: dict, plt):
    rows = [r for r in data["results"] if r.get("speedup_vs_peer")]
    labels, values = [], []
    for r in rows:
        for peer, ratio in r["speedup_vs_peer"].items():
            if ratio:
                labels.append(f"{r['op']} ({r.get('pass', 'fwd')}) vs {peer}")
                values.append(ratio)
    fig, ax = plt.subplots(figsize=(10, 0.35 * max(len(labels), 3) + 1))
    ax.barh(range(len(values)), values, color=["#228833" if v >= 1 else "#cc3311" for v in values])
    ax.set_yticks(range(len(values)), labels, fontsize=8)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("speed-up over the peer (×, log scale)")
    ax.set_title("kernels")
    return fig


def _plot_render(data: dict, plt):
    if "cases" in data:  # 3DGS / 4DGS / NeRF sections
        from .render import figure

        return figure(data, plt)
    res = {k: v for k, v in data["results"].items() if v.get("fps") is not None}  # skipped backends have none
    names = list(res)
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(names, [res[n]["fps"] for n in names], color="#66ccee")
    ax.set_ylabel("frames per second")
    scene = data.get("scene", {})
    ax.set_title(f"render: {scene.get('gaussians', '?')} Gaussians at {data.get('resolution')}")
    return fig


def _plot_avatar(data: dict, plt):
    from .avatar import figure

    return figure(data, plt)


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
    """HTML of the report and the matplotlib figures it holds (for the summary PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections, figures = [], []
    for path, data in _load(inputs):
        kind = kind_of(data)
        plotter = {"runtime": _plot_runtime, "kernels": _plot_kernels, "render": _plot_render,
                   "avatar": _plot_avatar}.get(kind)
        img = ""
        if plotter is not None:
            fig = plotter(data, plt)
            figures.append(fig)
            img = f'<img src="data:image/png;base64,{_png(fig)}">'
        versions = data.get("versions") or {k: data.get(k) for k in ("torch", "triton") if data.get(k)}
        meta = [("device", data.get("device")), ("command", data.get("command")),
                ("git commit", data.get("git_commit")), ("date", data.get("date")),
                ("versions", ", ".join(f"{k} {v}" for k, v in (versions or {}).items() if v))]
        source = data["summary"] if kind == "avatar" and isinstance(data.get("summary"), dict) else \
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--inputs", nargs="+", default=["benchmarks/results"],
                   help="JSON files or folders (searched recursively); default benchmarks/results")
    p.add_argument("--out", required=True, help="HTML file to write (a summary PNG is written beside it)")


def run(args: argparse.Namespace) -> int:
    page, figures = build_report(args.inputs)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(page)
    png = os.path.splitext(args.out)[0] + ".png"
    if figures:
        import matplotlib.pyplot as plt

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
