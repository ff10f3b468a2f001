"""The cases of ``framegraph bench render``, per section and size.

The sections are 3DGS, 4DGS and NeRF. Every backend renders the same inputs. Per backend a case records times,
peak memory, and PSNR against the torch reference and gsplat."""
from __future__ import annotations

import gc
import math
import os
import time

import numpy as np
import torch

from framegraph.kernels.backend import triton_available
from framegraph.renderers import gaussians, gaussians4d
from framegraph.renderers.gaussians import SceneTooLargeError, check_fits, rasterize
from framegraph.renderers.gaussians.scene import available_bytes
from framegraph.renderers.gaussians4d import check_fits_4d, rasterize_4d
from framegraph.renderers.nerf.stage import orbit_for_nerf
from framegraph.renderers.scene_file import open_scene
from framegraph.renderers.stages import orbit_for_scene
from framegraph.stream.quality import psnr

from ..commands.bench.render import DEFAULT_SCENE4D, Section
from .measure import MemoryProbe, MiB, summary_ms, time_ms
from .profile import profile_ops
from .timing import do_bench

FRAMES_PER_LOOP = 60  # 4DGS: scene time advances duration / 60 per frame

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


def _stats(times: list, frames_per_call: int) -> dict:
    """ms per frame (median, p90, min, max) and FPS of ``times``.

    ``times`` are ms per call of ``frames_per_call`` frames."""
    ms = summary_ms(times)
    return {"ms_per_frame_median": ms["p50_ms"], "ms_per_frame_p90": float(np.percentile(times, 90)),
            "ms_per_frame_min": min(times), "ms_per_frame_max": ms["max_ms"],
            "fps": 1000.0 * frames_per_call / ms["p50_ms"]}


def _print_profile(p: dict) -> None:
    busy = "" if p["device_busy_share"] is None else f", device busy {100 * p['device_busy_share']:.0f} %"
    print(f"  profile: {p['wall_ms']:.2f} ms a frame{busy}; most time in:", flush=True)
    for row in p["top"][:4]:
        print(f"    {100 * row['share']:4.0f} %  {row['name'][:90]}", flush=True)


