"""A video avatar measured against the person's real frames: ``evaluate_video_avatar(avatar, clip, ...)``.

It takes a segment of a real clip of the person. Give one whose audio was not used in training.
``avatar train --video --holdout 0.2`` keeps the last 20 % out. For every frame of it:

- The real frame is the base, instead of the loop. So the picture can be compared pixel for pixel.
- Its region box comes from its own landmarks.
- The mouth shape comes from the clip's audio, through the avatar's audio stages (:class:`MouthShape`). The
  speaking state comes from Silero VAD.
- The lower face is redrawn and pasted back exactly as the live graph does (:class:`MouthRegion`).

Then come the face engineer's landmark measures, from :mod:`.real`. They are mouth-openness correlation
generated vs real, and PSNR / SSIM outside the mouth. They are mouth sharpness, the jaw line's edge and lips
closed in silence. The time per frame of redraw + paste is measured too.

:func:`evaluate_typed_text` meets the avatar as a user who types does. It draws eSpeak NG sentences it never
learnt on its loop frames. It measures how the drawn mouth follows their phonemes' jaw. It measures how wide
it opens while speaking. Compare that with the person's own real openness while speaking. That is
``real_speaking_openness`` of :func:`evaluate_video_avatar`.
"""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import torch

from framegraph.stream.media import SAMPLE_RATE, decode_audio, read_video
from framegraph.stream.quality import pearson

from ..clips.io import ClipWriter, probe
from ..clips.prepare import prepare_video
from ..video.bundle import VideoAvatar, region_boxes
from ..video.espeak_rows import CHECK_SEED, CHECK_SENTENCES, typed_sentences
from ..video.jaw import kept_share
from ..video.stages import MouthRegion, MouthShape
from ..video.sync import shift_audio
from ..video.train import track_faces
from .real import LandmarkMeter, real_summary, speech_per_frame


def evaluate_video_avatar(avatar: VideoAvatar, clip, *, start_s: float = 0.0, end_s: float | None = None,
                          out_video=None, av_offset_frames: int | None = None) -> dict:
    """Measure ``avatar`` on the frames of ``clip`` from ``start_s`` to ``end_s``; see the module docstring.

    ``clip`` is the source video, made as training made it. Or it is a clip at the avatar's size and fps.
    ``out_video``: also write the generated segment, as MP4 with its audio. ``av_offset_frames``: the frames by
    which the clip's sound comes after its picture. The sound is moved that much earlier
    (:func:`~..video.sync.shift_audio`). None uses the bundle's own measure of its source video. Give 0 for a
    clip recorded otherwise."""
    clip = os.fspath(clip)
    with tempfile.TemporaryDirectory() as tmp:
        played = _as_played(avatar, clip, tmp)
        video = read_video(played)
        audio = decode_audio(played)
    frames, fps = video["frames"], float(video["fps"])
    H, W = frames.shape[1:3]
    lag = avatar.av_offset_frames if av_offset_frames is None else int(av_offset_frames)
    n = len(frames)
    if abs(lag) >= n:
        raise ValueError(f"{clip}: a sound offset of {lag} frames ({lag / fps:g} s) moves the whole sound past the "
                         f"clip's {n / fps:.2f} s (an offset is a few frames: what `avatar train --video` measured)")
    audio = shift_audio(audio, lag, int(round(SAMPLE_RATE / fps)))
    a = int(round(start_s * fps))
    b = n if end_s is None else min(n, int(round(end_s * fps)))
    if not 0 <= a < b:
        raise ValueError(f"{clip}: segment {start_s:g}..{end_s} s holds no frames (the clip has {n / fps:.2f} s)")
    feats = avatar.hear(audio, fps)
    feats = torch.cat([feats, feats[-1:].expand(max(0, n - len(feats)), -1)])[:n]
    speech = speech_per_frame(audio, n, fps)
    track = track_faces(iter(frames[a:b]), os.path.basename(clip))
    boxes = region_boxes(track.centres, avatar.box_side, W, H)
    shape_stage = MouthShape(avatar.shape_head, avatar.rest_shape, gate=avatar.silence_gate)
    mouth_region = MouthRegion.for_avatar(avatar)
    meter, rows, out, ms = LandmarkMeter(), [], [], []
    try:
        for t in range(b):
            shape = shape_stage.step(feats[t], bool(speech[t] >= 0.5))  # the audio before the segment: context
            if t < a:
                continue
            frame = torch.from_numpy(frames[t])
            box = [int(v) for v in boxes[t - a]]
            t0 = time.perf_counter()
            # kept below the frame's own jaw line, as the bundle's loop frames are
            kept = kept_share(track.jaws[t - a], box) if avatar.jaws is not None else None
            gen = mouth_region.picture(frame, box, shape, kept_share=kept).numpy()
            ms.append(1000 * (time.perf_counter() - t0))
            rows.append({**meter.measure(gen, frames[t]), "shape_openness": float(shape[0])})
            if out_video is not None:
                out.append(gen)
    finally:
        meter.close()
    summary = real_summary(rows, speech[a:b])
    shape_open = np.array([r["shape_openness"] for r in rows])
    real_open = np.array([r.get("lm_open_real", np.nan) for r in rows], np.float64)
    drawn_open = np.array([r["lm_open"] for r in rows], np.float64)
    ok = np.isfinite(real_open)
    if summary["jaw"] is not None:  # the worst frame, as a time in the clip
        summary["jaw"]["worst_frame_s"] = round((a + summary["jaw"]["worst_frame"]) / fps, 3)
    summary.update(clip=os.path.abspath(clip), start_s=round(a / fps, 3), end_s=round(b / fps, 3),
                   av_offset_frames=lag,
                   region_size=avatar.region_size, box_side_px=avatar.box_side,
                   shape_vs_real_openness_corr=pearson(shape_open, real_open, digits=4),
                   # the generator's part: how the drawn mouth follows the shape it was asked for
                   picture_vs_shape_openness_corr=pearson(shape_open, drawn_open, digits=4),
                   real_openness_std=round(float(np.nanstd(real_open)), 4),
                   real_speaking_openness=_mean_std(real_open[ok & (speech[a:b] >= 0.5)]),
                   redraw_ms_p50=round(float(np.median(ms)), 2), threads=torch.get_num_threads())
    if out_video is not None:
        _write(out_video, np.stack(out), audio[int(a * SAMPLE_RATE / fps):int(b * SAMPLE_RATE / fps)], int(round(fps)))
    return summary


