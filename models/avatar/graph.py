"""The avatar's stream graph: audio in, full-resolution talking portrait (and the audio) out.

    audio source ──audio──▶ AudioFeatures ──features──────────────────▶ Denoiser ──latent──▶ VAEDecode
        │                                └──state──▶ StateOverride ──state──▶                 │ face
        │                                                                                     ▼
        └───────────────────────────────────────audio─────────────────▶ sink ◀──video── Composite

That is the still portrait (bundle kind ``"portrait"``). A video avatar (kind ``"video"``, the person's
own frames looped) swaps the middle: features → MouthShape, state → VideoLoop, both → MouthRegion ──video──▶
sink (:mod:`.video_stages`); :func:`build_avatar_graph` picks by the bundle's kind.

Audio pts are the master: ``AudioFeatures`` stamps video frame ``k`` with ``clock.ticks_from_frame(k, fps)``
counted from audio samples, every later stage keeps those pts, and the sink muxes by pts — so the
video is in sync with the echoed audio however long each stage takes. A stream of ``S`` samples makes
``ceil(S · fps / 16000)`` frames (with ``chunk_frames = 1``; larger chunks round the last one up).

    from framegraph.models.avatar import load_avatar, build_avatar_graph
    from framegraph.stream.media import AudioFileSource
    ag = build_avatar_graph(load_avatar("assets/avatars/astronaut"), AudioFileSource("speech.wav"), out="talk.mp4")
    ag.graph.run()
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import torch

from framegraph.models.audio import IDLE, LISTENING, SPEAKING, STATE_DIM, AudioFeatures
from framegraph.models.composite import Composite
from framegraph.models.dit import Denoiser
from framegraph.models.vae import VAEDecode
from framegraph.stream import Clock, Graph, PortSpec, Stage
from framegraph.stream.media import AudioFileSource, MP4Sink, ScaleVideo, decode_audio

from .bundle import Avatar, load_avatar

STATE_MODES = ("auto", "speaking", "listening", "idle")
# where the three model stages compute (see models/onnx); onnx-int8: the models the export keeps in int8
# (framegraph export --int8, models/onnx/quantize.py) run int8, the others float32
BACKENDS = ("torch", "onnx", "onnx-int8")
# Live streams: a frame with a newer one waiting behind it, or whose audio arrived longer ago than this, is
# skipped rather than generated late, so a machine slower than the stream shows fewer frames per second, each
# from the freshest audio, never a growing delay (``max_lag_ms``, ``Stage.stale``).
LIVE_MAX_LAG_MS = 250.0


class StateOverride(Stage):
    """Passes the speaking-state vector through, or replaces it: ``mode`` ``"auto"`` (the VAD's state),
    ``"speaking"`` / ``"listening"`` / ``"idle"`` (forced; the VAD's speech probability is kept).
    :meth:`set_mode` may be called from any thread; it shows from the next frame."""

    def __init__(self, *, device: str = "cpu", mode: str = "auto", name: str = "state"):
        super().__init__(name)

        self.inputs = {"state": PortSpec((STATE_DIM,), torch.float32, device)}
        self.outputs = {"state": PortSpec((STATE_DIM,), torch.float32, device)}
        self._lock = threading.Lock()
        self.mode = "auto"
        self.set_mode(mode)

    def set_mode(self, mode: str) -> None:
        if mode not in STATE_MODES:
            raise ValueError(f"StateOverride: mode {mode!r}; expected one of {STATE_MODES}")
        with self._lock:
            self.mode = mode

    def process(self, inputs, out):

        src = inputs["state"].data
        f = out.write("state")
        f.data.copy_(src)
        with self._lock:
            mode = self.mode
        if mode != "auto":
            f.data[:3] = 0.0
            f.data[{"idle": IDLE, "speaking": SPEAKING, "listening": LISTENING}[mode]] = 1.0


@dataclass
class AvatarGraph:
    """What :func:`build_avatar_graph` made: the graph and its stages (``sink`` / ``audio_sink`` may be
    None when the caller connects the outputs). ``denoiser`` / ``decode`` / ``composite`` are the
    generating stages: Denoiser, VAEDecode, Composite for a portrait bundle; MouthShape, VideoLoop,
    MouthRegion for a video bundle — ``composite`` is always the one with the ``"video"`` output."""

    graph: Graph
    source: Stage
    features: Stage
    state: StateOverride
    denoiser: Stage
    decode: Stage
    composite: Stage
    sink: Stage | None
    audio_sink: Stage | None

    def set_state(self, mode: str) -> None:
        """``auto`` (VAD) or a forced ``speaking`` / ``listening`` / ``idle``."""
        self.state.set_mode(mode)
        self.features.set_listening(mode == "listening")


def avatar_composite(avatar: Avatar, device: str = "cpu"):
    """The :class:`~framegraph.models.composite.Composite` stage that pastes the avatar's generated region
    into its portrait (default feathered ellipse)."""

    return Composite(avatar.portrait, avatar.crop_box, region_size=avatar.region_size, device=device)


def default_onnx_dir(avatar: Avatar) -> str:
    """Where ``framegraph export`` puts a bundle's ONNX files by default: ``<bundle>/onnx``."""
    if avatar.root is None:
        raise ValueError("the avatar was not loaded from a folder; pass onnx_dir= (the output of framegraph export)")
    return os.path.join(avatar.root, "onnx")


def _portrait_models(avatar: Avatar, *, backend: str, onnx_dir: str | None, vad: bool, steps, budget_ms, seed,
                     device, torch_threads, max_lag_ms) -> tuple[Stage, Stage, Stage]:
    """A portrait bundle's AudioFeatures, Denoiser and VAEDecode, computing on torch or ONNX Runtime."""
    den_args = dict(steps=steps or avatar.steps, shift=avatar.shift, chunk_frames=avatar.chunk_frames, seed=seed,
                    budget_ms=budget_ms, device=device, torch_threads=torch_threads, max_lag_ms=max_lag_ms)
    dec_args = dict(size=avatar.region_size, chunk_frames=avatar.chunk_frames, fps=avatar.fps, device=device,
                    reference=avatar.region()[0])
    if backend in ("onnx", "onnx-int8"):
        from framegraph.models.onnx.stages import onnx_stages

        return onnx_stages(avatar, onnx_dir or default_onnx_dir(avatar), fps=avatar.fps, vad=vad,
                           denoiser=den_args, decode=dec_args, threads=torch_threads, int8=backend == "onnx-int8")
    return (AudioFeatures(avatar.audio, fps=avatar.fps, vad=vad, device=device),
            Denoiser(avatar.dit, avatar.reference_latent(), **den_args), VAEDecode(avatar.vae, **dec_args))


def _portrait_stages(g: Graph, avatar: Avatar, feats: Stage, state: Stage, den: Stage, dec: Stage, *,
                     device) -> tuple[Stage, Stage, Stage]:
    """The still portrait's generation: Denoiser → VAEDecode → Composite (added to ``g`` and connected)."""
    den, dec = g.add(den), g.add(dec)
    comp = g.add(avatar_composite(avatar, device))
    g.connect(feats, den, "features", "features", capacity=8)
    g.connect(state, den, "state", "state", capacity=8)
    g.connect(den, dec, "latent", "latent", capacity=2)
    g.connect(dec, comp, "face", "face", capacity=max(2, avatar.chunk_frames + 1))
    return den, dec, comp


def _video_stages(g: Graph, avatar, feats: Stage, state: Stage, *, torch_threads,
                  max_lag_ms) -> tuple[Stage, Stage, Stage]:
    """The video avatar's generation (CPU): MouthShape, VideoLoop → MouthRegion (added and connected)."""
    from .loop import VideoLoop
    from .video_stages import MouthRegion, MouthShape

    shape = g.add(MouthShape(avatar.shape_head, avatar.rest_shape, gate=avatar.silence_gate))
    loop = g.add(VideoLoop(avatar.frames, avatar.boxes, avatar.idle, nearest_idle=avatar.nearest_idle))
    region = g.add(MouthRegion.for_avatar(avatar, max_lag_ms=max_lag_ms, torch_threads=torch_threads))
    g.connect(feats, shape, "features", "features", capacity=8)
    g.connect(state, shape, "state", "state", capacity=8)
    g.connect(state, loop, "state", "state", capacity=8)
    g.connect(loop, region, "frame", "frame", capacity=2)
    g.connect(loop, region, "box", "box", capacity=2)
    g.connect(shape, region, "shape", "shape", capacity=4)
    return shape, loop, region


def build_avatar_graph(avatar: Avatar, audio_source: Stage, sink: Stage | None = None, *, out: str | None = None,
                       audio_sink: Stage | None | bool = True, graph: Graph | None = None, clock: str = "fast",
                       device: str = "cpu", steps: int | None = None, vad: bool | None = None,
                       budget_ms: float | None = None, max_in_flight: int | None = 8, seed: int = 0,
                       preset: str = "offline", torch_threads: int | None = None, video_policy: str = "block",
                       max_lag_ms: float | None = None, backend: str = "torch", onnx_dir: str | None = None,
                       name: str = "avatar") -> AvatarGraph:
    """Build the avatar graph around ``audio_source`` (``AudioFileSource`` / ``PushAudioSource`` or any
    stage with an ``"audio"`` ``int16 [320]`` output).

    One builder for both bundle kinds: a portrait (Denoiser → VAEDecode → Composite) or a video avatar
    (MouthShape, VideoLoop → MouthRegion, see :mod:`.video_stages`); the audio side and the sinks are the same.

    Args:
        avatar: a loaded bundle (:func:`~.bundle.load_avatar`), either kind.
        sink: the stage the composited ``"video"`` goes to (an MP4Sink, an encoder...); None with ``out``:
            an ``MP4Sink(out)`` at the portrait's size with the audio; None without ``out``: the caller
            connects ``composite`` itself.
        audio_sink: where the source's audio is echoed (its ``"audio"`` input): True = ``sink`` when it has
            an audio input, a stage, or None / False for no echo.
        graph: add to this graph (default: a new one on ``Clock(clock)``).
        steps / vad: override the bundle's sampler steps / VAD setting.
        budget_ms: the Denoiser's per-chunk budget (fallbacks to fewer steps when over it).
        max_in_flight: bound on frames between the source and the sinks.
        video_policy: ring policy into ``sink`` (``"drop_oldest"`` for a live encoder).
        max_lag_ms: live (realtime clock): the Denoiser skips frames whose audio is older than this, so a
            machine slower than the stream keeps a bounded delay at a lower frame rate (None: off).
        backend: ``"torch"``, or ``"onnx"``: the audio encoder, Denoiser and decoder run on ONNX Runtime (CPU)
            from the export in ``onnx_dir`` (default ``<bundle>/onnx``; made by ``framegraph export``);
            ``"onnx-int8"``: the same, the models the export keeps in int8 (``framegraph export --int8``)
            running their int8 files.
    """

    video_kind = getattr(avatar, "kind", "portrait") == "video"
    if backend not in BACKENDS:
        raise ValueError(f"build_avatar_graph: backend={backend!r}; expected one of {BACKENDS}")
    if video_kind and backend != "torch":
        raise ValueError(f"build_avatar_graph: backend={backend!r} is for portrait bundles; a video avatar runs "
                         "its small models on torch")
    if video_kind:
        device = "cpu"  # the video avatar's small models run on the CPU (its loop frames live there)
    g = graph if graph is not None else Graph(Clock(clock), name=name)
    src = audio_source if audio_source in g.stages else g.add(audio_source, max_in_flight=max_in_flight)
    use_vad = avatar.vad if vad is None else vad
    if video_kind:
        models = (AudioFeatures(avatar.audio, fps=avatar.fps, vad=use_vad, device=device),)
    else:
        models = _portrait_models(avatar, backend=backend, onnx_dir=onnx_dir, vad=use_vad, steps=steps,
                                  budget_ms=budget_ms, seed=seed, device=device, torch_threads=torch_threads,
                                  max_lag_ms=max_lag_ms)
    feats = g.add(models[0])
    state = g.add(StateOverride(device=device))
    g.connect(src, feats, "audio", "audio", capacity=8)
    g.connect(feats, state, "state", "state", capacity=8)
    if video_kind:
        den, dec, comp = _video_stages(g, avatar, feats, state, torch_threads=torch_threads, max_lag_ms=max_lag_ms)
    else:
        den, dec, comp = _portrait_stages(g, avatar, feats, state, *models[1:], device=device)
    if sink is None and out is not None:
        sink = g.add(MP4Sink(out, width=avatar.width, height=avatar.height, fps=avatar.fps,
                             audio_rate=16_000 if audio_sink else None, preset=preset))
    if sink is not None:
        if sink not in g.stages:
            g.add(sink)
        g.connect(comp, sink, "video", "video", capacity=4, policy=video_policy)
    if audio_sink is True:
        audio_sink = sink if sink is not None and "audio" in sink.inputs else None
    if audio_sink:
        if audio_sink not in g.stages:
            g.add(audio_sink)
        g.connect(src, audio_sink, "audio", "audio", capacity=8)
    return AvatarGraph(g, src, feats, state, den, dec, comp, sink, audio_sink or None)


def render_avatar_graph(avatar_dir, audio_path, out: str, *, device: str | None = None, steps: int | None = None,
                        preset: str = "offline", size: tuple[int, int] | None = None, backend: str = "torch",
                        onnx_dir: str | None = None) -> tuple[Graph, Stage, int]:
    """``framegraph render --avatar DIR --audio FILE --out FILE.mp4``: the offline graph (fast clock, MP4 with
    the audio), its sink and the number of frames it will write (for a progress bar). ``size`` (width,
    height): the video's size when it is not the portrait's — the composited picture scaled to fit, aspect
    kept (:class:`~framegraph.stream.media.ScaleVideo`). ``backend`` / ``onnx_dir``: see :func:`build_avatar_graph`."""
    import math



    device = device or ("cuda" if torch.cuda.is_available() and backend == "torch" else "cpu")
    avatar = load_avatar(avatar_dir)
    total = math.ceil(len(decode_audio(audio_path)) * avatar.fps / 16_000)
    source = AudioFileSource(audio_path)
    if size is None or tuple(size) == (avatar.width, avatar.height):
        ag = build_avatar_graph(avatar, source, out=out, device=device, steps=steps, preset=preset, backend=backend,
                                onnx_dir=onnx_dir)
        return ag.graph, ag.sink, total
    width, height = size
    sink = MP4Sink(out, width=width, height=height, fps=avatar.fps, audio_rate=16_000, preset=preset)
    ag = build_avatar_graph(avatar, source, audio_sink=sink, device=device, steps=steps, backend=backend,
                            onnx_dir=onnx_dir)
    scale = ag.graph.add(ScaleVideo(src_size=(avatar.width, avatar.height), size=(width, height)))
    ag.graph.connect(ag.composite, scale, "video", capacity=4)
    ag.graph.connect(scale, sink, "video")
    return ag.graph, sink, total


__all__ = ["StateOverride", "AvatarGraph", "build_avatar_graph", "render_avatar_graph", "STATE_MODES",
           "LIVE_MAX_LAG_MS", "avatar_composite", "BACKENDS", "default_onnx_dir"]
