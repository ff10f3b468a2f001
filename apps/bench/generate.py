"""Real video models streamed end to end: FPS (denoise + decode + encode), time to first frame, stage p50/p99.

    framegraph bench generate --family wan --config 1.3b --size 480x832 --steps 4 \
        --out benchmarks/results/cuda/generate_wan.json
    framegraph bench generate --family sana --config 2b --size 480x832 --steps 4 \
        --out benchmarks/results/cuda/generate_sana.json
    framegraph bench generate --family wan --config tiny --size 64x96 \
        --out benchmarks/results/cpu/generate_wan_tiny.json
    framegraph bench generate --family wan --config tiny --vae wan2.1 --size 64x96 --runtime torch,onnx \
        --out benchmarks/results/cpu/generate_vae_onnx.json
    framegraph bench generate --family wan --config 1.3b --size 240x416 --vae wan2.1 --sessions 1,2,4,8 \
        --out benchmarks/results/cuda/generate_sessions_wan_1.3b.json

Random weights at the released configurations give the real speed, so no checkpoint is needed.

- ``1.3b`` is Wan 2.1 T2V 1.3B with the Wan 2.1 VAE. That is ``WanTransformer3DModel``: 30 layers, 12 heads
  of 128, FFN 8960.
- ``2b`` is SANA-Video 2B with the same ``AutoencoderKLWan``. That is
  ``SanaVideoTransformer3DModel``'s default configuration: 20 layers, 20 heads of 112.
- ``tiny`` is the test suite's tiny models, for CPU runs. It says nothing about a GPU.

The graph is the one ``framegraph generate`` runs, with an H.264 encoder at its end:

    NoiseSource → CausalDenoiser (len(timesteps) steps + 1 append pass per chunk) → CausalVAEDecode → H264Encoder → sink

It runs ``--chunks`` chunks on a fast clock. The first ``--warmup`` are excluded from the steady FPS. Recorded:

- end-to-end FPS over the steady chunks: encoded frames per second of wall time at the sink;
- time to first encoded frame from the graph's start;
- each stage's work p50/p99 per call, from the runtime's telemetry. Work is ``process()`` less its waits on
  full rings. The denoiser and decoder are per chunk, the encoder per frame.
- each stage's waits. ``output_wait_p50_ms`` is time blocked on a full downstream ring.
  ``input_wait_p50_ms`` is time waiting for input.
- peak memory: max allocated on CUDA, peak RSS on a CPU;
- the attention variant, the dtype and the exact command.

``--runtime torch,onnx`` runs the graph once per runtime of the VAE decoder. For ``onnx`` the decoder is
exported first with :mod:`framegraph.models.generate.onnx`, and ``export_s`` is recorded. Each run goes under
``backends``, with ``vae_decode_p50_ms`` and ``fps_end_to_end`` side by side. ``--vae`` picks the decoder.
``tiny`` is the test suite's. ``wan2.1`` is ``AutoencoderKLWan``'s default configuration, the Wan 2.1 VAE. It
gives the real decoder's cost, with whichever transformer ``--config`` names.

``--sessions 1,2,4`` runs that many graphs at once, from threads, each with its own seed and prompt, per
``--batching`` mode: ``on`` shares one model, its denoisers' chunks batched on the model service's lane
(:mod:`framegraph.models.generate.batch`); ``off`` gives each session its own model, as a server lends them.
Each row records every session's steady FPS, the slowest, their sum, each denoiser's p50 per chunk and the
lane's batches by size and measured cost per size.
"""
from __future__ import annotations

import argparse
import tempfile
import threading
import time

import torch
from diffusers import AutoencoderKLWan, SanaVideoTransformer3DModel, WanTransformer3DModel

from framegraph.models.generate import FAMILIES, GenerateModel, build_generate_graph, default_dtype, first_frame
from framegraph.models.generate.checkpoint import FPS, PROMPT_TOKENS, cast_keeping_fp32
from framegraph.models.generate.onnx import export_wan_vae
from framegraph.models.runtime import default_device
from framegraph.stream import PortSpec, Stage
from framegraph.stream.media import H264Encoder

from .measure import MemoryProbe, stage_times, torch_threads
from .meta import bench_metadata, write_result

