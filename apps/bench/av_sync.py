"""``framegraph bench av_sync``: the A/V shift ``avatar train --video`` makes on real clips, old rule against new.

    framegraph bench av_sync --clip person.mp4 --name "desk address" --work /tmp/av_sync \\
        --out benchmarks/results/cpu/av_sync.json

Each clip is prepared as training prepares it. See
:func:`~framegraph.models.avatar.video.train.train_video_avatar`. The face is tracked on every frame. The
openness, the shapes and the audio encoder's features are measured. The first ``1 - holdout`` of the frames
are for training.

Two rules pick a lag. The new one is the training's own decision,
:func:`~framegraph.models.avatar.video.train._align_sound`. It wants a peak inside the window, above chance,
confirmed by the shape head. The old rule takes the best lag if it beats lag 0 by ``MIN_GAIN`` and chance. It
is read off the same report's checks.

The shape head is fitted at each lag the two rules pick. Two figures come out per lag. One is its
cross-validated openness correlation on the training frames, with the same frames and folds. The other is its
openness correlation on the held-out tail. For that, the head is fitted on all training frames so moved. The
tail's sound is moved alike.
"""
from __future__ import annotations

import argparse
import os

import torch

from framegraph.models.audio.features import extract_features
from framegraph.models.avatar.clips.prepare import prepare_video
from framegraph.models.avatar.video.bundle import shape_stats
from framegraph.models.avatar.video.lipsync import context_windows, fit_shape_head
from framegraph.models.avatar.video.sync import head_fit_by_lag, shift_frames
from framegraph.models.avatar.video.train import (
    VideoTrainConfig,
    _align_sound,
    _audio_encoder,
    _read_clips,
    clips_audio,
    track_faces,
)
from framegraph.stream.quality import pearson

from .meta import bench_metadata, write_result


def tail_fit(feats: torch.Tensor, z: torch.Tensor, n_train: int, lag: int, context: int) -> float | None:
    """The head fitted on the training frames' features moved by ``lag``: its openness correlation on the tail."""
    moved = shift_frames(feats, lag)
    head, _ = fit_shape_head(moved[:n_train], z[:n_train], context=context)
    with torch.no_grad():
        pred = head(context_windows(moved, context))[n_train:, 0].numpy()
    return pearson(pred, z[n_train:, 0], digits=4)


def track_clip(path: str, work: str, holdout: float):
    """A clip as training sees it.

    Returns its fps, its audio as int16 at 16 kHz, the measured shapes ``[T, P]``, their standardised ``z``, and
    the training frames' count, the first ``1 - holdout``."""
    prep = prepare_video(path, work, region_size=64, max_side=VideoTrainConfig().max_side, progress=False)
    audio = clips_audio(prep.clips)
    track = track_faces((f for clip in _read_clips(prep.clips) for f in clip["frames"]), os.path.basename(path))
    n = len(track.found)
    n_train = n - int(round(holdout * n))
    mean, std = shape_stats(track.shapes[:n_train])
    return prep.fps, audio, track.shapes, torch.from_numpy((track.shapes - mean) / std).float(), n_train


def measure_clip(path: str, work: str, holdout: float) -> dict:
    """One clip's lags by both rules and the head's fits at them (see the module docstring)."""
    cfg = VideoTrainConfig(holdout=holdout)
    fps, audio, shapes, z, n_train = track_clip(path, work, holdout)
    n = len(z)
    encoder, _ = _audio_encoder(None)
    with torch.no_grad():
        feats = extract_features(encoder, audio, fps)[:n]
    _, _, report = _align_sound(feats, None, shapes[:, 0], audio, z, n_train, cfg, fps)
    checks = report["checks"]
    old = report["peak_frames"] if checks["gain_over_lag_0"] and checks["above_chance"] else 0
    new = report["frames"]
    lags = sorted({0, old, new, report["peak_frames"]})
    return {"frames": n, "train_frames": n_train, "fps": fps, "old_lag": old, "new_lag": new,
            "decision_changed": old != new, "av_offset": report,
            "head_cv_openness_corr": {str(k): v for k, v in head_fit_by_lag(feats[:n_train], z[:n_train], lags,
                                                                            context=cfg.context).items()},
            "head_tail_openness_corr": {str(k): tail_fit(feats, z, n_train, k, cfg.context) for k in lags}}


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    names = args.name or []
    result = bench_metadata("av_sync")
    for clip in args.clip:  # the clips are named by file: their folder (data outside the repo) is not recorded
        result["command"] = result["command"].replace(os.path.dirname(os.path.abspath(clip)) + os.sep, "")
    result.update({"holdout": args.holdout, "torch_threads": args.threads, "clips": {}})
    for i, clip in enumerate(args.clip):
        name = names[i] if i < len(names) else os.path.basename(clip)
        got = measure_clip(clip, os.path.join(args.work, f"clip_{i}"), args.holdout)
        result["clips"][name] = got
        print(f"{name}: old lag {got['old_lag']}, new lag {got['new_lag']} ({got['av_offset']['reason']}); head cv "
              f"{got['head_cv_openness_corr']}, tail {got['head_tail_openness_corr']}")
    write_result(result, args.out, figure)
    return 0


def figure(data: dict, plt):
    clips = data.get("clips", {})
    fig, axes = plt.subplots(1, max(len(clips), 1), figsize=(4 * max(len(clips), 1), 3), squeeze=False)
    for ax, (name, c) in zip(axes[0], clips.items()):
        scores = c["av_offset"]["openness_loudness_corr_by_lag"]
        ax.plot([int(k) for k in scores], list(scores.values()), "o-", color="#4878a8")
        past = c["av_offset"].get("past_ends_corr_by_lag", {})
        ax.plot([int(k) for k in past], list(past.values()), "o", color="#bbbbbb")
        ax.axhline(c["av_offset"]["chance_level"], color="#c44", lw=0.8, ls="--")
        ax.set_title(f"{name}: old {c['old_lag']}, new {c['new_lag']}", fontsize=8)
        ax.set_xlabel("lag (frames)", fontsize=8)
    axes[0][0].set_ylabel("openness-loudness corr.", fontsize=8)
    fig.tight_layout()
    return fig
