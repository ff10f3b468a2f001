"""What every avatar bundle kind shares.

It holds the :class:`AvatarBundle` protocol the graph builder talks to. It holds the :class:`RunSettings` of
one run. It holds the bundle folder's own checks, of ``avatar.json`` and its model folders.

Several kinds implement the protocol. The still portrait is in :mod:`.portrait`. A DiT generates the face region of one
picture. The video avatar is in :mod:`.video`. The person's own frames are looped, and a small UNet redraws the mouth.
The graph builder, :func:`~.graph.build_avatar_graph`, builds the audio side and the sinks. It asks the bundle for the
stages in between. It never asks which kind it holds.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol, get_args

import numpy as np
import torch

from framegraph.models.audio import IDLE, LISTENING, SPEAKING, STATE_DIM
from framegraph.models.runtime import Runtime
from framegraph.stream import Graph, PortSpec, Stage
from framegraph.stream.files import written_whole

if TYPE_CHECKING:  # pragma: no cover - a run's model service
    from framegraph.stream.batching import ModelService

AVATAR_JSON = "avatar.json"
StateMode = Literal["auto", "speaking", "listening", "idle"]  # the speaking state: the VAD's, or one held
STATE_MODES: tuple[str, ...] = get_args(StateMode)
# Live streams: a frame with a newer one waiting behind it, or whose audio arrived longer ago than this, is
# skipped rather than generated late, so a machine slower than the stream shows fewer frames per second, each
# from the freshest audio, never a growing delay (``max_lag_ms``, ``Stage.stale``).
LIVE_MAX_LAG_MS = 250.0


class AvatarError(ValueError):
    """A bundle folder is missing a file or holds a bad one. The message names it."""


@dataclass(frozen=True)
class RunSettings:
    """How one run uses a bundle: what :func:`~.graph.build_avatar_graph` takes whole.

    Attributes:
        runtime: where the models compute; see :mod:`framegraph.models.runtime`. A kind's engines are listed
            there as model ``"avatar-<kind>"``. A kind refuses a runtime it lacks.
        device: where the torch models run and the ports live: "cpu", "cuda".
        vad: the speaking state from Silero VAD. None: the bundle's setting.
        steps: sampler steps of a kind that samples, such as the portrait's DiT with 1–4. None: the bundle's.
        live: a live stream on a realtime clock. Generation keeps up with the stream. Frames whose audio is older than
            ``max_lag_ms`` are skipped. A kind may trade quality for time. It then keeps each chunk within its own
            duration, unless ``budget_ms`` says otherwise. The portrait does it with fewer sampler steps.
        budget_ms: time one generated chunk may take before the stage falls back. None: no fallbacks. With
            ``live``, None means the chunk's own duration.
        seed: noise seed of a kind that samples.
        torch_threads: intra-op threads of the heavy stages' worker threads. None: torch's setting.
        max_lag_ms: live streams skip frames whose audio is older than this. None: none skipped. With ``live``,
            None means :data:`LIVE_MAX_LAG_MS`.
        onnx_dir: the ONNX export for the ``onnx`` runtimes. None: ``<bundle>/onnx``.
        alpha: the picture's stage also sends the person matte, frame for frame with ``"video"``. It is
            ``"alpha"`` ``uint8 [height, width]``, 255 on the person. A bundle without a matte is refused, by
            ``required_matte``.
        video_device: where the picture, the ``"video"`` output, goes. None: ``device``, or the graph's sink's;
            see :func:`~.graph.build_avatar_graph`. Use ``"cpu"`` for an encoder after a GPU run. The picture is
            then copied down without the GPU stages waiting.
        cuda_graphs: for runtime ``"compiled"``, replay the per-frame steps from CUDA graphs. None: on CUDA.
            False: the compiled code alone, to time the two apart.
        batching: a :class:`~framegraph.stream.batching.ModelService`. The heavy model runs in one batch with other
            sessions'. They share the bundle. It needs a kind with a batched engine. None: each session alone.
    """

    runtime: Runtime = "torch"
    device: str = "cpu"
    vad: bool | None = None
    steps: int | None = None
    live: bool = False
    budget_ms: float | None = None
    seed: int = 0
    torch_threads: int | None = None
    max_lag_ms: float | None = None
    onnx_dir: str | None = None
    alpha: bool = False
    video_device: str | None = None
    cuda_graphs: bool | None = None
    batching: ModelService | None = None

    def __post_init__(self):
        if self.live and self.max_lag_ms is None:  # the one place a live run gets its default lag
            object.__setattr__(self, "max_lag_ms", LIVE_MAX_LAG_MS)


class StateOverride(Stage):
    """Passes the speaking-state vector through, or replaces it.

    ``mode`` ``"auto"`` passes the VAD's state. ``"speaking"``, ``"listening"`` and ``"idle"`` force a state.
    The VAD's speech probability is kept. :meth:`set_mode` may be called from any thread. It shows from the
    next frame."""

    def __init__(self, *, device: str = "cpu", mode: StateMode = "auto", name: str = "state"):
        super().__init__(name)
        self.inputs = {"state": PortSpec((STATE_DIM,), torch.float32, device)}
        self.outputs = {"state": PortSpec((STATE_DIM,), torch.float32, device)}
        self._lock = threading.Lock()
        self.mode = "auto"
        self.set_mode(mode)

    def set_mode(self, mode: StateMode) -> None:
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
class AvatarStages:
    """What a bundle added to a graph with :meth:`AvatarBundle.add_stages`.

    First comes the audio side every kind has. ``features`` is an :class:`~framegraph.models.audio.AudioFeatures`,
    with ``"audio"`` in and ``"features"`` and ``"state"`` out. ``state`` is its :class:`StateOverride`. Then
    come the kind's own stages by name. ``video`` is the one of them with the ``"video"`` output,
    ``uint8 [height, width, 3]``. ``batched``: its models run in the model service's batches."""

    features: Stage
    state: StateOverride
    video: Stage
    stages: dict[str, Stage] = field(default_factory=dict)
    batched: bool = False


