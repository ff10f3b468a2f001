"""A person prepared for MuseTalk: the loop frames, where the face is in each, how it blends back, its latents.

    BUNDLE/avatar.json    kind "musetalk"; fps, size, loop frames, the idle range; where MuseTalk's files are
    BUNDLE/loop.mp4       the loop frames (H.264, every frame kept), played back and forth as the video avatar's
    BUNDLE/faces.npz      per loop frame: ``boxes`` int32 [N, 4] (x1, y1, x2, y2), ``nearest_idle`` int64 [N],
                          ``mask_<i>`` uint8 [h, w] (the blend mask of frame i's box)
    BUNDLE/latents.pt     float32 [N, 8, h, w]: each loop face's masked and whole latents (what the UNet reads)
    BUNDLE/PROVENANCE.md  the source video (name, SHA-256), MuseTalk's files, when and how it was prepared

The model files stay where the user keeps them; the bundle records their paths (:class:`~.files.MuseTalkFiles`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from framegraph.models.avatar.base import AVATAR_JSON, AvatarError, PictureSize, load_json
from framegraph.models.avatar.video.bundle import write_loop
from framegraph.stream.files import write_json

from .files import MuseTalkFiles

KIND = "musetalk"
FORMAT = 1
LOOP, FACES, LATENTS = "loop.mp4", "faces.npz", "latents.pt"


@dataclass
class MuseTalkAvatar(PictureSize):
    """A prepared person (see the module docstring). ``frames`` ``uint8 [N, H, W, 3]``; ``boxes`` ``int [N, 4]``;
    ``masks`` N ``uint8 [h, w]``; ``latents`` ``float32 [N, 8, h', w']``; ``idle`` ``(a, b)`` the loop's calm
    stretch and ``nearest_idle`` ``int [N]`` the idle frame most like each (:class:`~framegraph.models.avatar.video.
    loop.LoopCursor`)."""

    kind = KIND
    files: MuseTalkFiles
    frames: torch.Tensor
    boxes: np.ndarray
    masks: list[np.ndarray]
    latents: torch.Tensor
    idle: tuple[int, int]
    nearest_idle: np.ndarray
    fps: float
    meta: dict = field(default_factory=dict)
    root: str | None = None

    @property
    def portrait(self) -> torch.Tensor:
        """``uint8 [H, W, 3]``: the first frame of the idle range (the avatar at rest)."""
        return self.frames[self.idle[0]]


def save_musetalk_avatar(root, avatar: MuseTalkAvatar) -> str:
    """Write ``avatar`` as a bundle folder (see the module docstring); returns its path."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    write_loop(root / LOOP, avatar.frames, avatar.fps)
    np.savez_compressed(root / FACES, boxes=np.asarray(avatar.boxes, np.int32),
                        nearest_idle=np.asarray(avatar.nearest_idle, np.int64),
                        **{f"mask_{i}": m for i, m in enumerate(avatar.masks)})
    torch.save(avatar.latents.float().contiguous(), root / LATENTS)
    f = avatar.files
    cfg = {"kind": KIND, "format": FORMAT, "fps": avatar.fps, "width": avatar.width, "height": avatar.height,
           "loop_frames": len(avatar.frames), "idle": list(avatar.idle),
           "musetalk": {"unet_config": str(f.unet_config), "unet_weights": str(f.unet_weights), "vae": str(f.vae),
                        "whisper": str(f.whisper)}, **avatar.meta}
    write_json(root / AVATAR_JSON, cfg)
    avatar.root = str(root)
    return str(root)


def load_musetalk_avatar(root, cfg: dict | None = None) -> MuseTalkAvatar:
    """The bundle at ``root``; :class:`AvatarError` names a missing or bad file, and MuseTalk's files where they are
    no longer (:class:`~.files.MuseTalkError`)."""
    from framegraph.stream.media import read_video

    root = Path(root)
    cfg = load_json(root / AVATAR_JSON) if cfg is None else cfg
    if cfg.get("kind") != KIND:
        raise AvatarError(f"{str(root)!r}: {AVATAR_JSON} is of kind {cfg.get('kind')!r}, not {KIND!r}")
    if cfg.get("format") != FORMAT:
        raise AvatarError(f"{str(root)!r}: a {KIND} bundle of format {cfg.get('format')!r}; this framegraph reads "
                          f"format {FORMAT} (prepare it again: `framegraph avatar prepare --musetalk`)")
    paths = cfg["musetalk"]
    files = MuseTalkFiles.find(unet_config=paths["unet_config"], unet_weights=paths["unet_weights"],
                               vae=paths["vae"], whisper=paths["whisper"])
    for name in (LOOP, FACES, LATENTS):
        if not (root / name).is_file():
            raise AvatarError(f"{str(root)!r}: {name} is missing (prepare the bundle again)")
    frames = torch.from_numpy(read_video(root / LOOP)["frames"])
    with np.load(root / FACES) as faces:
        boxes, nearest = faces["boxes"], faces["nearest_idle"]
        masks = [faces[f"mask_{i}"] for i in range(len(boxes))]
    latents = torch.load(root / LATENTS, map_location="cpu", weights_only=True)
    n = int(cfg["loop_frames"])
    if not len(frames) == len(boxes) == len(latents) == n:
        raise AvatarError(f"{str(root)!r}: {len(frames)} loop frames, {len(boxes)} boxes and {len(latents)} latents; "
                          f"{AVATAR_JSON} says {n} (prepare the bundle again)")
    known = {"kind", "format", "fps", "width", "height", "loop_frames", "idle", "musetalk"}
    meta = {k: v for k, v in cfg.items() if k not in known}
    return MuseTalkAvatar(files, frames, boxes, masks, latents, (int(cfg["idle"][0]), int(cfg["idle"][1])), nearest,
                          float(cfg["fps"]), meta, str(root))


def describe(avatar: MuseTalkAvatar) -> str:
    """One line: what the bundle holds."""
    x1, y1, x2, y2 = (int(v) for v in np.median(avatar.boxes, axis=0))
    return (f"MuseTalk avatar: {len(avatar.frames)} loop frames ({len(avatar.frames) / avatar.fps:.1f} s) at "
            f"{avatar.width}x{avatar.height}, {avatar.fps:g} fps, face box ~{x2 - x1}x{y2 - y1} px, idle frames "
            f"{avatar.idle[0]}-{avatar.idle[1] - 1}")


__all__ = ["FACES", "FORMAT", "KIND", "LATENTS", "LOOP", "MuseTalkAvatar", "describe", "load_musetalk_avatar",
           "save_musetalk_avatar"]

