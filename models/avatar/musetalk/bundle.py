"""A person prepared for MuseTalk: the loop frames, where the face is in each, how it blends back, its latents.

The bundle folder holds five files:

- ``avatar.json``: kind ``"musetalk"``. It records the fps, size, loop frames and idle range. It says where
  MuseTalk's files are.
- ``loop.mp4``: the loop frames in H.264, every frame kept. The video avatar plays them back and forth.
- ``faces.npz``: per loop frame, ``boxes`` ``int32 [N, 4]`` as x1, y1, x2, y2 and ``nearest_idle`` ``int64 [N]``.
  Each ``mask_<i>`` ``uint8 [h, w]`` is the blend mask of frame i's box.
- ``latents.pt``: ``float32 [N, 8, h, w]``. These are each loop face's masked and whole latents. The UNet reads
  them.
- ``PROVENANCE.md``: the source video's name and SHA-256, and MuseTalk's files. It says when and how the bundle
  was prepared.

The model files stay where the user keeps them. The bundle records their paths (:class:`~.files.MuseTalkFiles`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from framegraph.models import runtime
from framegraph.models.avatar.base import (
    AVATAR_JSON,
    AvatarError,
    AvatarStages,
    MatteInFolder,
    PictureSize,
    RunSettings,
    add_audio_side,
    load_json,
)
from framegraph.models.avatar.video.bundle import MATTE_FILE, _load_matte, _write_matte, write_loop
from framegraph.models.avatar.video.loop import VideoLoop
from framegraph.stream import Graph, Stage
from framegraph.stream.files import write_json

from .audio import ROWS
from .face import FACE_SIZE
from .files import MuseTalkFiles

KIND = "musetalk"
FORMAT = 1
LOOP, FACES, LATENTS = "loop.mp4", "faces.npz", "latents.pt"


@dataclass
class MuseTalkAvatar(PictureSize, MatteInFolder):
    """A prepared person. See the module docstring.

    Attributes:
        frames: ``uint8 [N, H, W, 3]``, the loop frames.
        boxes: ``int [N, 4]``, each frame's face box.
        masks: N ``uint8 [h, w]``, each box's blend mask.
        latents: ``float32 [N, 8, h', w']``, each face's masked and whole latents.
        idle: ``(a, b)``, the loop's calm stretch.
        nearest_idle: ``int [N]``, the idle frame most like each frame.
            See :class:`~framegraph.models.avatar.video.loop.LoopCursor`.
        matte: ``uint8 [N, H, W]``, the loop frames' person mattes, or None.
    """

    kind: ClassVar[str] = KIND
    MATTE_FILE: ClassVar[str] = MATTE_FILE
    vad: ClassVar[bool] = True
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
    matte: torch.Tensor | None = None
    engines_cache: dict = field(default_factory=dict, repr=False)  # what .engines and .onnx load or read once

    @property
    def portrait(self) -> torch.Tensor:
        """``uint8 [H, W, 3]``: the first frame of the idle range. It shows the avatar at rest."""
        return self.frames[self.idle[0]]

    @property
    def region_size(self) -> int:
        return FACE_SIZE

    def person_matte(self) -> torch.Tensor:
        """The loop frames' person mattes, ``uint8 [N, H, W]``. See :func:`~framegraph.models.matte.person_mattes`."""
        from framegraph.models.matte import person_mattes

        return person_mattes(self.frames)

    write_matte = staticmethod(_write_matte)  # (path, mattes): the MATTE_FILE format

    def export_onnx(self, out_dir: str) -> dict:
        """Write the ONNX files of the UNet step and the VAE decoder. See :func:`~.onnx.export_musetalk`."""
        from .onnx import export_musetalk

        return export_musetalk(self, out_dir)

    def add_stages(self, graph: Graph, source: Stage, settings: RunSettings) -> AvatarStages:
        """Add the avatar's stages to ``graph``, fed by ``source``.

        ``source`` feeds :class:`~.hearing.MuseTalkHearing`. It gives each frame's context and the speaking state.
        The state drives :class:`~framegraph.models.avatar.video.loop.VideoLoop`. It gives the loop frame and its
        index. Both feed :class:`~.stages.MuseTalkFace`, which draws the picture.

        The UNet and the VAE compute on ``settings.device``; see :mod:`.engines`. The audio side runs on the CPU.
        With ``settings.alpha``, the loop's mattes leave beside the picture. With ``settings.batching``, the step
        runs in the service's batches; see :func:`~.engines.batched_step`."""
        from .engines import MuseTalkEngines, batched_step, whisper_engine
        from .hearing import MuseTalkHearing
        from .stages import MuseTalkFace

        if settings.batching is not None:
            engines = MuseTalkEngines(batched_step(settings.batching, self, settings), whisper_engine(self),
                                      torch.float32)
        else:
            engines = runtime.engines("avatar-musetalk", settings.runtime, self, settings)
        mattes = self.required_matte() if settings.alpha else None
        vad = self.vad if settings.vad is None else settings.vad
        whisper = engines.whisper
        hearing = MuseTalkHearing(whisper, fps=self.fps, vad=vad)
        features, state = add_audio_side(graph, source, hearing, "cpu")
        xywh = np.concatenate([self.boxes[:, :2], self.boxes[:, 2:] - self.boxes[:, :2]], axis=1)
        loop = graph.add(VideoLoop(self.frames, xywh, self.idle, nearest_idle=self.nearest_idle, mattes=mattes,
                                   index=True, device=settings.device))
        face = graph.add(MuseTalkFace(self, engines.step, (ROWS * whisper.layers, whisper.width), dtype=engines.dtype,
                                      device=settings.device, out_device=settings.video_device,
                                      max_lag_ms=settings.max_lag_ms, matte=settings.alpha))
        graph.connect(state, loop, "state", "state", capacity=8)
        graph.connect(features, face, "features", "context", capacity=8)
        graph.connect(loop, face, "frame", "frame", capacity=2)
        graph.connect(loop, face, "index", "index", capacity=2)
        if settings.alpha:
            graph.connect(loop, face, "alpha", "alpha", capacity=2)
        return AvatarStages(features, state, face, {"loop": loop, "musetalk_face": face},
                            batched=settings.batching is not None)


