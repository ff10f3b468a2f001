"""A person prepared for MuseTalk, once, without training. The command is ``framegraph avatar prepare --musetalk``.

    video ─▶ the first ``loop_seconds`` at 25 fps (scaled to ``max_side``) ─▶ face landmarks on every frame (one face)
          ─▶ per frame: MuseTalk's face box, the 256² crop, the blend mask, the VAE's latents of the crop
          ─▶ the loop as the video avatar picks it: the calmest ``idle_seconds`` of mouth as the idle range, the
             idle frame most like each frame ─▶ the bundle (:mod:`.bundle`)

The video's sound is not used. Any video of one person facing the camera will do.
"""
from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from framegraph.models.avatar.video.loop import nearest_frames
from framegraph.models.avatar.video.provenance import sha256_of
from framegraph.models.avatar.video.train import idle_range, track_faces
from framegraph.stream.media import MediaError
from framegraph.stream.media.errors import open_media

from .bundle import MuseTalkAvatar, save_musetalk_avatar
from .face import blend_mask, crop_face, face_box
from .files import MuseTalkFiles, load_unet, load_vae, load_whisper
from .step import face_latents

FPS = 25.0  # MuseTalk's frame rate: each frame attends to 2 frames' worth (80 ms) of audio around its own
MIN_FRAMES = 2


def loop_frames(path, seconds: float, fps: float = FPS, max_side: int = 1280) -> list[np.ndarray]:
    """The video's first ``seconds`` at ``fps``, ``uint8 [H, W, 3]`` each.

    Each is the frame on show at its output time. Frames are scaled down so the longer side is at most
    ``max_side``. Raises :class:`MediaError` for a file with no video, or with fewer than ``MIN_FRAMES`` frames."""
    container = open_media(path)
    out: list[np.ndarray] = []
    try:
        if not container.streams.video:
            raise MediaError(path, "has no video stream; expected a video of the person")
        stream = container.streams.video[0]
        want = int(round(seconds * fps))
        shown = None
        for frame in container.decode(stream):
            t = float(frame.time) if frame.time is not None else len(out) / fps
            while len(out) < want and t > (len(out) + 0.5) / fps and shown is not None:
                out.append(shown)  # the frame on show at output time len(out)
            if len(out) >= want:
                break
            scale = min(1.0, max_side / max(frame.width, frame.height))
            w, h = (int(round(frame.width * scale)) // 2 * 2, int(round(frame.height * scale)) // 2 * 2) \
                if scale < 1 else (frame.width, frame.height)
            shown = frame.reformat(width=w, height=h, format="rgb24").to_ndarray()
        if shown is not None and len(out) < want:
            out.append(shown)  # the last frame, on show until the video ends
    finally:
        container.close()
    if len(out) < MIN_FRAMES:
        raise MediaError(path, f"has {len(out)} frame(s); a MuseTalk avatar loops at least {MIN_FRAMES}")
    return out


def prepare_musetalk(files: MuseTalkFiles, video, out_dir, *, loop_seconds: float = 10.0, idle_seconds: float = 2.0,
                     max_side: int = 1280, batch: int = 8, device: str = "cpu", progress: bool = True,
                     log=None) -> MuseTalkAvatar:
    """Prepare the person of ``video`` for MuseTalk into the bundle ``out_dir``. See the module docstring.

    MuseTalk's files are checked to fit each other first. Raises :class:`~.files.MuseTalkError` for MuseTalk's
    files. Raises :class:`MediaError` for an unreadable video. Raises :class:`~framegraph.models.face.FaceError`
    for a video with no face or several. It says how many frames had one. Raises :class:`ValueError` unless
    ``loop_seconds`` and ``idle_seconds`` are positive."""
    path = os.fspath(video)
    if not os.path.isfile(path):
        raise MediaError(path, "does not exist")
    if loop_seconds <= 0 or idle_seconds <= 0:
        raise ValueError(f"loop_seconds={loop_seconds} and idle_seconds={idle_seconds} must be > 0")
    started = time.monotonic()
    unet = load_unet(files.unet_config, files.unet_weights)  # the files are checked to fit now, not at first use
    load_whisper(files.whisper, unet.config.cross_attention_dim)
    del unet
    vae = load_vae(files.vae).to(device)
    frames = loop_frames(path, loop_seconds, FPS, max_side)
    H, W = frames[0].shape[:2]
    track = track_faces(iter(frames), os.path.basename(path), total=len(frames), progress=progress)
    boxes = np.array([face_box(p, (W, H)) for p in track.points], np.int32)
    masks = [blend_mask(poly, tuple(box)) for poly, box in zip(track.polygons, boxes)]
    latents = []
    from tqdm import tqdm

    for start in tqdm(range(0, len(frames), batch), desc="face latents", unit="batch", disable=not progress,
                      dynamic_ncols=True):
        crops = np.stack([crop_face(f, tuple(b)) for f, b in zip(frames[start:start + batch],
                                                                  boxes[start:start + batch])])
        latents.append(face_latents(vae, torch.from_numpy(crops)).float().cpu())
    idle = idle_range(track.shapes[:, 0], len(frames), int(round(idle_seconds * FPS)))
    thumbs = np.stack([f[::8, ::8].astype(np.float32).mean(2) for f in frames])
    meta = {"source": {"video": os.path.basename(path), "sha256": sha256_of(path), "width": W, "height": H},
            "prepared": {"when": datetime.now(UTC).isoformat(timespec="seconds"),
                         "loop_seconds": loop_seconds, "idle_seconds": idle_seconds, "max_side": max_side,
                         "seconds": round(time.monotonic() - started, 1),
                         "faces_found": int(track.found.sum())}}
    avatar = MuseTalkAvatar(files, torch.from_numpy(np.stack(frames)), boxes, masks, torch.cat(latents), idle,
                            nearest_frames(thumbs, range(*idle)), FPS, meta)
    save_musetalk_avatar(out_dir, avatar)
    _write_provenance(Path(out_dir), avatar, path)
    if log:
        log(f"prepared {len(frames)} loop frames in {meta['prepared']['seconds']:g} s into {out_dir}")
    return avatar


def _write_provenance(root: Path, avatar: MuseTalkAvatar, video: str) -> None:
    src, prep, f = avatar.meta["source"], avatar.meta["prepared"], avatar.files
    (root / "PROVENANCE.md").write_text(
        f"# Provenance\n\nA MuseTalk 1.5 avatar prepared by `framegraph avatar prepare --musetalk` on "
        f"{prep['when']} (nothing trained).\n\n"
        f"- Source video: `{src['video']}` ({src['width']}×{src['height']} as used; SHA-256 `{src['sha256']}`), its "
        f"first {len(avatar.frames) / avatar.fps:g} s at {avatar.fps:g} fps; face found in {prep['faces_found']} of "
        f"{len(avatar.frames)} frames.\n"
        f"- MuseTalk's files (the user's own; not copied): UNet `{f.unet_config}`, `{f.unet_weights}`; VAE "
        f"`{f.vae}`; Whisper `{f.whisper}`.\n"
        f"- The face box, crop and latents as MuseTalk 1.5 defines them; the blend mask from the face mesh's lower "
        f"face in place of MuseTalk's face parser.\n")


__all__ = ["FPS", "loop_frames", "prepare_musetalk"]