def _json_number(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


class Cases:
    """The cases of one run.

    ``cases_3dgs`` / ``cases_4dgs`` / ``cases_nerf`` each return a list of case dicts. A case has ``results``
    keyed by backend, or ``refused``. ``previews`` collects the torch reference's frame per case."""

    def __init__(self, args, device: torch.device):
        self.args, self.device = args, device
        col = 2 if args.quick else 1 if device.type == "cpu" else 0
        self.col = col
        self.iters = args.iters or DEFAULTS["iters"][col]
        self.warmup = args.warmup if args.warmup is not None else DEFAULTS["warmup"][col]
        self.memory = MemoryProbe(device)
        self.available = None if args.available_mib is None else int(args.available_mib * MiB)
        self.previews = []  # (case name, [H, W, 3] image)

        self.triton_ok = triton_available(device)
        self.gsplat, self.gsplat_info = self._find_gsplat()

    def default(self, key, given):
        return given if given is not None else DEFAULTS[key][self.col]

    def _find_gsplat(self):
        if self.args.no_gsplat:
            return None, {"available": False, "reason": "--no-gsplat"}
        try:
            import gsplat  # optional: a peer measured when installed
        except Exception as exc:  # not installed, or its CUDA extension fails to load
            return None, {"available": False, "reason": f"gsplat not importable ({type(exc).__name__}: {exc})"}
        if self.device.type != "cuda":
            return None, {"available": False, "reason": f"gsplat needs CUDA; rendering on {self.device}",
                          "version": getattr(gsplat, "__version__", None)}
        return gsplat, {"available": True, "version": getattr(gsplat, "__version__", None)}

    def run_case(self, case: dict, renders: dict, frames_per_call: int = 1) -> dict:
        """Time each backend of ``renders`` on the same inputs.

        ``renders`` maps ``name -> (render(frame_index) -> image, skip_reason)``. A reason other than None
        records the backend as skipped. Images of frame 0 are compared with the torch reference's, by PSNR. They
        are also compared with gsplat's when it ran."""
        images = {}
        results = case.setdefault("results", {})
        for backend, (render, note) in renders.items():
            if note is not None:
                results[backend] = {"skipped": note}
                continue
            interpreted = backend == "triton" and self.device.type == "cpu"
            print(f"{case['name']}: {backend} ...", flush=True)  # progress: a slow backend shows where the time goes
            started = time.perf_counter()
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
                    times += time_ms(render, self.device, iters - 1, first=1)
            else:
                images[backend] = render(0)
                timing = self._bench(render, warmup)
                times = timing.pop("times_ms")
                mem = self.memory.measure(lambda: render(0))
            entry = _stats(times, frames_per_call)
            entry.update({"iters": len(times), "warmup": warmup, "interpreted": interpreted, **mem})
            if not interpreted:
                entry["timing"] = timing
                if getattr(self.args, "profile", False):
                    entry["profile"] = profile_ops(lambda: render(0), self.device)
            results[backend] = entry
            print(f"{case['name']}: {backend} {entry['ms_per_frame_median']:.2f} ms/frame "
                  f"({time.perf_counter() - started:.1f} s with warm-up)", flush=True)
            if "profile" in entry:
                _print_profile(entry["profile"])

        ref = "torch" if "torch" in images else next(iter(images), None)
        for backend, entry in results.items():
            if backend not in images or "torch" not in images:
                continue
            speed = not entry["interpreted"] and not results["torch"].get("interpreted")
            entry["speedup_vs_torch"] = (results["torch"]["ms_per_frame_median"] / entry["ms_per_frame_median"]
                                         if speed else None)
            if backend != "torch":
                entry["psnr_vs_torch_db"] = _json_number(psnr(images[backend], images["torch"]))
        if "gsplat" in images:
            g = results["gsplat"]
            for backend, entry in results.items():
                if backend == "gsplat" or backend not in images:
                    continue
                entry["ms_ratio_vs_gsplat"] = (entry["ms_per_frame_median"] / g["ms_per_frame_median"]
                                               if not entry["interpreted"] else None)
                entry["psnr_vs_gsplat_db"] = _json_number(psnr(images[backend], images["gsplat"]))
        if ref is not None:
            img = images[ref]
            self.previews.append((case["name"], (img[0] if img.dim() == 4 else img)[..., :3].detach().cpu()))
        return case

    def _bench(self, render, warmup: int) -> dict:
        """:func:`~.timing.do_bench` of successive frames after ``warmup`` untimed ones.

        Frame ``i`` advances the 4DGS scene's time. It makes at least ``iters`` repetitions on a CPU, or
        ``--rep-ms`` of them on CUDA."""
        frame = iter(range(1, 1 << 30))
        for _ in range(warmup):
            render(next(frame))
        cuda = self.device.type == "cuda"
        return do_bench(lambda: render(next(frame)), self.device, warmup_ms=self.args.warmup_ms if cuda else 0.0,
                        rep_ms=self.args.rep_ms if cuda else 0.0, min_reps=self.iters, keep_times=True)

    def backends_for(self, section: Section) -> dict:
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

    def per_backend(self, section: str, draw, count) -> tuple[dict, dict]:
        """One render function per backend of ``section``, for :meth:`run_case`.

        ``draw(backend, i)`` gives ``(image, meta)`` of frame ``i``, run under ``no_grad``. ``count(meta)`` of
        frame 0 is kept per backend, in the second dict returned."""
        counts = {}

        def for_backend(backend):
            def render(i):
                with torch.no_grad():
                    img, meta = draw(backend, i)
                if i == 0:
                    counts[backend] = count(meta)
                return img
            return render

        return {b: (for_backend(b), note) for b, note in self.backends_for(section).items()}, counts

    @staticmethod
    def open(path, kind: str, flag: str):
        """The scene at ``path``, opened on the CPU by :func:`~framegraph.renderers.scene_file.open_scene`.

        It is refused unless it is a ``kind`` scene."""
        scene = open_scene(path)
        if scene.kind != kind:
            raise ValueError(f"{flag} {path}: that is a {scene.kind} scene; {flag} takes a {kind} one")
        return scene.data

    def refused(self, case: dict, exc: Exception) -> dict:
        case["refused"] = str(exc)
        case["results"] = {}
        return case

    # ------------------------------------------------------------------------------------------ 3DGS
    def cases_3dgs(self, sizes: list | None = None) -> list:
        args, device = self.args, self.device
        width, height = self.default("size", args.size)
        cases = []
        if sizes is None:
            sizes = [None] if args.scene else self.default("gaussians", args.gaussians)
        for n in sizes:
            if n is None:
                name = f"3dgs {os.path.basename(args.scene)} {width}x{height}"
            else:
                name = f"3dgs {n:,} SH{args.sh_degree} {width}x{height}"
            case = {"section": "3dgs", "name": name, "resolution": [width, height], "cameras": args.cameras,
                    "tile_size": args.tile_size}
            try:
                if n is None:
                    scene = self.open(args.scene, "3dgs", "--scene")
                    check_fits(scene.n, device, scene.sh_degree, available=self.available, source=args.scene)
                    scene = scene.to(device)
                    source = os.path.abspath(args.scene)
                else:
                    source = f"random(n={n}, sh_degree={args.sh_degree}, seed={args.seed})"
                    case["scene"] = {"source": source, "gaussians": n, "sh_degree": args.sh_degree}
                    need = check_fits(n, device, args.sh_degree, available=self.available, source=source)
                    case["estimated_mib"] = need / MiB
                    scene = gaussians.random_scene(n, args.sh_degree, seed=args.seed, device=device)
            except SceneTooLargeError as exc:
                cases.append(self.refused(case, exc))
                continue
            case["scene"] = {"source": source, "gaussians": scene.n, "sh_degree": scene.sh_degree}
            cases.append(self._run_3dgs(case, scene, width, height))
            del scene
            self._free()
        return cases

    def _run_3dgs(self, case, scene, width, height):
        args, device = self.args, self.device
        path = orbit_for_scene(scene, max(args.cameras, 1), width, height, 30.0, elevation_deg=25, fov_deg=60)
        viewmats, Ks = path.viewmats.to(device), path.Ks.to(device)
        kw = scene.rasterize_args()

        def draw(backend, i):
            img, _, meta = rasterize(**kw, viewmats=viewmats, Ks=Ks, width=width, height=height,
                                     tile_size=args.tile_size, backend=backend, validate=False)
            return img, meta

        renders, isect = self.per_backend("3dgs", draw, lambda meta: int(meta["flatten_ids"].numel()))
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
    def cases_4dgs(self, todo: list | None = None) -> list:
        args, device = self.args, self.device
        width, height = self.default("size_4d", args.size_4d)
        ckpt = args.scene4d if args.scene4d is not None else DEFAULT_SCENE4D
        if todo is None:
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
                    scene = gaussians4d.random_scene_4d(item, 3, 1, seed=args.seed, device=device)
                else:
                    source = os.path.abspath(item)
                    scene = self.open(item, "4dgs", "--scene4d")
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
        args, device = self.args, self.device
        path = orbit_for_scene(scene, 1, width, height, 30.0)
        viewmats, Ks = path.viewmats.to(device), path.Ks.to(device)
        kw = scene.rasterize_args()
        t0 = scene.time_duration[0]

        def draw(backend, i):
            t = t0 + (i % FRAMES_PER_LOOP) * step
            img, _, meta = rasterize_4d(**kw, t=t, viewmats=viewmats, Ks=Ks, width=width, height=height,
                                        tile_size=args.tile_size, backend=backend, validate=False)
            return img, meta

        renders, kept = self.per_backend("4dgs", draw, lambda meta: int(meta["ids"].numel()))
        self.run_case(case, renders)
        for b, n in kept.items():
            case["results"][b]["kept_gaussians_at_psnr_frame"] = n
        return case

    # ------------------------------------------------------------------------------------------ NeRF
    def jobs(self) -> list[tuple[float, str, list | None]]:
        """Every case of the chosen sections as ``(estimated work, section, its items)``, the cheapest first.

        Work for 3DGS / 4DGS is Gaussians + pixels. A checkpoint counts as 10⁵ Gaussians. For NeRF it is 16
        samples a pixel. So the quick cases print before a slow one starts."""
        args, out = self.args, []
        if "3dgs" in args.sections:
            w, h = self.default("size", args.size)
            for n in ([None] if args.scene else self.default("gaussians", args.gaussians)):
                out.append(((n or 10**5) + w * h, "3dgs", [n]))
        if "4dgs" in args.sections:
            w, h = self.default("size_4d", args.size_4d)
            ckpt = args.scene4d if args.scene4d is not None else DEFAULT_SCENE4D
            items = ([] if str(ckpt).lower() == "none" else [ckpt]) + self.default("gaussians4d", args.gaussians4d)
            for item in items:
                out.append(((item if isinstance(item, int) else 10**5) + w * h, "4dgs", [item]))
        if "nerf" in args.sections:
            w, h = self.default("size_nerf", args.size_nerf)
            out.append((16.0 * w * h, "nerf", None))
        return sorted(out, key=lambda job: job[0])

    def cases_nerf(self, _items=None) -> list:
        args, device = self.args, self.device
        width, height = self.default("size_nerf", args.size_nerf)
        case = {"section": "nerf", "name": f"nerf {os.path.basename(os.path.normpath(args.nerf))} {width}x{height}",
                "resolution": [width, height], "cameras": 1, "chunk_rays": args.chunk_rays}
        model = self.open(args.nerf, "nerf", "--nerf")
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

        path = orbit_for_nerf(model, 1, width, height, 30.0)
        viewmat, K = path.viewmats[0].to(device), path.Ks[0].to(device)

        def draw(backend, i):
            return model.render(viewmat, K, width, height, backend=backend, chunk_rays=args.chunk_rays), None

        renders, _ = self.per_backend("nerf", draw, lambda meta: None)
        self.run_case(case, renders)
        model = None  # noqa: F841 (drop the weights before the next case)
        self._free()
        return [case]

    def _free(self):
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def nerf_bytes(model, width: int, height: int, chunk_rays: int, chunk_steps: int = 64) -> int:
    """Upper bound of the memory a NeRF render needs.

    That is weights + occupancy + the image, and one marching chunk. A chunk is
    ``min(chunk_rays, pixels) x chunk_steps`` samples, each evaluated by the field."""
    c = model.config
    weights = sum(t.numel() * t.element_size() for t in model.tensors().values())
    rays = min(chunk_rays, width * height)
    dense = 12 * 4  # per candidate sample: t, valid, points, tau, colours, transmittance
    field = 2 * 4 * (6 + c.grid.n_levels * c.grid.n_features + 3 * c.hidden + c.n_geo_features + 1 + 16 + 3)
    image = width * height * (3 + 3 + 1) * 4 * 2  # rays (origins, dirs), colour, opacity, depth
    return int(weights + image + rays * chunk_steps * (dense + field))


