"""Neural-rendering speed per renderer and backend: 3DGS, 4DGS and NeRF — FPS, latency, peak memory.

    framegraph bench render --out benchmarks/results/cuda/render.json       # the full sweep on a GPU
    framegraph bench render --out benchmarks/results/cpu/render.json        # CPU defaults (small sizes)
    framegraph bench render --out out/render.json --quick                   # smoke test, not a measurement
    framegraph bench render --out out/r.json --sections 3dgs --gaussians 500000 --size 1280x720

Sections are picked by ``--sections``. The default is all three:

- ``3dgs``: random SH-degree-3 scenes of each ``--gaussians`` size, or one ``--scene`` file. On CUDA the
  default sizes are 10⁵, 10⁶ and 3·10⁶ at 1920x1080. On a CPU they are 10³, 10⁴ and 3·10⁴ at 192x108. A
  frame is a whole :func:`rasterize` call for ``--cameras`` cameras. That is projection, SH, tile sort and
  blending.
- ``4dgs``: the shipped ``assets/scenes4d/bouncing_ball.pth``, or ``--scene4d``. Random 4D scenes of each
  ``--gaussians4d`` size come too. The CUDA default is 10⁵; the CPU has none. It renders at 1352x1014 on
  CUDA and 135x101 on a CPU. Scene time advances 1/60 of the scene's duration per frame, looping, as in
  playback.
- ``nerf``: the shipped ``assets/nerf/spheres``, or ``--nerf``. It renders at 800x800 on CUDA and 80x80 on a
  CPU. A frame is :meth:`NerfModel.render`. That is ray generation, marching and compositing. The march
  skips by occupancy and terminates early.

Per case and backend it records ms per frame and FPS. The ms are median, p90, min and max, after
``--warmup`` untimed frames. ``--backends`` lists the backends: the torch reference and Triton. It records PSNR
against the torch reference's image, for the same camera and time. It records the peak memory of one render;
see ``memory_method`` in the JSON.

GPU timings use CUDA events around each frame. No I/O is in the timed region: images stay on the device. CPU
timings use ``time.perf_counter`` with one torch thread, unless ``--threads``. That is ``torch_threads`` in the
JSON. When ``gsplat`` is importable on CUDA, ``gsplat.rasterization`` renders the same 3DGS inputs in the same
run. It gets its own entry. Ours gets ``ms_ratio_vs_gsplat`` and ``psnr_vs_gsplat_db``. A ratio below 1 means
ours is faster.

On a CPU-only machine Triton runs through its interpreter. Those timings say nothing about speed. They are
flagged ``"interpreted": true`` and carry no speed-up. They render ``--interpreted-iters`` times only. The
default is once, which also gives the PSNR. Interpreted Triton NeRF takes minutes per frame. So on a CPU it is
skipped unless ``--interpreted-nerf``.

A scene that would not fit in the device's free memory is refused before anything is allocated. The estimate
is the renderers' ``check_fits``. ``--available-mib`` overrides the free memory for planning. The case records
``"refused"`` with the numbers, and the run goes on.

The JSON holds benchmark metadata: device, versions, command, commit, load. It holds ``cases``, one per section
and size. Each case has ``results`` keyed by backend. For older readers, the first 3DGS case's ``scene``,
``resolution``, ``cameras`` and ``results`` are also at the top level. The PNG beside it shows FPS per case and
backend, and the torch reference's frame of each case.
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from framegraph.models.runtime import default_device

from .measure import torch_threads
from .meta import bench_metadata, write_result
from .render_cases import Cases
from .timing import CaseTimeout, measure_peaks, time_cap


def figure(data: dict, plt, previews=None):
    """FPS per case and backend on a log scale, and the torch reference's frame of each case.

    Interpreted Triton is hatched and labelled as not a speed. The frames are drawn when ``previews``,
    ``[(name, image)]``, are given. ``bench report`` can use it on a saved JSON, without previews."""
    cases = data.get("cases") or [{"name": "render", "results": data.get("results", {})}]
    colours = {"torch": "#4477aa", "triton": "#228833", "gsplat": "#ee6677"}
    labels, values, cols, hatches, notes = [], [], [], [], []
    for case in cases:
        if case.get("refused"):
            labels.append(f"{case['name']}")
            values.append(0.0)
            cols.append("#bbbbbb")
            hatches.append("")
            notes.append("refused: does not fit")
            continue
        for backend, entry in case.get("results", {}).items():
            labels.append(f"{case['name']} · {backend}")
            if "fps" not in entry:
                values.append(0.0)
                cols.append("#bbbbbb")
                hatches.append("")
                notes.append("skipped")
                continue
            values.append(entry["fps"])
            cols.append(colours.get(backend, "#aa3377"))
            hatches.append("//" if entry.get("interpreted") else "")
            note = f"{entry['fps']:.3g} FPS"
            if entry.get("interpreted"):
                note += " (interpreted: not a speed)"
            if entry.get("ms_ratio_vs_gsplat"):
                note += f", {entry['ms_ratio_vs_gsplat']:.2f}x gsplat's time"
            notes.append(note)
    previews = previews or []
    rows = 2 if previews else 1
    fig = plt.figure(figsize=(11, 0.32 * max(len(labels), 4) + 1.5 + (2.6 if previews else 0)))
    grid = fig.add_gridspec(rows, max(len(previews), 1), height_ratios=[0.32 * max(len(labels), 4) + 1, 2.2][:rows])
    ax = fig.add_subplot(grid[0, :])
    y = list(range(len(labels)))[::-1]
    positive = [v for v in values if v > 0]
    floor = min(positive) / 3 if positive else 0.1
    bars = ax.barh(y, [v if v > 0 else floor for v in values], color=cols)
    for bar, h, v in zip(bars, hatches, values):
        bar.set_hatch(h)
        if v <= 0:
            bar.set_alpha(0.3)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xscale("log")
    for yi, v, note in zip(y, values, notes):
        ax.text(max(v, floor) * 1.05, yi, note, va="center", fontsize=7)
    ax.set_xlabel("frames per second (log scale)")
    dev = data.get("device", "?")
    ax.set_title(f"render speed on {dev} ({data.get('timing', '')}, median)", fontsize=10)
    if positive:
        ax.set_xlim(floor * 0.8, max(positive) * 30)
    for i, (name, img) in enumerate(previews):
        a = fig.add_subplot(grid[1, i])
        a.imshow(img.clamp(0, 1).numpy())
        a.set_title(name, fontsize=7)
        a.axis("off")
    fig.tight_layout()
    return fig


def _print_case(case: dict, seconds: float) -> None:
    """One line per backend of a case as soon as it is done."""
    if case.get("refused"):
        print(f"== {case['name']}: {case['refused']} ({seconds:.0f} s)", flush=True)
        return
    parts = [f"{b} {e['ms_per_frame_median']:.2f} ms" if "ms_per_frame_median" in e else f"{b} skipped"
             for b, e in case["results"].items()]
    print(f"== {case['name']} ({seconds:.0f} s): " + ", ".join(parts), flush=True)


def _print(result: dict) -> None:
    print(f"render bench on {result['render_device']} ({result['timing']}, {result['torch_threads']} torch "
          f"thread(s)); memory: {result['memory_method']}")
    for case in result["cases"]:
        print(f"{case['name']}:")
        if case.get("refused"):
            print(f"  refused: {case['refused']}")
            continue
        for backend, e in case["results"].items():
            if "skipped" in e:
                print(f"  {backend:7s} skipped: {e['skipped']}")
                continue
            extra = " (interpreted: not a speed measurement)" if e["interpreted"] else ""
            ratio = f", x{e['speedup_vs_torch']:.2f} vs torch" if e.get("speedup_vs_torch") else ""
            if e.get("ms_ratio_vs_gsplat"):
                ratio += f", {e['ms_ratio_vs_gsplat']:.2f}x gsplat's time"
            psnr = e.get("psnr_vs_torch_db")
            psnr = "" if psnr is None or backend == "torch" else f", PSNR {psnr:.1f} dB vs torch"
            print(f"  {backend:7s} {e['ms_per_frame_median']:9.2f} ms/frame (p90 {e['ms_per_frame_p90']:.2f})  "
                  f"{e['fps']:8.2f} FPS  peak {e['peak_memory_mib']:.0f} MiB (+{e['render_memory_mib']:.1f})"
                  f"{ratio}{psnr}{extra}")


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device or default_device())
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    if "triton" in args.backends and device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported (by a kernel's first call)
    for name in ("cameras", "iters", "interpreted_iters", "chunk_rays", "tile_size", "threads"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if args.warmup is not None and args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")

    with torch_threads(args.threads or (1 if device.type == "cpu" else None)):
        result, previews = _measure(args, device)
    png = write_result(result, args.out, lambda data, plt: figure(data, plt, previews))
    _print(result)
    print(f"wrote {args.out} and {png}")
    return 0


def _measure(args: argparse.Namespace, device: torch.device) -> tuple[dict, list]:
    """The result (metadata, settings, one entry per case) and the torch reference's frame of each case."""
    cases = Cases(args, device)
    result = bench_metadata("render")
    cap = args.case_cap if args.case_cap is not None else (120.0 if device.type == "cuda" else 600.0)
    result.update({
        "render_device": str(device), "torch_threads": torch.get_num_threads(), "warmup": cases.warmup,
        "timing": ("do_bench: CUDA events per frame after an L2 flush, ≥ --warmup-ms warm-up, ≥ --rep-ms of frames"
                   if device.type == "cuda" else "do_bench: perf_counter per frame"),
        "iters": cases.iters, "case_cap_s": cap, "order": "cheapest case first (Cases.jobs)",
        "sections": list(args.sections), "memory_method": cases.memory.method, "gsplat": cases.gsplat_info,
        "quick": bool(args.quick), "cases": [],
    })
    if not args.no_peaks and not args.quick:
        result["measured_peaks"] = measure_peaks(device)
        print(f"measured peaks: copy {result['measured_peaks']['copy_tb_s']:.3f} TB/s, matmul "
              f"{result['measured_peaks']['matmul_tflop_s']:.1f} TFLOP/s", flush=True)
    for _, section, items in cases.jobs():
        started = time.perf_counter()
        label = f"{section} {items[0] if items else ''}".strip()
        try:
            with time_cap(cap, label):
                done = getattr(cases, f"cases_{section}")(items)
        except CaseTimeout as exc:
            done = [{"section": section, "name": label, "results": {}, "refused": str(exc), "over_cap": True}]
        result["cases"] += done
        for case in done:
            _print_case(case, time.perf_counter() - started)

    # older readers read one 3DGS case at the top level: keep those fields
    first = next((c for c in result["cases"] if c["section"] == "3dgs" and not c.get("refused")), None)
    first = first or next((c for c in result["cases"] if not c.get("refused")), None)
    if first is not None:
        for key in ("scene", "resolution", "cameras", "tile_size", "results"):
            if key in first:
                result[key] = first[key]
    return result, cases.previews
