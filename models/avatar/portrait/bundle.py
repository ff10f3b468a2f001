"""The portrait avatar bundle, ``kind: "portrait"``, the default.

It is one folder holding everything a talking still portrait needs. This module also holds the stages it adds
to an avatar graph. The folder holds::

    DIR/avatar.json      portrait file, crop (face) box, mouth box, region size, fps, chunk frames,
                         sampler steps / shift, latent normalisation, VAD on/off
    DIR/portrait.png     the full-resolution background the generated face region is pasted into
    DIR/matte.png        the person matte of the portrait (8-bit grey: 255 the person, 0 the background;
                         :mod:`framegraph.models.matte`); bundles made before mattes have none
    DIR/vae/             VideoVAE      (diffusers save_pretrained folder)
    DIR/dit/             AvatarDiT     (diffusers save_pretrained folder)
    DIR/audio/           AudioEncoder  (diffusers save_pretrained folder)

:func:`load_portrait_avatar` checks every piece. It raises :class:`~..base.AvatarError` naming the missing or
bad file. ``save_avatar(DIR, avatar)`` writes it, atomically per file. ``random_avatar(...)`` makes a tiny,
randomly initialised bundle. It is for tests and smoke runs. It exercises the whole graph, but it does not
talk well.

Its stages come from :meth:`PortraitAvatar.add_stages`: ``features → Denoiser → VAEDecode → Composite``. Their
engines come from the runtime registry, :mod:`framegraph.models.runtime`, as model ``"avatar-portrait"``. Torch
and ONNX Runtime are in :mod:`.engines`. The compiled engines are in :mod:`.compiled`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from framegraph.models import runtime
from framegraph.models.audio import AudioEncoder, AudioFeatures, default_encoder
from framegraph.models.composite import Composite
from framegraph.models.dit import AvatarDiT, Denoiser
from framegraph.models.matte import person_matte
from framegraph.models.synth import astronaut_portrait
from framegraph.models.vae import VAEDecode, VideoVAE, crop_frames, face_crop_box, uint8_to_frames
from framegraph.stream import Graph, Stage
from framegraph.stream.files import write_json, written_whole

from ..base import (
    AVATAR_JSON,
    AvatarError,
    AvatarStages,
    MatteInFolder,
    PictureSize,
    RunSettings,
    add_audio_side,
    load_part,
    read_matte_png,
    write_matte_png,
)
from .engines import batched_engines, export_batches
from .onnx import export_avatar

FORMAT_VERSION = 1
PORTRAIT_FILE = "portrait.png"
MATTE_FILE = "matte.png"
PARTS = ("vae", "dit", "audio")

# The ``tiny`` VAE of the tests / CPU runs: 4 (patch) · 2 · 2 = 16x spatial compression.
TINY_VAE = dict(block_out_channels=(16, 32, 32), patch_size=4, latent_channels=4, norm_groups=4, temporal_from_level=0)
SMALL_VAE = dict(block_out_channels=(32, 64, 64), patch_size=4, latent_channels=8, norm_groups=8, temporal_from_level=1)


@dataclass
class PortraitAvatar(PictureSize, MatteInFolder):
    """A loaded portrait bundle; an :class:`~..base.AvatarBundle`. See the module docstring.

    Attributes:
        vae / dit / audio: the three models, in eval mode, on the CPU until moved.
        portrait: ``uint8 [H, W, 3]`` background frame.
        crop_box: ``(x, y, s, s)`` px of the portrait. The model's square region comes from there and goes back.
        mouth_box: ``(x, y, w, h)`` px of the portrait around the lips at rest. For eval; may be None.
        region_size: side of the generated region in px. It is the VAE's frame size.
        fps, chunk_frames, steps, shift: stream settings of the Denoiser.
        vad: use the Silero VAD for the speaking state.
        matte: ``uint8 [H, W]``, the person matte of the portrait from ``matte.png``. None in an older bundle.
        meta: everything else found in avatar.json, such as the training report and provenance.
    """

    vae: VideoVAE
    dit: AvatarDiT
    audio: AudioEncoder
    portrait: torch.Tensor
    crop_box: tuple[int, int, int, int]
    region_size: int
    mouth_box: tuple[float, float, float, float] | None = None
    fps: float = 25.0
    chunk_frames: int = 1
    steps: int = 2
    shift: float = 1.0
    vad: bool = True
    matte: torch.Tensor | None = None
    meta: dict = field(default_factory=dict)
    root: str | None = None
    _reference: torch.Tensor | None = None
    kind: ClassVar[str] = "portrait"
    MATTE_FILE: ClassVar[str] = MATTE_FILE

    @property
    def latent_size(self) -> int:
        return self.region_size // self.vae.spatial_compression

    def region(self, frames: torch.Tensor | None = None) -> torch.Tensor:
        """The face region ``uint8 [T, S, S, 3]`` cut from ``frames [T, H, W, 3]``. Default: the portrait."""
        frames = self.portrait[None] if frames is None else frames
        return crop_frames(frames, self.crop_box, self.region_size)

    @torch.no_grad()
    def reference_latent(self) -> torch.Tensor:
        """``float32 [C, h, w]``: the portrait's face region encoded by the VAE. It is the identity."""
        if self._reference is None:
            x = uint8_to_frames(self.region()).transpose(0, 1)[None]  # [1, 3, 1, S, S]
            z, _ = self.vae.encode(x.to(self.vae.device))
            self._reference = z[0, :, 0].float().cpu()
        return self._reference

    def settings(self) -> dict:
        """The avatar.json content, without the meta block."""
        c = self.vae.config
        return {"format_version": FORMAT_VERSION, "portrait": PORTRAIT_FILE,
                "size": [self.width, self.height], "face_box": [int(v) for v in self.crop_box],
                "mouth_box": None if self.mouth_box is None else [round(float(v), 2) for v in self.mouth_box],
                "region_size": int(self.region_size), "fps": float(self.fps), "chunk_frames": int(self.chunk_frames),
                "steps": int(self.steps), "shift": float(self.shift), "vad": bool(self.vad),
                "latent_norm": {"mean": c.latent_mean, "std": c.latent_std}}

    def composite(self, device: str = "cpu", alpha: bool = False, out_device: str | None = None) -> Composite:
        """The :class:`~framegraph.models.composite.Composite` stage that pastes the region into the portrait.

        Its default mask is a feathered ellipse. Its picture goes to ``out_device``, by default ``device``.
        ``alpha``: it also sends the portrait's matte on an ``"alpha"`` port. Without a matte in the bundle
        that raises :class:`~..base.AvatarError`."""
        matte = self.required_matte() if alpha else None
        return Composite(self.portrait, self.crop_box, region_size=self.region_size, device=device, alpha=matte,
                         out_device=out_device)

    def person_matte(self) -> torch.Tensor:
        """The portrait's person matte, ``uint8 [H, W]`` (:func:`~framegraph.models.matte.person_matte`)."""
        return person_matte(self.portrait)

    write_matte = staticmethod(write_matte_png)  # (path, matte): the MATTE_FILE format, an 8-bit grey PNG

    def export_onnx(self, out_dir: str) -> dict:
        """The ONNX export of the three models (:func:`~.onnx.export_avatar`)."""
        return export_avatar(self, out_dir)

    def add_stages(self, graph: Graph, source: Stage, settings: RunSettings) -> AvatarStages:
        """Add the portrait's stages, each model on its ``settings.runtime`` engine.

        The chain is ``source`` → :class:`~framegraph.models.audio.AudioFeatures` →
        :class:`~framegraph.models.dit.Denoiser` → :class:`~framegraph.models.vae.VAEDecode` →
        :class:`~framegraph.models.composite.Composite`. The Composite pastes the face region into the portrait.
        With ``settings.alpha`` it also sends the portrait's matte. ``settings.batching``: the DiT and the VAE
        decoder run in batches with other sessions' (:func:`~.engines.batched_engines`)."""
        if settings.alpha:
            self.required_matte()
        engines = runtime.engines("avatar-portrait", settings.runtime, self, settings)
        batched = settings.batching is not None and export_batches(self, settings)
        dit, vae = batched_engines(settings.batching, self, settings) if batched else (engines.dit, engines.vae)
        vad = self.vad if settings.vad is None else settings.vad
        features, state = add_audio_side(graph, source, AudioFeatures(self.audio, fps=self.fps, vad=vad,
                                                                      device=settings.device, engine=engines.audio),
                                         settings.device)
        budget_ms = settings.budget_ms
        if budget_ms is None and settings.live:
            budget_ms = 1000.0 * self.chunk_frames / self.fps  # a chunk in the time it lasts
        den = graph.add(Denoiser(self.dit, self.reference_latent(), steps=settings.steps or self.steps,
                                 shift=self.shift, chunk_frames=self.chunk_frames, seed=settings.seed,
                                 budget_ms=budget_ms, device=settings.device, torch_threads=settings.torch_threads,
                                 max_lag_ms=settings.max_lag_ms, engine=dit))
        dec = graph.add(VAEDecode(self.vae, size=self.region_size, chunk_frames=self.chunk_frames, fps=self.fps,
                                  device=settings.device, reference=self.region()[0], engine=vae))
        comp = graph.add(self.composite(settings.device, alpha=settings.alpha, out_device=settings.video_device))
        graph.connect(features, den, "features", "features", capacity=8)
        graph.connect(state, den, "state", "state", capacity=8)
        graph.connect(den, dec, "latent", "latent", capacity=2)
        graph.connect(dec, comp, "face", "face", capacity=max(2, self.chunk_frames + 1))
        return AvatarStages(features, state, comp, {"denoiser": den, "decode": dec, "composite": comp},
                            batched=batched)