def add_audio_side(graph: Graph, source: Stage, features: Stage, device: str) -> tuple[Stage, StateOverride]:
    """Add ``features`` and a :class:`StateOverride` after it, connected; returns both.

    The wiring is ``source ──audio──▶ features ──state──▶ state``. Every kind's stages start here."""
    features, state = graph.add(features), graph.add(StateOverride(device=device))
    graph.connect(source, features, "audio", "audio", capacity=8)
    graph.connect(features, state, "state", "state", capacity=8)
    return features, state


class AvatarBundle(Protocol):
    """A loaded avatar bundle of any kind. The graph builder, the apps and the benches see it so."""

    kind: ClassVar[str]  # "portrait" | "video": the ``kind`` of its avatar.json
    fps: float
    vad: bool
    meta: dict  # everything else its avatar.json holds (training report, provenance...)
    root: str | None  # the folder it was loaded from
    # the person matte, uint8 (255: the person): [H, W] of the portrait, or [N, H, W] of a video avatar's loop
    # frames; None in bundles made before mattes were (``required_matte`` says what to do)
    matte: torch.Tensor | None

    @property
    def portrait(self) -> torch.Tensor:
        """``uint8 [H, W, 3]``: the avatar at rest, at the size of the video it makes."""

    @property
    def width(self) -> int: ...

    @property
    def height(self) -> int: ...

    @property
    def region_size(self) -> int:
        """Side in px of the square region the models generate."""

    def required_matte(self) -> torch.Tensor:
        """The person matte, or :class:`AvatarError` saying how to add one (:class:`MatteInFolder`)."""

    def add_matte(self) -> str:
        """Compute the person matte and write it into the bundle folder; returns the file written.

        ``framegraph avatar matte`` calls it, for a bundle made before mattes."""

    def export_onnx(self, out_dir: str) -> dict:
        """Write the ONNX files of this bundle's models and their manifest into ``out_dir``.

        The ``onnx`` runtime reads them; ``framegraph export --avatar`` calls this. Returns the manifest."""

    def add_stages(self, graph: Graph, source: Stage, settings: RunSettings) -> AvatarStages:
        """Add the stages that turn ``source``'s ``"audio"`` into the picture, connected.

        The audio is ``int16 [320]`` at 16 kHz. The stages start with :func:`add_audio_side`. They compute on
        ``settings.runtime``."""


def onnx_dir(bundle, settings: RunSettings) -> str:
    """The ONNX export that a run on an ``onnx`` runtime reads.

    It is ``settings.onnx_dir``, else ``<bundle>/onnx``. ``framegraph export --avatar`` writes there by
    default."""
    if settings.onnx_dir is not None:
        return settings.onnx_dir
    if bundle.root is None:
        raise ValueError("the avatar was not loaded from a folder; give the export folder (onnx_dir, the output of "
                         "`framegraph export --avatar`)")
    return os.path.join(bundle.root, "onnx")