CONFIGS = {
    ("wan", "1.3b"): dict(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960, num_layers=30,
                          text_dim=4096, freq_dim=256),
    ("wan", "tiny"): dict(num_attention_heads=2, attention_head_dim=16, ffn_dim=32, num_layers=2, text_dim=16,
                          freq_dim=32),
    ("sana", "2b"): {},  # the class defaults are SANA-Video 2B
    ("sana", "tiny"): dict(num_attention_heads=2, attention_head_dim=12, num_layers=2, num_cross_attention_heads=2,
                           cross_attention_head_dim=12, cross_attention_dim=24, caption_channels=16),
}
TINY_VAE = dict(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True])


class FrameTimes(Stage):
    """Sink: the wall time (``time.perf_counter``) each encoded frame arrives."""

    def __init__(self, spec: PortSpec):
        super().__init__("sink")
        self.inputs = {"h264": spec}
        self.times: list[float] = []

    def process(self, inputs, out):
        self.times.append(time.perf_counter())


def build_model(family: str, config: str, device: str, dtype: torch.dtype, vae: str | None = None):
    if (family, config) not in CONFIGS:
        raise ValueError(f"--config {config} is not a {family} configuration; choose from "
                         f"{[c for f, c in CONFIGS if f == family]}")
    torch.manual_seed(0)
    cls = WanTransformer3DModel if family == "wan" else SanaVideoTransformer3DModel
    transformer = cast_keeping_fp32(cls(**CONFIGS[family, config]), dtype).to(device).eval().requires_grad_(False)
    tiny_vae = vae == "tiny" or (vae is None and config == "tiny")
    vae = cast_keeping_fp32(AutoencoderKLWan(**(TINY_VAE if tiny_vae else {})), dtype)
    vae = vae.to(device).eval().requires_grad_(False)
    return GenerateModel(FAMILIES[family], transformer, vae, None, PROMPT_TOKENS[family], FPS[family],
                         f"random weights, {family} {config}")


def _schedule(args) -> tuple[list[float], dict]:
    """``--steps`` timesteps, 1000 down in equal steps, and the family's graph options."""
    timesteps = [1000.0 * (args.steps - i) / args.steps for i in range(args.steps)]
    return timesteps, ({"attention": args.attention} if args.family == "wan" else {})


def _timed_sink(gg, width: int, height: int) -> FrameTimes:
    """An H.264 encoder after the graph's decoder and a :class:`FrameTimes` after it: the run's end to end."""
    encoder = gg.graph.add(H264Encoder(width=width, height=height, fps=gg.fps, name="encode"))
    sink = gg.graph.add(FrameTimes(encoder.outputs["h264"]))
    gg.graph.connect(gg.decode, encoder, capacity=8)
    gg.graph.connect(encoder, sink, capacity=8)
    return sink