def load_portrait_avatar(root, cfg: dict) -> PortraitAvatar:
    """The portrait bundle at ``root`` whose ``avatar.json`` is ``cfg``.

    The loader, :func:`~..bundle.load_avatar`, reads the file and picks the kind. The error,
    :class:`~..base.AvatarError`, names the missing or bad file."""
    from PIL import Image

    root = Path(root)
    where = f"avatar bundle {str(root)!r}: {AVATAR_JSON}"
    for key in ("portrait", "face_box", "region_size"):
        if key not in cfg:
            raise AvatarError(f"{where} has no {key!r}")
    image_path = root / str(cfg["portrait"])
    if not image_path.is_file():
        raise AvatarError(f"avatar bundle {str(root)!r}: the portrait {cfg['portrait']!r} named in {AVATAR_JSON} "
                          f"is missing")
    try:
        with Image.open(image_path) as im:
            portrait = torch.from_numpy(np.array(im.convert("RGB")))
    except OSError as exc:
        raise AvatarError(f"avatar bundle {str(root)!r}: the portrait {cfg['portrait']!r} is not an image ({exc})") \
            from None
    vae = load_part(root, "vae", VideoVAE)
    dit = load_part(root, "dit", AvatarDiT)
    audio = load_part(root, "audio", AudioEncoder)
    try:
        box = tuple(int(v) for v in cfg["face_box"])
        size = int(cfg["region_size"])
        assert len(box) == 4 and box[2] == box[3] and box[2] > 0
    except (TypeError, ValueError, AssertionError):
        raise AvatarError(f"{where}: face_box {cfg.get('face_box')!r} must be a square [x, y, s, s] box") from None
    H, W = portrait.shape[:2]
    if box[0] < 0 or box[1] < 0 or box[0] + box[2] > W or box[1] + box[3] > H:
        raise AvatarError(f"{where}: face_box {list(box)} lies outside the {W}x{H} portrait")
    if size % vae.spatial_compression:
        raise AvatarError(f"{where}: region_size {size} is not a multiple of the VAE's compression "
                          f"{vae.spatial_compression}")
    if vae.latent_channels != dit.config.latent_channels:
        raise AvatarError(f"avatar bundle {str(root)!r}: vae/ makes {vae.latent_channels}-channel latents but dit/ "
                          f"takes {dit.config.latent_channels}")
    if audio.feature_dim != dit.config.audio_dim:
        raise AvatarError(f"avatar bundle {str(root)!r}: audio/ gives {audio.feature_dim}-d features but dit/ takes "
                          f"{dit.config.audio_dim}")
    norm = cfg.get("latent_norm") or {}
    if vae.config.latent_mean is None and norm.get("mean") is not None:
        vae.set_latent_stats(norm["mean"], norm["std"])
    chunk = int(cfg.get("chunk_frames", dit.config.frames_per_block))
    if chunk < 1 or chunk % dit.config.frames_per_block or chunk > 4:
        raise AvatarError(f"{where}: chunk_frames {chunk} must be 1..4 and a multiple of the DiT's frames_per_block "
                          f"{dit.config.frames_per_block}")
    matte = read_matte_png(root / MATTE_FILE, (H, W)) if (root / MATTE_FILE).is_file() else None
    known = {"format_version", "portrait", "size", "face_box", "mouth_box", "region_size", "fps", "chunk_frames",
             "steps", "shift", "vad", "latent_norm"}
    mouth = cfg.get("mouth_box")
    return PortraitAvatar(vae=vae, dit=dit, audio=audio, portrait=portrait, crop_box=box, region_size=size,
                  mouth_box=None if mouth is None else tuple(float(v) for v in mouth),
                  fps=float(cfg.get("fps", 25.0)), chunk_frames=chunk, steps=int(cfg.get("steps", 2)),
                  shift=float(cfg.get("shift", 1.0)), vad=bool(cfg.get("vad", True)), matte=matte,
                  meta={k: v for k, v in cfg.items() if k not in known}, root=str(root))


