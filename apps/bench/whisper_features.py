"""``framegraph bench whisper_features``: Whisper's encoder over a sliding window, on this machine's CPU.

    framegraph bench whisper_features --audio speech.wav --out benchmarks/results/cpu/whisper_features.json

It measures :mod:`framegraph.models.audio.whisper_stream`:

- **cost** per engine and window length. One engine is torch, with the weights in transformers'
  ``WhisperEncoder``. The others are CTranslate2 at each compute type. The figure is the median time of one
  window: its log-mel and the encoder. Windows run one at a time, as live. The engines take turns window by
  window. From it comes the cost in milliseconds per second of audio at ``--hop-ms``.
- **agreement** per window length and look-ahead. Each 50-Hz row is computed in its window. It is compared with
  the same row from one pass over the whole clip. That pass covers up to 30 s, Whisper's own window. The figures
  are the mean cosine similarity, and the correlation over the rows. The correlation is per feature dimension,
  averaged. It uses the torch engine, since it measures the windows, not the engine.
- with ``--clip``, a talking video: **the shape head** on each window's features. The clip is prepared and
  face-tracked as ``avatar train --video`` does. See :func:`~framegraph.apps.bench.av_sync.track_clip`. The
  sound is moved by the lag training finds. The rows are averaged per video frame, two per frame at 25 fps. The
  figure is the head's cross-validated openness correlation. It is taken on the training frames and on the
  held-out tail. The astronaut's audio encoder gets the same, beside it.

With ``--clip`` it also fits two more things:

- with ``--pca``, the head on the rows projected onto their first principal components. The components come
  from the training frames.
- each candidate of :mod:`~framegraph.models.avatar.video.features`. A candidate is the encoder's features with
  Whisper's beside them. It records the one the folds choose, ``chosen_by_folds``. That is what
  ``avatar train --video`` picks. Its tail is compared with the encoder's alone.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from framegraph.models.audio.features import extract_features
from framegraph.models.audio.whisper import WhisperEncoderEngine, whisper_log_mel
from framegraph.models.audio.whisper_stream import WhisperWindows, encode_windows, per_video_frame, whisper_features
from framegraph.models.avatar.video.features import CHOICES, candidates
from framegraph.models.avatar.video.sync import head_fit_by_lag
from framegraph.models.avatar.video.train import VideoTrainConfig, _align_sound, _audio_encoder

from .av_sync import tail_fit, track_clip
from .meta import bench_metadata, write_result
from .speech import speech_or_file


def _engine(name: str, model, threads: int) -> WhisperEncoderEngine:
    if name == "torch":
        return WhisperEncoderEngine(model, engine="torch")
    if name.startswith("ctranslate2-"):
        return WhisperEncoderEngine(model, engine="ctranslate2", compute_type=name.split("-", 1)[1], threads=threads)
    raise ValueError(f"--engines: {name!r} is not torch or ctranslate2-COMPUTE_TYPE (int8, float32, ...)")


def _agreement(windowed: torch.Tensor, whole: torch.Tensor) -> dict:
    """Mean cosine similarity of the rows. Also the mean over dimensions of their correlation over time."""
    cos = torch.nn.functional.cosine_similarity(windowed, whole, dim=1).mean().item()
    a, b = windowed - windowed.mean(0), whole - whole.mean(0)
    corr = ((a * b).sum(0) / (a.norm(dim=0) * b.norm(dim=0)).clamp_min(1e-9)).mean().item()
    return {"cosine": round(cos, 4), "corr": round(corr, 4)}


def _principal(frames: torch.Tensor, n_train: int, dims: int) -> torch.Tensor:
    """``frames [T, D]`` projected onto the first ``dims`` principal components of the training frames.

    0 means all of them."""
    if dims <= 0:
        return frames
    mean = frames[:n_train].mean(0)
    _, _, v = torch.linalg.svd(frames[:n_train] - mean, full_matrices=False)
    return (frames - mean) @ v[:dims].T


def _head_fits(args, engine, contexts, lookaheads) -> dict:
    """The shape head on each window's features of ``args.clip`` against the astronaut encoder's."""
    fps, audio, shapes, z, n_train = track_clip(args.clip, args.work, args.holdout)
    n, cfg = len(z), VideoTrainConfig(holdout=args.holdout)
    with torch.no_grad():
        astronaut = extract_features(_audio_encoder(None)[0], audio, fps)[:n]
    _, _, report = _align_sound(astronaut, None, shapes[:, 0], audio, z, n_train, cfg, fps)
    lag = report["frames"]
    out = {"clip": os.path.basename(args.clip), "holdout": args.holdout, "frames": n, "train_frames": n_train,
           "av_offset_frames": lag, "av_offset_reason": report["reason"], "fits": []}

    def fit(feats, label):
        out["fits"].append({**label, "feature_dim": feats.shape[1],
                            "head_cv_openness_corr": head_fit_by_lag(feats[:n_train], z[:n_train], [lag],
                                                                     context=cfg.context)[lag],
                            "head_tail_openness_corr": tail_fit(feats, z, n_train, lag, cfg.context)})
        print(f"{label}: head cv {out['fits'][-1]['head_cv_openness_corr']}, tail "
              f"{out['fits'][-1]['head_tail_openness_corr']}")

    fit(astronaut, {"features": "astronaut audio encoder"})
    pca = [int(d) for d in args.pca.split(",")]
    for context in contexts:
        for ahead in lookaheads:
            frames = per_video_frame(whisper_features(engine, audio, WhisperWindows(context, args.hop_ms, ahead)),
                                     n, fps)
            for dims in pca:
                fit(_principal(frames, n_train, dims), {"features": "whisper", "context_ms": context,
                                                        "lookahead_ms": ahead, "pca": dims})
            # beside the encoder's, as video avatars hear them: each candidate's columns, the folds choosing
            joined = torch.cat([astronaut, frames], 1)
            for columns in candidates(joined[:n_train], astronaut.shape[1]):
                fit(columns(joined).float(), {"features": columns.name, "context_ms": context,
                                              "lookahead_ms": ahead})
            beside = out["fits"][-len(CHOICES):]
            pick = max(beside, key=lambda f: f["head_cv_openness_corr"])
            out.setdefault("chosen_by_folds", []).append(
                {"context_ms": context, "lookahead_ms": ahead, "chosen": pick["features"],
                 "head_tail_openness_corr": pick["head_tail_openness_corr"],
                 "tail_change_vs_encoder": round(pick["head_tail_openness_corr"] - beside[0]["head_tail_openness_corr"],
                                                 4)})
    return out


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    audio, source = speech_or_file(args.audio)
    audio = audio[:30 * 16000]  # one pass over the whole clip: at most Whisper's 30 s
    result = bench_metadata("whisper_features")
    if args.audio:  # the file is named, its folder (data outside the repo) not recorded
        result["command"] = result["command"].replace(os.path.dirname(os.path.abspath(args.audio)) + os.sep, "")
    contexts = [int(c) for c in args.contexts_ms.split(",")]
    lookaheads = [int(c) for c in args.lookaheads_ms.split(",")]
    import ctranslate2

    result.update({"audio": source, "audio_seconds": round(len(audio) / 16000, 2), "hop_ms": args.hop_ms,
                   "ctranslate2": ctranslate2.__version__,
                   "threads": args.threads, "cost": [], "agreement": []})
    engines = {name: _engine(name.strip(), args.model, args.threads) for name in args.engines.split(",")}
    x = torch.from_numpy(audio.astype(np.float32) / 32768)
    for context in contexts:  # the engines take turns window by window: a shared machine's load falls on all alike
        spec = WhisperWindows(context_ms=context, hop_ms=args.hop_ms, lookahead_ms=0)
        starts = np.linspace(0, len(x) - spec.context, args.repeats).astype(int)
        times = {name: [] for name in engines}
        for name, engine in engines.items():
            encode_windows(engine, [x[:spec.context]], spec)  # warm
        for s in starts:
            for name, engine in engines.items():
                t0 = time.perf_counter()
                encode_windows(engine, [x[s:s + spec.context]], spec)
                times[name].append(1000 * (time.perf_counter() - t0))
        for name in engines:
            ms = statistics.median(times[name])
            result["cost"].append({"engine": name, "context_ms": context, "window_ms_p50": round(ms, 2),
                                   "ms_per_audio_s": round(ms * 1000 / args.hop_ms, 1)})
            print(f"{name} {context} ms windows: {ms:.1f} ms each, {ms * 1000 / args.hop_ms:.0f} ms per s of audio")
    torch_engine = engines.get("torch") or _engine("torch", args.model, args.threads)
    n = len(x) // 320 * 320
    with torch.inference_mode():
        whole = torch_engine(whisper_log_mel(x[:n])[None])[0]
    for context in contexts:
        for ahead in lookaheads:
            spec = WhisperWindows(context_ms=context, hop_ms=args.hop_ms, lookahead_ms=ahead)
            rows = whisper_features(torch_engine, audio[:n], spec)
            got = _agreement(rows[:len(whole)], whole)
            result["agreement"].append({"context_ms": context, "lookahead_ms": ahead, **got})
            print(f"context {context} ms, look-ahead {ahead} ms: cosine {got['cosine']}, corr {got['corr']}")
    if args.clip:
        result["command"] = result["command"].replace(os.path.dirname(os.path.abspath(args.clip)) + os.sep, "")
        result["shape_head"] = _head_fits(args, torch_engine, contexts, lookaheads)
    write_result(result, args.out, figure)
    return 0


def figure(data: dict, plt):
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    for name in dict.fromkeys(c["engine"] for c in data["cost"]):
        rows = [c for c in data["cost"] if c["engine"] == name]
        a.plot([c["context_ms"] for c in rows], [c["ms_per_audio_s"] for c in rows], "o-", label=name)
    a.set_xlabel("window (ms)", fontsize=8)
    a.set_ylabel("ms per second of audio", fontsize=8)
    a.legend(fontsize=7)
    for ahead in dict.fromkeys(g["lookahead_ms"] for g in data["agreement"]):
        rows = [g for g in data["agreement"] if g["lookahead_ms"] == ahead]
        b.plot([g["context_ms"] for g in rows], [g["corr"] for g in rows], "o-", label=f"look-ahead {ahead} ms")
    b.set_xlabel("window (ms)", fontsize=8)
    b.set_ylabel("corr. with the whole clip's features", fontsize=8)
    b.legend(fontsize=7)
    fig.suptitle(f"Whisper encoder features, hop {data['hop_ms']} ms, {data['threads']} thread(s)", fontsize=9)
    fig.tight_layout()
    return fig