def _steady_fps(args, gg, times: list[float]) -> float | None:
    """Encoded frames a second after the ``--warmup`` chunks."""
    steady = times[first_frame(args.warmup, args.chunk_frames, gg.decode.vae.config.scale_factor_temporal):]
    return (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else None


def measure(args, backend: str = "torch") -> dict:
    """One run of the graph with the VAE decoder on ``backend``.

    For ``"onnx"`` the decoder is exported first, and the time is recorded as ``export_s``."""
    device = args.device or default_device(backend)
    dtype = default_dtype(device)
    gm = build_model(args.family, args.config, device, dtype, args.vae)
    height, width = args.size
    timesteps, options = _schedule(args)
    export_s, tmp = None, None
    if backend == "onnx":
        tmp = tempfile.TemporaryDirectory(prefix="framegraph-bench-vae-")
        t0 = time.perf_counter()
        export_wan_vae(gm.vae, tmp.name, size=(height, width), chunk_frames=args.chunk_frames)
        export_s = time.perf_counter() - t0
        options |= {"onnx_dir": tmp.name, "onnx_threads": args.threads}
    try:
        result = _measure(args, gm, device, dtype, timesteps, backend, options)
    finally:
        if tmp is not None:
            tmp.cleanup()
    return result | ({"export_s": export_s} if export_s is not None else {})


def _measure(args, gm, device, dtype, timesteps, backend, options) -> dict:
    height, width = args.size
    runtime = "compiled" if args.compile else "torch"  # the transformer's (and a torch VAE decoder's)
    gg = build_generate_graph(gm, size=(height, width), chunks=args.chunks, chunk_frames=args.chunk_frames,
                              timesteps=timesteps, device=device, denoiser_runtime=runtime,
                              vae_runtime=runtime if backend == "torch" else backend, **options)
    text_dim = gm.family.text_dim(gm.transformer)
    gg.denoiser.set_prompt_embeds(torch.randn(gm.prompt_tokens, text_dim, generator=torch.Generator().manual_seed(1)),
                                  name="random prompt")
    warm_s = gg.warm() if args.warm else None
    sink = _timed_sink(gg, width, height)
    report = {}

    def run():
        t0 = time.perf_counter()
        report.update(gg.graph.run())
        report["wall_s"] = time.perf_counter() - t0
        report["t0"] = t0

    with torch_threads(args.threads):
        memory = MemoryProbe(torch.device(device)).measure(run)
    times = sink.times
    fps = _steady_fps(args, gg, times)
    stages = stage_times(report)
    return {
        "family": args.family, "config": args.config, "size_hw": [height, width], "steps": args.steps,
        "timesteps": timesteps, "model_timesteps": gg.denoiser.timesteps,
        "attention": args.attention if args.family == "wan" else "block-linear",
        "vae_backend": backend, "vae": args.vae or ("tiny" if args.config == "tiny" else "wan2.1"),
        "vae_parameters_m": round(sum(p.numel() for p in gm.vae.decoder.parameters()) / 1e6, 2),
        "chunk_frames": args.chunk_frames, "chunks": args.chunks, "warmup_chunks": args.warmup,
        "dtype": str(dtype).removeprefix("torch."), "torch_threads": args.threads or torch.get_num_threads(),
        "parameters_m": round(sum(p.numel() for p in gm.transformer.parameters()) / 1e6, 2),
        "video_frames": len(times), "fps_end_to_end": fps,
        "fps_whole_run": len(times) / report["wall_s"],
        "time_to_first_frame_s": times[0] - report["t0"] if times else None,
        "stages": stages, **memory, "memory_method": MemoryProbe(torch.device(device)).method,
        "cache_bytes": gg.denoiser.stream.state_nbytes(), "runtime": runtime, "warm_s": warm_s,
    }


def figure(data: dict, plt):
    """Per-stage work p50 / p99 of one run. A ``--runtime`` comparison is :func:`compare_figure`."""
    if "backends" in data:
        return compare_figure(data, plt)
    if "sessions" in data:
        return sessions_figure(data, plt)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(data["stages"])
    ax.barh(names, [data["stages"][n]["p50_ms"] or 0 for n in names], label="p50")
    ax.barh(names, [data["stages"][n]["p99_ms"] or 0 for n in names], alpha=0.35, label="p99")
    ax.set_xlabel("ms of work per call")
    fps = data["fps_end_to_end"]
    ax.set_title(f"generate {data['family']} {data['config']} {data['size_hw'][0]}x{data['size_hw'][1]}, "
                 f"{data['steps']} steps, {data['attention']}: "
                 f"{fps:.2f} FPS end to end" if fps else "generate")
    ax.legend()
    fig.tight_layout()
    return fig


def compare_figure(data: dict, plt):
    """Two panels: the VAE decoder's p50 per chunk and the end-to-end FPS, per backend."""
    names = list(data["backends"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
    a.bar(names, [data["backends"][n]["stages"]["vae_decode"]["p50_ms"] for n in names])
    a.set_ylabel("VAE decode p50, ms per chunk")
    b.bar(names, [data["backends"][n]["fps_end_to_end"] or 0 for n in names])
    b.set_ylabel("FPS end to end")
    first = data["backends"][names[0]]
    fig.suptitle(f"generate {first['family']} {first['config']} {first['size_hw'][0]}x{first['size_hw'][1]}: "
                 f"VAE decoder on {' vs '.join(names)}")
    fig.tight_layout()
    return fig


def measure_sessions(args) -> dict:
    """``--sessions``: per count and batching, that many graphs at once on the torch VAE; see :func:`_sessions`."""
    rows = [_sessions(args, n, batching == "on") for batching in args.batching for n in args.sessions]
    return {"family": args.family, "config": args.config, "size_hw": list(args.size), "steps": args.steps,
            "chunk_frames": args.chunk_frames, "chunks": args.chunks, "warmup_chunks": args.warmup,
            "attention": args.attention if args.family == "wan" else "block-linear", "sessions": rows}


def _sessions(args, n: int, batched: bool) -> dict:
    """``n`` graphs side by side from threads, on a fast clock: each one's steady FPS at its sink, the slowest,
    the sum. Batched: one model, the denoisers on one lane. Alone: a model per session, as a server lends them."""
    from framegraph.stream.batching import ModelService

    device = args.device or default_device("torch")
    dtype = default_dtype(device)
    height, width = args.size
    timesteps, options = _schedule(args)
    service = ModelService() if batched else None
    shared = build_model(args.family, args.config, device, dtype, args.vae) if batched else None
    graphs = []
    for i in range(n):
        gm = shared or build_model(args.family, args.config, device, dtype, args.vae)
        gg = build_generate_graph(gm, size=(height, width), chunks=args.chunks, chunk_frames=args.chunk_frames,
                                  timesteps=timesteps, device=device, seed=i, batching=service, **options)
        embeds = torch.randn(gm.prompt_tokens, gm.family.text_dim(gm.transformer),
                             generator=torch.Generator().manual_seed(i))
        gg.denoiser.set_prompt_embeds(embeds, name=f"random prompt {i}")
        gg.warm()
        graphs.append((gg, _timed_sink(gg, width, height)))
    reports = [None] * n

    def run_one(i):
        reports[i] = graphs[i][0].graph.run()

    threads = [threading.Thread(target=run_one, args=(i,), name=f"bench-session-{i}") for i in range(n)]
    t0 = time.perf_counter()
    with torch_threads(args.threads):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.perf_counter() - t0
    fps = [_steady_fps(args, gg, sink.times) for gg, sink in graphs]
    lanes = list(service.lanes().values()) if service is not None else []
    row = {"sessions": n, "batching": "on" if batched else "off", "fps_per_session": fps,
           "slowest_fps": min(f for f in fps if f is not None) if any(fps) else None,
           "aggregate_fps": sum(f for f in fps if f is not None), "wall_s": wall,
           "denoiser_p50_ms": [stage_times(rep)["denoiser"]["p50_ms"] for rep in reports],
           "lane_batches": {str(b): c for b, c in sorted(lanes[0].stats.batches.items())} if lanes else None,
           "lane_cost_ms": {str(b): ns / 1e6 for b, ns in sorted(lanes[0].cost_ns.items())} if lanes else None}
    print(f"  {n} session(s), batching {row['batching']}: slowest {row['slowest_fps']:.2f} FPS, "
          f"all {row['aggregate_fps']:.2f} FPS")
    return row


def sessions_figure(data: dict, plt):
    """The slowest session's FPS and the sum over sessions, per count, batched and alone."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
    for mode in ("on", "off"):
        rows = [r for r in data["sessions"] if r["batching"] == mode]
        if rows:
            label = "batched" if mode == "on" else "alone"
            a.plot([r["sessions"] for r in rows], [r["slowest_fps"] or 0 for r in rows], "o-", label=label)
            b.plot([r["sessions"] for r in rows], [r["aggregate_fps"] for r in rows], "o-", label=label)
    a.set_xlabel("sessions")
    a.set_ylabel("slowest session, FPS")
    b.set_xlabel("sessions")
    b.set_ylabel("all sessions, FPS")
    a.legend()
    fig.suptitle(f"generate {data['family']} {data['config']} {data['size_hw'][0]}x{data['size_hw'][1]}: "
                 f"sessions at once")
    fig.tight_layout()
    return fig


def run(args: argparse.Namespace) -> int:
    meta = bench_metadata("generate")
    if args.sessions:
        result = {**meta, **measure_sessions(args)}
        png = write_result(result, args.out, sessions_figure)
        print(f"-> {args.out} (+ {png})")
        return 0
    runs = {backend: measure(args, backend) for backend in args.runtime}
    if len(runs) == 1:
        result = {**meta, **runs[args.runtime[0]]}
        png = write_result(result, args.out, figure)
    else:
        result = {**meta, "backends": runs,
                  "vae_decode_p50_ms": {n: r["stages"]["vae_decode"]["p50_ms"] for n, r in runs.items()},
                  "fps_end_to_end": {n: r["fps_end_to_end"] for n, r in runs.items()}}
        png = write_result(result, args.out, compare_figure)
    for backend, r in runs.items():
        fps = r["fps_end_to_end"]
        print(f"generate {args.family} {args.config} {args.size[0]}x{args.size[1]} ({result['device']}), VAE on "
              f"{backend}: {fps:.2f} FPS end to end, VAE decode p50 {r['stages']['vae_decode']['p50_ms']:.1f} ms, "
              f"first frame {r['time_to_first_frame_s']:.2f} s, peak {r['peak_memory_mib']:.0f} MiB")
    print(f"-> {args.out} (+ {png})")
    return 0