def save_avatar(root, avatar: PortraitAvatar) -> str:
    """Write ``avatar`` as a bundle folder, created; returns its path."""
    from PIL import Image

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        getattr(avatar, part).save_pretrained(root / part)
    with written_whole(root / PORTRAIT_FILE) as tmp:
        Image.fromarray(avatar.portrait.cpu().numpy()).save(tmp)
    if avatar.matte is not None:
        write_matte_png(root / MATTE_FILE, avatar.matte)
    data = {**avatar.settings(), **avatar.meta}
    write_json(root / AVATAR_JSON, data)
    avatar.root = str(root)
    return str(root)


def random_avatar(*, portrait: torch.Tensor | np.ndarray | None = None, crop_box=None, mouth_box=None,
                  region_size: int = 64, fps: float = 25.0, chunk_frames: int = 1, steps: int = 1, seed: int = 0,
                  vad: bool = False, vae_config: dict | None = None, dit_config: dict | None = None) -> PortraitAvatar:
    """A tiny randomly initialised avatar, for tests of the plumbing. The default portrait is the astronaut."""

    if portrait is None:
        p = astronaut_portrait()
        portrait, crop_box = p.image, crop_box or face_crop_box(p.image.shape[:2], p.face_box, p.mouth_box)
        mouth_box = mouth_box or p.mouth_box
    portrait = torch.as_tensor(np.array(portrait, dtype=np.uint8, copy=True))
    if crop_box is None:
        s = min(portrait.shape[:2])
        crop_box = ((portrait.shape[1] - s) // 2, (portrait.shape[0] - s) // 2, s, s)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = VideoVAE(**{**TINY_VAE, "sample_size": region_size, **(vae_config or {})}).eval()
        dit = AvatarDiT(**{"latent_channels": vae.latent_channels,
                           "sample_size": region_size // vae.spatial_compression, "width": 32, "depth": 2, "heads": 2,
                           "audio_past_frames": 1, "backend": "torch", **(dit_config or {})}).eval()
    audio = default_encoder(seed)
    return PortraitAvatar(vae=vae, dit=dit, audio=audio, portrait=portrait, crop_box=tuple(int(v) for v in crop_box),
                  region_size=region_size, mouth_box=None if mouth_box is None else tuple(mouth_box), fps=fps,
                  chunk_frames=chunk_frames, steps=steps, vad=vad)


__all__ = ["PortraitAvatar", "load_portrait_avatar", "save_avatar", "random_avatar", "TINY_VAE", "SMALL_VAE",
           "PORTRAIT_FILE", "MATTE_FILE", "FORMAT_VERSION"]