def read_matte_png(path: Path, size: tuple[int, int]) -> torch.Tensor:
    """A bundle's 8-bit grey matte picture as ``uint8 [H, W]``.

    Raises :class:`AvatarError` naming the file when it does not load or is not ``size`` (H, W)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            matte = torch.from_numpy(np.array(im.convert("L")))
    except OSError as exc:
        raise AvatarError(f"avatar bundle {str(path.parent)!r}: {path.name} is not an image ({exc})") from None
    if tuple(matte.shape) != tuple(size):
        raise AvatarError(f"avatar bundle {str(path.parent)!r}: {path.name} is {matte.shape[1]}x{matte.shape[0]}; "
                          f"expected the picture's {size[1]}x{size[0]}")
    return matte


def write_matte_png(path: Path, matte: torch.Tensor) -> None:
    """``uint8 [H, W]`` → an 8-bit grey PNG at ``path``. It is written whole, then renamed."""
    from PIL import Image

    with written_whole(path) as tmp:
        Image.fromarray(matte.cpu().numpy().astype(np.uint8), mode="L").save(tmp)


class PictureSize:
    """``width`` / ``height`` in px of what an avatar shows, from its ``portrait`` ``uint8 [H, W, 3]``."""

    @property
    def width(self) -> int:
        return int(self.portrait.shape[1])

    @property
    def height(self) -> int:
        return int(self.portrait.shape[0])


class MatteInFolder:
    """A bundle kind's person matte, kept in its folder as ``MATTE_FILE``.

    The kind computes it with ``person_matte()``. It writes it in its own format, with ``write_matte(path,
    matte)``. This class asks for it and adds it."""

    MATTE_FILE: ClassVar[str]

    def required_matte(self) -> torch.Tensor:
        """``self.matte``, or :class:`AvatarError`.

        The error says that the bundle has no person matte. It says how to give it one. Such bundles were made
        before avatars had one."""
        if self.matte is not None:
            return self.matte
        where = repr(self.root) if self.root else "(not loaded from a folder)"
        raise AvatarError(f"avatar bundle {where} has no person matte ({self.MATTE_FILE}): it was made before avatars "
                          f"had one, so it cannot be shown with alpha, over a background or in a scene; add one with "
                          f"`framegraph avatar matte --avatar {self.root or 'DIR'}` (or train it again)")

    def add_matte(self) -> str:
        """Compute the person matte and write it into the bundle folder as ``MATTE_FILE``.

        Nothing else changes. Returns its path."""
        if self.root is None:
            raise ValueError(f"the {type(self).__name__} was not loaded from a folder: save it first")
        path = Path(self.root) / self.MATTE_FILE
        self.matte = self.person_matte()
        self.write_matte(path, self.matte)
        return str(path)


def load_json(path: Path) -> dict:
    """A bundle's JSON file as a dict. The error, :class:`AvatarError`, names the file when missing or not an object."""
    if not path.is_file():
        raise AvatarError(f"avatar bundle {str(path.parent)!r}: {path.name} is missing")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AvatarError(f"avatar bundle: {str(path)!r} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise AvatarError(f"avatar bundle: {str(path)!r} must hold a JSON object")
    return data


def load_part(root: Path, part: str, cls):
    """The model ``cls`` saved in the save_pretrained folder ``root/part``, in eval mode.

    Raises :class:`AvatarError` naming the missing or bad file."""
    folder = root / part
    if not folder.is_dir():
        raise AvatarError(f"avatar bundle {str(root)!r}: the {part}/ folder ({cls.__name__}) is missing")
    for name in ("config.json", "diffusion_pytorch_model.safetensors"):
        if not (folder / name).is_file():
            raise AvatarError(f"avatar bundle {str(root)!r}: {part}/{name} is missing ({cls.__name__} "
                              f"save_pretrained folder)")
    try:
        return cls.from_pretrained(folder).eval()
    except Exception as exc:  # noqa: BLE001 - any loader failure becomes a message naming the file
        raise AvatarError(f"avatar bundle {str(root)!r}: {part}/ does not load as a {cls.__name__} "
                          f"({type(exc).__name__}: {exc})") from None


__all__ = ["AVATAR_JSON", "STATE_MODES", "LIVE_MAX_LAG_MS", "AvatarError", "RunSettings", "StateOverride",
           "AvatarStages", "add_audio_side", "AvatarBundle", "PictureSize", "MatteInFolder", "load_json", "load_part",
           "onnx_dir", "read_matte_png", "write_matte_png"]