def evaluate_typed_text(avatar: VideoAvatar, *, sentences: int = CHECK_SENTENCES, seed: int = CHECK_SEED) -> dict:
    """Draw ``sentences`` random eSpeak NG sentences on the avatar and measure them.

    The sentences use the demo's voices. They go through the avatar's audio stages. The mouth is drawn on its loop
    frames in turn. The face landmarks measure it. ``drawn_vs_phoneme_jaw_corr`` is the drawn openness against the jaw
    curve of the sentences' phonemes. ``drawn_speaking_openness`` is the mean and std over the frames the voice detector
    hears speech in. ``drawn_silent_openness_mean`` is the rest. Raises ``EspeakNotFound`` without eSpeak NG."""
    said = typed_sentences(avatar.hear, avatar.fps, sentences, seed)
    shape_stage = MouthShape(avatar.shape_head, avatar.rest_shape, gate=avatar.silence_gate)
    mouth_region = MouthRegion.for_avatar(avatar)
    meter, drawn, jaw, speaking, k = LandmarkMeter(), [], [], [], 0
    try:
        for feats, jaw_curve, spoken in said:
            for t in range(len(feats)):
                shape = shape_stage.step(feats[t], bool(spoken[t]))
                i = k % len(avatar.frames)  # the loop's frames in turn (a plain walk: the cursor is not measured)
                frame, box = avatar.frames[i], [int(v) for v in avatar.boxes[i]]
                kept = kept_share(avatar.jaws[i], box) if avatar.jaws is not None else None
                gen = mouth_region.picture(torch.from_numpy(np.asarray(frame)), box, shape, kept_share=kept).numpy()
                drawn.append(meter.measure(gen, np.asarray(frame))["lm_open"])
                jaw.append(jaw_curve[t])
                speaking.append(bool(spoken[t]))
                k += 1
    finally:
        meter.close()
    drawn, jaw, speaking = np.array(drawn, np.float64), np.array(jaw), np.array(speaking)
    ok = np.isfinite(drawn)
    return {"sentences": sentences, "seed": seed, "frames": int(ok.sum()),
            "drawn_vs_phoneme_jaw_corr": pearson(drawn, jaw, digits=4),
            "drawn_speaking_openness": _mean_std(drawn[ok & speaking]),
            "drawn_silent_openness_mean": round(float(drawn[ok & ~speaking].mean()), 4) if (ok & ~speaking).any()
            else None}


def _mean_std(x: np.ndarray) -> dict | None:
    return {"mean": round(float(x.mean()), 4), "std": round(float(x.std()), 4)} if len(x) else None


def _as_played(avatar: VideoAvatar, clip: str, tmp: str) -> str:
    """``clip`` as it plays at the avatar's size and fps.

    That is ``clip`` itself when it already does. Else the clip is made in ``tmp`` as training made its source video, by
    :func:`~..clips.prepare.prepare_video`. It is resampled to the avatar's fps and scaled to its size. It is one
    segment. So the source video itself can be given, whatever its resolution and frame rate."""
    info = probe(clip)
    if (info["width"], info["height"]) == (avatar.width, avatar.height) and abs((info["fps"] or 0) - avatar.fps) < 0.01:
        return clip
    prep = prepare_video(clip, tmp, fps=int(round(avatar.fps)), max_side=max(avatar.width, avatar.height),
                         segment_seconds=1e6, min_seconds=1.0, progress=False)
    size = (prep.portrait["width"], prep.portrait["height"])
    if size != (avatar.width, avatar.height):
        raise ValueError(f"{clip}: {info['width']}x{info['height']} at {info['fps']:g} fps plays at "
                         f"{size[0]}x{size[1]} once prepared as for training; the avatar plays "
                         f"{avatar.width}x{avatar.height} at {avatar.fps:g} fps (give a clip of the video it was made "
                         "from)")
    return prep.clips[0]


def _write(path, frames: np.ndarray, audio: np.ndarray, fps: int) -> None:
    spf = SAMPLE_RATE // fps
    w = ClipWriter(os.fspath(path), frames.shape[2], frames.shape[1], fps)
    ok = False
    try:
        for k, f in enumerate(frames):
            w.write(f, audio[k * spf:(k + 1) * spf])
        ok = True
    finally:
        w.close(ok)


__all__ = ["evaluate_video_avatar"]