def save_musetalk_avatar(root, avatar: MuseTalkAvatar) -> str:
    """Write ``avatar`` as a bundle folder and return its path. See the module docstring."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    write_loop(root / LOOP, avatar.frames, avatar.fps)
    np.savez_compressed(root / FACES, boxes=np.asarray(avatar.boxes, np.int32),
                        nearest_idle=np.asarray(avatar.nearest_idle, np.int64),
                        **{f"mask_{i}": m for i, m in enumerate(avatar.masks)})
    torch.save(avatar.latents.float().contiguous(), root / LATENTS)
    if avatar.matte is not None:
        _write_matte(root / MATTE_FILE, avatar.matte)
    f = avatar.files
    cfg = {"kind": KIND, "format": FORMAT, "fps": avatar.fps, "width": avatar.width, "height": avatar.height,
           "loop_frames": len(avatar.frames), "idle": list(avatar.idle),
           "musetalk": {"unet_config": str(f.unet_config), "unet_weights": str(f.unet_weights), "vae": str(f.vae),
                        "whisper": str(f.whisper)}, **avatar.meta}
    write_json(root / AVATAR_JSON, cfg)
    avatar.root = str(root)
    return str(root)


def load_musetalk_avatar(root, cfg: dict | None = None) -> MuseTalkAvatar:
    """The bundle at ``root``.

    Raises :class:`AvatarError` naming a missing or bad file. Raises :class:`~.files.MuseTalkError` when MuseTalk's
    files are no longer where the bundle says."""
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
    H, W = frames.shape[1:3]
    matte = _load_matte(root / MATTE_FILE, (n, H, W)) if (root / MATTE_FILE).is_file() else None
    return MuseTalkAvatar(files, frames, boxes, masks, latents, (int(cfg["idle"][0]), int(cfg["idle"][1])), nearest,
                          float(cfg["fps"]), meta, str(root), matte)


def describe(avatar: MuseTalkAvatar) -> str:
    """One line: what the bundle holds."""
    x1, y1, x2, y2 = (int(v) for v in np.median(avatar.boxes, axis=0))
    return (f"MuseTalk avatar: {len(avatar.frames)} loop frames ({len(avatar.frames) / avatar.fps:.1f} s) at "
            f"{avatar.width}x{avatar.height}, {avatar.fps:g} fps, face box ~{x2 - x1}x{y2 - y1} px, idle frames "
            f"{avatar.idle[0]}-{avatar.idle[1] - 1}")


__all__ = ["FACES", "FORMAT", "KIND", "LATENTS", "LOOP", "MuseTalkAvatar", "describe", "load_musetalk_avatar",
           "save_musetalk_avatar"]

