"""A MuseTalk avatar measured against the person's real frames: ``evaluate_musetalk(avatar, clip, ...)``.

Each real frame of the clip is redrawn as the live graph draws a loop frame. Its face box and blend mask come
from its own landmarks. The UNet sees the real face with its lower half black. Its reference half is the bundle's
rest face, not the real frame: the real mouth would give the answer away. The context is the clip's audio
through the live windows. Then :mod:`.real` measures the frames against the real ones.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch

from framegraph.stream.media import SAMPLE_RATE, decode_audio

from ..base import RunSettings
from ..musetalk.bundle import MuseTalkAvatar
from ..musetalk.engines import torch_engines
from ..musetalk.face import blend_mask, crop_face, face_box, paste_face
from ..musetalk.hearing import live_context
from ..musetalk.prepare import loop_frames
from ..musetalk.step import encode_faces, masked
from ..video.sync import shift_audio
from ..video.train import track_faces
from .real import LandmarkMeter, real_summary, speech_per_frame
from .video import _write

BATCH = 4  # frames redrawn per step call


def reference_half(avatar: MuseTalkAvatar) -> torch.Tensor:
    """``[C, h, w]``: the whole-face latent of the bundle's rest frame (the first of its idle range)."""
    half = avatar.latents.shape[1] // 2
    return avatar.latents[avatar.idle[0], half:]


@torch.inference_mode()
def evaluate_musetalk(avatar: MuseTalkAvatar, clip, *, start_s: float = 0.0, end_s: float | None = None,
                      out_video=None, av_offset_frames: int = 0, device: str = "cpu", progress: bool = True) -> dict:
    """Measure ``avatar`` on the frames of ``clip`` from ``start_s`` to ``end_s`` (see the module docstring).

    ``clip`` is a video of the person with sound, at any size. ``out_video`` also writes the redrawn segment as
    MP4 with its sound. ``av_offset_frames``: how many frames the clip's sound comes late; it is moved earlier.
    Returns :func:`~.real.real_summary`'s metrics and the segment, the reference and the time per frame."""
    clip = os.fspath(clip)
    fps = avatar.fps
    seconds = 1e9 if end_s is None else end_s
    frames = loop_frames(clip, seconds, fps, max_side=int(avatar.meta.get("prepared", {}).get("max_side", 1280)))
    audio = shift_audio(decode_audio(clip), int(av_offset_frames), int(round(SAMPLE_RATE / fps)))
    n = len(frames)
    a = int(round(start_s * fps))
    b = n if end_s is None else min(n, int(round(end_s * fps)))
    if not 0 <= a < b:
        raise ValueError(f"{clip}: segment {start_s:g}..{end_s} s holds no frames (the clip has {n / fps:.2f} s)")
    engines = torch_engines(avatar, RunSettings(device=device))
    step, dtype = engines.step, engines.dtype
    context = live_context(engines.whisper, audio, fps, frames=b)[a:b]
    H, W = frames[0].shape[:2]
    track = track_faces(iter(frames[a:b]), os.path.basename(clip), total=b - a, progress=progress)
    boxes = [tuple(int(v) for v in face_box(p, (W, H))) for p in track.points]
    reference = reference_half(avatar).to(device, dtype)
    meter, rows, out, ms = LandmarkMeter(), [], [], []
    try:
        for k in range(0, b - a, BATCH):
            ks = range(k, min(k + BATCH, b - a))
            t0 = time.perf_counter()
            crops = torch.from_numpy(np.stack([crop_face(frames[a + i], boxes[i]) for i in ks]))
            hidden = encode_faces(step.vae, masked(crops)).to(dtype)
            latents = torch.cat([hidden, reference.expand(len(ks), -1, -1, -1)], dim=1)
            faces = step(latents, context[k:k + len(ks)].to(device, dtype)).cpu()
            for j, i in enumerate(ks):
                mask = torch.from_numpy(blend_mask(track.polygons[i], boxes[i]))
                gen = paste_face(torch.from_numpy(frames[a + i]), faces[j], boxes[i], mask).numpy()
                rows.append(meter.measure(gen, frames[a + i]))
                if out_video is not None:
                    out.append(gen)
            ms.append(1000 * (time.perf_counter() - t0) / len(ks))
    finally:
        meter.close()
    summary = real_summary(rows, speech_per_frame(audio, b, fps)[a:b])
    if summary["jaw"] is not None:  # the worst frame, as a time in the clip
        summary["jaw"]["worst_frame_s"] = round((a + summary["jaw"]["worst_frame"]) / fps, 3)
    summary.update(clip=os.path.abspath(clip), start_s=round(a / fps, 3), end_s=round(b / fps, 3),
                   av_offset_frames=int(av_offset_frames), reference="the bundle's rest frame",
                   redraw_ms_p50=round(float(np.median(ms)), 2), device=str(device), threads=torch.get_num_threads())
    if out_video is not None:
        _write(out_video, np.stack(out), audio[int(a * SAMPLE_RATE / fps):int(b * SAMPLE_RATE / fps)], int(round(fps)))
    return summary


__all__ = ["evaluate_musetalk", "reference_half"]
