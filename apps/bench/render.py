"""Neural-rendering speed per renderer and backend: 3DGS, 4DGS and NeRF — FPS, latency, peak memory.

    framegraph bench render --out benchmarks/results/cuda/render.json       # the full sweep on a GPU
    framegraph bench render --out benchmarks/results/cpu/render.json        # CPU defaults (small sizes)
    framegraph bench render --out out/render.json --quick                   # smoke test, not a measurement
    framegraph bench render --out out/r.json --sections 3dgs --gaussians 500000 --size 1280x720

Sections (``--sections``, default all three):

- ``3dgs``: random SH-degree-3 scenes of each ``--gaussians`` size (CUDA default 10⁵, 10⁶, 3·10⁶ at
  1920x1080; CPU default 10³, 10⁴, 3·10⁴ at 192x108), or one ``--scene`` file. A frame is a whole
  :func:`rasterize` call (projection, SH, tile sort, blending) for ``--cameras`` cameras.
- ``4dgs``: the shipped ``assets/scenes4d/bouncing_ball.pth`` (or ``--scene4d``), plus random 4D scenes
  of each ``--gaussians4d`` size (CUDA default 10⁵; CPU none), at 1352x1014 on CUDA (135x101 on CPU).
  Scene time advances 1/60 of the scene's duration per frame (looping), as in playback.
- ``nerf``: the shipped ``assets/nerf/spheres`` (or ``--nerf``) at 800x800 on CUDA (80x80 on CPU); a
  frame is :meth:`NerfModel.render` (ray generation, marching with occupancy skipping and early
  termination, compositing).

Per case and backend (``--backends``, the torch reference and Triton): median, p90, min and max ms per
frame and FPS, after ``--warmup`` untimed frames; PSNR against the torch reference's image (same camera
and time); peak memory of one render (see ``memory_method`` in the JSON). GPU timings use CUDA events
around each frame (no I/O in the timed region: images stay on the device); CPU timings ``time.perf_counter`` with
one torch thread unless ``--threads`` (``torch_threads`` in the JSON). When
``gsplat`` is importable on CUDA, ``gsplat.rasterization`` renders the same 3DGS inputs in the same run:
its own entry, plus ``ms_ratio_vs_gsplat`` (ours / gsplat: below 1 is faster) and ``psnr_vs_gsplat_db``
in ours.

On a CPU-only machine Triton runs through its interpreter: those timings say nothing about speed, are
flagged ``"interpreted": true``, are rendered ``--interpreted-iters`` times only (default once, which also
gives the PSNR), and carry no speed-up. Interpreted Triton NeRF takes minutes per frame, so on CPU it is
skipped unless ``--interpreted-nerf``.

A scene that would not fit in the device's free memory is refused before anything is allocated (the
renderers' ``check_fits`` estimates; ``--available-mib`` overrides the free memory for planning): the
case records ``"refused"`` with the numbers and the run goes on.

JSON: benchmark metadata (device, versions, command, commit, load), ``cases`` (one per section and size,
each with ``results`` keyed by backend), and — for readers of the first version of this file — the first
3DGS case's ``scene``, ``resolution``, ``cameras`` and ``results`` at the top level. PNG beside it: FPS per
case and backend, and the torch reference's frame of each case.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import statistics
import threading
import time

import torch

from ..argtypes import size

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "assets")
DEFAULT_SCENE4D = os.path.join(ASSETS, "scenes4d", "bouncing_ball.pth")
DEFAULT_NERF = os.path.join(ASSETS, "nerf", "spheres")
SECTIONS = ("3dgs", "4dgs", "nerf")
BACKENDS = ("torch", "triton")
FRAMES_PER_LOOP = 60  # 4DGS: scene time advances duration / 60 per frame
MiB = 2 ** 20

# (cuda, cpu, quick) defaults per section
DEFAULTS = {
    "gaussians": ([100_000, 1_000_000, 3_000_000], [1_000, 10_000, 30_000], [150]),
    "size": ((1920, 1080), (192, 108), (64, 48)),
    "gaussians4d": ([100_000], [], []),
    "size_4d": ((1352, 1014), (135, 101), (32, 24)),
    "size_nerf": ((800, 800), (80, 80), (16, 16)),
    "iters": (20, 10, 1),
    "warmup": (3, 1, 0),
}


def _counts(text: str) -> list:
    """``"100000,1e6,3e6"`` -> ``[100000, 1000000, 3000000]``; ``""`` or ``"none"`` -> ``[]``."""
    if text.strip().lower() in ("", "none"):
        return []
    out = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated counts, e.g. 100000,1e6, got {text!r}") from None
        if v < 1 or v != int(v):
            raise argparse.ArgumentTypeError(f"counts must be positive integers, got {part!r}")
        out.append(int(v))
    return out


def _names(choices):
    def parse(text: str) -> list:
        names = [s.strip().lower() for s in text.split(",") if s.strip()]
        bad = sorted(set(names) - set(choices))
        if bad or not names:
            raise argparse.ArgumentTypeError(f"unknown {bad or text!r}; choose from {', '.join(choices)}")
        return list(dict.fromkeys(names))
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="JSON file to write (a PNG of the results is written beside it)")
    p.add_argument("--sections", type=_names(SECTIONS), default=list(SECTIONS),
                   help="comma-separated: 3dgs, 4dgs, nerf (default all)")
    g = p.add_argument_group("3dgs")
    g.add_argument("--scene", help="INRIA .ply or .splat scene (default: random scenes of --gaussians sizes)")
    g.add_argument("--gaussians", type=_counts, default=None,
                   help="random scene sizes, comma-separated (default 100000,1000000,3000000 on CUDA, "
                        "1000,10000,30000 on CPU)")
    g.add_argument("--sh-degree", type=int, default=3, choices=(0, 1, 2, 3), help="random scene SH degree")
    g.add_argument("--size", type=size, default=None, help="WIDTHxHEIGHT (default 1920x1080 on CUDA, 192x108 on CPU)")
    g.add_argument("--cameras", type=int, default=1, help="cameras rendered per call (batched)")
    g.add_argument("--tile-size", type=int, default=16)
    g.add_argument("--no-gsplat", action="store_true", help="don't run gsplat even when it is installed")
    g = p.add_argument_group("4dgs")
    g.add_argument("--scene4d", default=None,
                   help="fudan-zvg 4DGS checkpoint (default assets/scenes4d/bouncing_ball.pth; 'none' for "
                        "random scenes only)")
    g.add_argument("--gaussians4d", type=_counts, default=None,
                   help="random 4D scene sizes as well (SH 3, temporal degree 1), comma-separated "
                        "(default 100000 on CUDA, none on CPU)")
    g.add_argument("--size-4d", type=size, default=None,
                   help="WIDTHxHEIGHT (default 1352x1014 on CUDA, 135x101 on CPU)")
    g = p.add_argument_group("nerf")
    g.add_argument("--nerf", default=DEFAULT_NERF, help="NeRF directory (default assets/nerf/spheres)")
    g.add_argument("--size-nerf", type=size, default=None, help="WIDTHxHEIGHT (default 800x800 on CUDA, 80x80 on CPU)")
    g.add_argument("--chunk-rays", type=int, default=1 << 14, help="rays marched together (default 16384)")
    g.add_argument("--interpreted-nerf", action="store_true",
                   help="on CPU, run the Triton NeRF through the interpreter too (minutes per frame)")
    g = p.add_argument_group("timing")
    g.add_argument("--backends", type=_names(BACKENDS), default=list(BACKENDS), help="comma-separated: torch, triton")
    g.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    g.add_argument("--warmup", type=int, default=None, help="untimed frames first (default 3 on CUDA, 1 on CPU)")
    g.add_argument("--iters", type=int, default=None, help="timed frames (default 20 on CUDA, 10 on CPU)")
    g.add_argument("--interpreted-iters", type=int, default=1,
                   help="frames rendered by interpreted Triton on CPU (default 1: the PSNR frame, timed once)")
    g.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default 1 when rendering on CPU: on a shared 2-core machine two "
                        "OpenMP threads measured up to 10x slower; torch's choice on CUDA)")
    g.add_argument("--available-mib", type=float, default=None,
                   help="memory to treat as free when checking that a scene fits (default: ask the device)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny run (a smoke test, not a measurement)")


# ----------------------------------------------------------------------------------------------------
# timing and memory
# ----------------------------------------------------------------------------------------------------
def _time_frames(render, device, first: int, warmup: int, iters: int) -> list:
    """ms per call of ``render(frame_index)`` for ``iters`` frames after ``warmup``; frame indices
    continue from ``first``."""
    for i in range(warmup):
        render(first + i)
    first += warmup
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for i in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            render(first + i)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for i in range(iters):
            t0 = time.perf_counter()
            render(first + i)
            times.append((time.perf_counter() - t0) * 1000)
    return times


def _stats(times: list, frames_per_call: int) -> dict:
    ms = statistics.median(times)
    p90 = statistics.quantiles(times, n=10, method="inclusive")[-1] if len(times) > 1 else times[0]
    return {"ms_per_frame_median": ms, "ms_per_frame_p90": p90, "ms_per_frame_min": min(times),
            "ms_per_frame_max": max(times), "fps": 1000.0 * frames_per_call / ms}


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class MemoryProbe:
    """Peak memory of one call: ``{"peak_memory_mib", "render_memory_mib"}`` (``method`` says how).

    - CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` (everything torch
      allocated on the device, scene included); render memory = that peak minus what was allocated
      before the call.
    - CPU (Linux): the process's peak RSS (``VmHWM``) during the call, after resetting it through
      ``/proc/self/clear_refs`` and returning freed heap pages with ``malloc_trim``; render memory =
      that peak minus the RSS before the call.
    - CPU elsewhere: RSS sampled by ``psutil`` every millisecond in a thread (can miss short peaks).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._trim = None
        if device.type == "cuda":
            self.method = ("cuda: torch.cuda.max_memory_allocated during one render after reset_peak_memory_stats "
                           "(peak_memory_mib: all torch allocations, scene included; render_memory_mib: peak minus "
                           "allocated before the render)")
            self.kind = "cuda"
            return
        try:
            self._trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            self._trim = None
        if _status_kib("VmHWM") is not None and self._reset_hwm():
            self.kind = "vmhwm"
            self.method = ("cpu: process peak RSS (Linux VmHWM, reset through /proc/self/clear_refs) during one "
                           "render, after gc + malloc_trim(0) (peak_memory_mib: whole-process RSS peak; "
                           "render_memory_mib: peak minus RSS before the render)")
        else:
            self.kind = "psutil"
            self.method = ("cpu: psutil RSS sampled every 1 ms in a thread during one render (peak_memory_mib: "
                           "whole-process RSS peak; render_memory_mib: peak minus RSS before; short peaks can be "
                           "missed)")

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def measure(self, fn) -> dict:
        gc.collect()
        if self.kind == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
            fn()
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            return {"peak_memory_mib": peak / MiB, "render_memory_mib": (peak - before) / MiB}
        if self._trim is not None:
            self._trim(0)
        if self.kind == "vmhwm":
            before = _status_kib("VmRSS") * 1024
            self._reset_hwm()
            fn()
            peak = _status_kib("VmHWM") * 1024
        else:
            import psutil

            proc = psutil.Process()
            before = peak = proc.memory_info().rss
            done = threading.Event()
            samples = [before]

            def sample():
                while not done.is_set():
                    samples.append(proc.memory_info().rss)
                    time.sleep(0.001)

            th = threading.Thread(target=sample, daemon=True)
            th.start()
            try:
                fn()
            finally:
                done.set()
                th.join()
            peak = max(samples + [proc.memory_info().rss])
        return {"peak_memory_mib": peak / MiB, "render_memory_mib": max(peak - before, 0) / MiB}


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = torch.mean((a.detach().double().cpu().clamp(0, 1) - b.detach().double().cpu().clamp(0, 1)) ** 2).item()
    return float("inf") if mse == 0 else 10 * math.log10(1.0 / mse)


def _json_number(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


# ----------------------------------------------------------------------------------------------------
# one case: every backend renders the same inputs
# ----------------------------------------------------------------------------------------------------
class _Bench:
    def __init__(self, args, device: torch.device):
        self.args, self.device = args, device
        col = 2 if args.quick else 1 if device.type == "cpu" else 0
        self.col = col
        self.iters = args.iters or DEFAULTS["iters"][col]
        self.warmup = args.warmup if args.warmup is not None else DEFAULTS["warmup"][col]
        self.memory = MemoryProbe(device)
        self.available = None if args.available_mib is None else int(args.available_mib * MiB)
        self.previews = []  # (case name, [H, W, 3] image)
        from framegraph.renderers.gaussians import triton_available

        self.triton_ok = triton_available(device)
        self.gsplat, self.gsplat_info = self._find_gsplat()

    def default(self, key, given):
        return given if given is not None else DEFAULTS[key][self.col]

    def _find_gsplat(self):
        if self.args.no_gsplat:
            return None, {"available": False, "reason": "--no-gsplat"}
        try:
            import gsplat
        except Exception as exc:  # not installed, or its CUDA extension fails to load
            return None, {"available": False, "reason": f"gsplat not importable ({type(exc).__name__}: {exc})"}
        if self.device.type != "cuda":
            return None, {"available": False, "reason": f"gsplat needs CUDA; rendering on {self.device}",
                          "version": getattr(gsplat, "__version__", None)}
        return gsplat, {"available": True, "version": getattr(gsplat, "__version__", None)}

    def run_case(self, case: dict, renders: dict, frames_per_call: int = 1) -> dict:
        """Time each backend of ``renders`` (``name -> (render(frame_index) -> image, skip_reason)``; a
        reason other than None records the backend as skipped) on the same inputs; images of frame 0
        are compared with the torch reference's (PSNR) and with gsplat's when it ran."""
        images = {}
        results = case.setdefault("results", {})
        for backend, (render, note) in renders.items():
            if note is not None:
                results[backend] = {"skipped": note}
                continue
            interpreted = backend == "triton" and self.device.type == "cpu"
            iters = max(1, self.args.interpreted_iters) if interpreted else self.iters
            warmup = 0 if interpreted else self.warmup
            # frame 0 (the PSNR frame) also warms up; for interpreted Triton it is the only render
            if interpreted:
                times = []

                def first(backend=backend, render=render):
                    t0 = time.perf_counter()
                    images[backend] = render(0)
                    times.append((time.perf_counter() - t0) * 1000)

                mem = self.memory.measure(first)
                if iters > 1:
                    times += _time_frames(render, self.device, 1, 0, iters - 1)
            else:
                images[backend] = render(0)
                times = _time_frames(render, self.device, 1, warmup, iters)
                mem = self.memory.measure(lambda: render(0))
            entry = _stats(times, frames_per_call)
            entry.update({"iters": len(times), "warmup": warmup, "interpreted": interpreted, **mem})
            results[backend] = entry

        ref = "torch" if "torch" in images else next(iter(images), None)
        for backend, entry in results.items():
            if backend not in images or "torch" not in images:
                continue
            speed = not entry["interpreted"] and not results["torch"].get("interpreted")
            entry["speedup_vs_torch"] = (results["torch"]["ms_per_frame_median"] / entry["ms_per_frame_median"]
                                         if speed else None)
            if backend != "torch":
                entry["psnr_vs_torch_db"] = _json_number(_psnr(images[backend], images["torch"]))
        if "gsplat" in images:
            g = results["gsplat"]
            for backend, entry in results.items():
                if backend == "gsplat" or backend not in images:
                    continue
                entry["ms_ratio_vs_gsplat"] = (entry["ms_per_frame_median"] / g["ms_per_frame_median"]
                                               if not entry["interpreted"] else None)
                entry["psnr_vs_gsplat_db"] = _json_number(_psnr(images[backend], images["gsplat"]))
        if ref is not None:
            img = images[ref]
            self.previews.append((case["name"], (img[0] if img.dim() == 4 else img)[..., :3].detach().cpu()))
        return case

    def backends_for(self, section: str) -> dict:
        """``backend -> None`` (run it) or the reason it is skipped."""
        out = {}
        for b in self.args.backends:
            reason = None
            if b == "triton" and not self.triton_ok:
                reason = f"triton cannot run on {self.device} here"
            elif b == "triton" and section == "nerf" and self.device.type == "cpu" and not self.args.interpreted_nerf:
                reason = ("not run on CPU by default: Triton's interpreter takes minutes per NeRF frame "
                          "(~3 min at 64x64); pass --interpreted-nerf to run it anyway")
            out[b] = reason
        return out

    def refused(self, case: dict, exc: Exception) -> dict:
        case["refused"] = str(exc)
        case["results"] = {}
        return case

    # ------------------------------------------------------------------------------------------ 3DGS
    def cases_3dgs(self) -> list:
        from framegraph.renderers.gaussians import SceneTooLargeError, check_fits, load_scene, random_scene

        args, device = self.args, self.device
        width, height = self.default("size", args.size)
        cases = []
        if args.scene:
            sizes = [None]
        else:
            sizes = self.default("gaussians", args.gaussians)
        for n in sizes:
            if n is None:
                name = f"3dgs {os.path.basename(args.scene)} {width}x{height}"
            else:
                name = f"3dgs {n:,} SH{args.sh_degree} {width}x{height}"
            case = {"section": "3dgs", "name": name, "resolution": [width, height], "cameras": args.cameras,
                    "tile_size": args.tile_size}
            try:
                if n is None:
                    scene = load_scene(args.scene, device=device)  # refuses a scene that does not fit
                    if self.available is not None:
                        check_fits(scene.n, device, scene.sh_degree, available=self.available, source=args.scene)
                    source = os.path.abspath(args.scene)
                else:
                    source = f"random(n={n}, sh_degree={args.sh_degree}, seed={args.seed})"
                    case["scene"] = {"source": source, "gaussians": n, "sh_degree": args.sh_degree}
                    need = check_fits(n, device, args.sh_degree, available=self.available, source=source)
                    case["estimated_mib"] = need / MiB
                    scene = random_scene(n, args.sh_degree, seed=args.seed, device=device)
            except SceneTooLargeError as exc:
                cases.append(self.refused(case, exc))
                continue
            case["scene"] = {"source": source, "gaussians": scene.n, "sh_degree": scene.sh_degree}
            cases.append(self._run_3dgs(case, scene, width, height))
            del scene
            self._free()
        return cases

    def _run_3dgs(self, case, scene, width, height):
        from framegraph.renderers.gaussians import rasterize
        from framegraph.renderers.stages import orbit_for_scene

        args, device = self.args, self.device
        path = orbit_for_scene(scene, max(args.cameras, 1), width, height, 30.0, elevation_deg=25, fov_deg=60)
        viewmats, Ks = path.viewmats.to(device), path.Ks.to(device)
        kw = scene.rasterize_args()
        isect = {}

        def ours(backend):
            def render(i):
                with torch.no_grad():
                    img, _, meta = rasterize(**kw, viewmats=viewmats, Ks=Ks, width=width, height=height,
                                             tile_size=args.tile_size, backend=backend, validate=False)
                if i == 0:
                    isect[backend] = int(meta["flatten_ids"].numel())
                return img
            return render

        renders = {b: (ours(b), note) for b, note in self.backends_for("3dgs").items()}
        if self.gsplat is not None:
            rasterization = self.gsplat.rasterization

            def render_gsplat(i):
                with torch.no_grad():
                    img, _, _ = rasterization(kw["means"], kw["quats"], kw["scales"], kw["opacities"], kw["colors"],
                                              viewmats, Ks, width, height, sh_degree=kw["sh_degree"],
                                              tile_size=args.tile_size)
                return img

            renders["gsplat"] = (render_gsplat, None)
        self.run_case(case, renders, frames_per_call=viewmats.shape[0])
        for b, n in isect.items():
            case["results"][b]["intersections"] = n
        if "gsplat" in case["results"]:
            case["results"]["gsplat"]["version"] = self.gsplat_info.get("version")
        return case

    # ------------------------------------------------------------------------------------------ 4DGS
    def cases_4dgs(self) -> list:
        from framegraph.renderers.gaussians import SceneTooLargeError
        from framegraph.renderers.gaussians4d import check_fits_4d, load_checkpoint, random_scene_4d

        args, device = self.args, self.device
        width, height = self.default("size_4d", args.size_4d)
        ckpt = args.scene4d if args.scene4d is not None else DEFAULT_SCENE4D
        todo = ([] if str(ckpt).lower() == "none" else [ckpt]) + self.default("gaussians4d", args.gaussians4d)
        cases = []
        for item in todo:
            random = isinstance(item, int)
            label = f"random {item:,}" if random else os.path.basename(str(item))
            case = {"section": "4dgs", "name": f"4dgs {label} {width}x{height}", "resolution": [width, height],
                    "cameras": 1, "tile_size": args.tile_size}
            try:
                if random:
                    source = f"random_4d(n={item}, sh_degree=3, sh_degree_t=1, seed={args.seed})"
                    case["scene"] = {"source": source, "gaussians": item}
                    need = check_fits_4d(item, device, 32, available=self.available, source=source)
                    case["estimated_mib"] = need / MiB
                    scene = random_scene_4d(item, 3, 1, seed=args.seed, device=device)
                else:
                    source = os.path.abspath(item)
                    scene = load_checkpoint(item, device="cpu")
                    case["scene"] = {"source": source, "gaussians": scene.n}
                    need = check_fits_4d(scene.n, device, scene.sh.shape[1], available=self.available, source=source)
                    case["estimated_mib"] = need / MiB
                    scene = scene.to(device)
            except SceneTooLargeError as exc:
                cases.append(self.refused(case, exc))
                continue
            t0, t1 = scene.time_duration
            step = (t1 - t0) / FRAMES_PER_LOOP
            case["scene"] = {"source": source, "gaussians": scene.n, "sh_degree": scene.sh_degree,
                             "sh_degree_t": scene.sh_degree_t, "time_duration": [t0, t1]}
            case["time"] = {"psnr_frame_t": t0, "step_per_frame": step, "frames_per_loop": FRAMES_PER_LOOP}
            cases.append(self._run_4dgs(case, scene, width, height, step))
            del scene
            self._free()
        return cases

    def _run_4dgs(self, case, scene, width, height, step):
        from framegraph.renderers.gaussians4d import rasterize_4d
        from framegraph.renderers.stages import orbit_for_scene

        args, device = self.args, self.device
        path = orbit_for_scene(scene, 1, width, height, 30.0)
        viewmats, Ks = path.viewmats.to(device), path.Ks.to(device)
        kw = scene.rasterize_args()
        t0 = scene.time_duration[0]
        kept = {}

        def ours(backend):
            def render(i):
                t = t0 + (i % FRAMES_PER_LOOP) * step
                with torch.no_grad():
                    img, _, meta = rasterize_4d(**kw, t=t, viewmats=viewmats, Ks=Ks, width=width, height=height,
                                                tile_size=args.tile_size, backend=backend, validate=False)
                if i == 0:
                    kept[backend] = int(meta["ids"].numel())
                return img
            return render

        renders = {b: (ours(b), note) for b, note in self.backends_for("4dgs").items()}
        self.run_case(case, renders)
        for b, n in kept.items():
            case["results"][b]["kept_gaussians_at_psnr_frame"] = n
        return case

    # ------------------------------------------------------------------------------------------ NeRF
    def cases_nerf(self) -> list:
        from framegraph.renderers.gaussians import SceneTooLargeError
        from framegraph.renderers.gaussians.scene import available_bytes
        from framegraph.renderers.nerf import load_nerf

        args, device = self.args, self.device
        width, height = self.default("size_nerf", args.size_nerf)
        case = {"section": "nerf", "name": f"nerf {os.path.basename(os.path.normpath(args.nerf))} {width}x{height}",
                "resolution": [width, height], "cameras": 1, "chunk_rays": args.chunk_rays}
        model = load_nerf(args.nerf, device="cpu")
        c = model.config
        case["scene"] = {"source": os.path.abspath(args.nerf), "aabb": list(c.aabb), "step_size": c.step_size,
                         "grid": c.grid.to_dict(), "hidden": c.hidden,
                         "occupancy_resolution": c.occupancy_resolution}
        need = nerf_bytes(model, width, height, args.chunk_rays)
        free = available_bytes(device) if self.available is None else self.available
        case["estimated_mib"] = need / MiB
        if need > free:
            exc = SceneTooLargeError(
                f"{args.nerf}: rendering {width}x{height} in chunks of {args.chunk_rays} rays needs up to "
                f"{need / MiB:,.1f} MiB on {device} (weights + a fully evaluated marching chunk), but only "
                f"{free / MiB:,.1f} MiB is free; lower --chunk-rays")
            return [self.refused(case, exc)]
        model = model.to(device).eval()
        from framegraph.renderers.nerf.stage import orbit_for_nerf

        path = orbit_for_nerf(model, 1, width, height, 30.0)
        viewmat, K = path.viewmats[0].to(device), path.Ks[0].to(device)

        def ours(backend):
            def render(i):
                with torch.no_grad():
                    return model.render(viewmat, K, width, height, backend=backend, chunk_rays=args.chunk_rays)
            return render

        renders = {b: (ours(b), note) for b, note in self.backends_for("nerf").items()}
        self.run_case(case, renders)
        model = None  # noqa: F841 (drop the weights before the next case)
        self._free()
        return [case]

    def _free(self):
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def nerf_bytes(model, width: int, height: int, chunk_rays: int, chunk_steps: int = 64) -> int:
    """Upper bound of the memory a NeRF render needs: weights + occupancy + the image, and one marching
    chunk (``min(chunk_rays, pixels) x chunk_steps`` samples) with every sample evaluated by the field."""
    c = model.config
    weights = sum(t.numel() * t.element_size() for t in model.tensors().values())
    rays = min(chunk_rays, width * height)
    dense = 12 * 4  # per candidate sample: t, valid, points, tau, colours, transmittance
    field = 2 * 4 * (6 + c.grid.n_levels * c.grid.n_features + 3 * c.hidden + c.n_geo_features + 1 + 16 + 3)
    image = width * height * (3 + 3 + 1) * 4 * 2  # rays (origins, dirs), colour, opacity, depth
    return int(weights + image + rays * chunk_steps * (dense + field))


# ----------------------------------------------------------------------------------------------------
# output
# ----------------------------------------------------------------------------------------------------
def figure(data: dict, plt, previews=None):
    """FPS per case and backend (log scale; interpreted Triton hatched and labelled as not a speed), and
    the torch reference's frame of each case when ``previews`` (``[(name, image)]``) are given. Usable
    by ``bench report`` on a saved JSON (without previews)."""
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


def _save_png(data: dict, previews, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        return False
    fig = figure(data, plt, previews)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


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
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    if "triton" in args.backends and device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
    for name in ("cameras", "iters", "interpreted_iters", "chunk_rays", "tile_size", "threads"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if args.warmup is not None and args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")

    threads = args.threads or (1 if device.type == "cpu" else None)
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run(args, device)
    finally:
        torch.set_num_threads(previous)


def _run(args: argparse.Namespace, device: torch.device) -> int:
    from .meta import bench_metadata

    bench = _Bench(args, device)
    result = bench_metadata("render")
    result.update({
        "render_device": str(device), "timing": "cuda events" if device.type == "cuda" else "perf_counter",
        "torch_threads": torch.get_num_threads(), "warmup": bench.warmup, "iters": bench.iters, "sections": list(args.sections),
        "memory_method": bench.memory.method, "gsplat": bench.gsplat_info, "quick": bool(args.quick),
        "cases": [],
    })
    for section in args.sections:
        result["cases"] += getattr(bench, f"cases_{section}")()

    # the first version of this file had one 3DGS case at the top level: keep those fields
    first = next((c for c in result["cases"] if c["section"] == "3dgs" and not c.get("refused")), None)
    first = first or next((c for c in result["cases"] if not c.get("refused")), None)
    if first is not None:
        for key in ("scene", "resolution", "cameras", "tile_size", "results"):
            if key in first:
                result[key] = first[key]

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    png = os.path.splitext(args.out)[0] + ".png"
    if not _save_png(result, bench.previews, png):
        png = None
    _print(result)
    print(f"wrote {args.out}" + (f" and {png}" if png else ""))
    return 0
