"""The video avatar's stream stages: audio features → mouth shape, and base frame + shape → the picture.

    AudioFeatures ─features─▶ MouthShape ─shape─────────────────────────▶ MouthRegion ─video─▶ sink
          └─state─▶ StateOverride ─state─┬▶ (MouthShape)                     ▲ ▲
                                         └▶ VideoLoop ─frame, box────────────┘─┘

:class:`MouthShape` keeps the last ``K`` feature vectors (causal) and runs the :class:`~.lipsync.ShapeHead`;
a head trained to answer silence and noise with the person's resting mouth is followed as it is, an older
one is gated: while the avatar does not speak the shape eases to the resting mouth. :class:`MouthRegion` cuts the
region at the frame's box, hides the lower face, lets the :class:`~.lipsync.MouthGenerator` redraw it for
the shape, lays the loop frame's own finest texture over it away from the lips (a bundle's ``texture`` map:
the generator draws stubble and pores only blurred) and pastes it back with the feathered alpha
(:func:`framegraph.models.composite.composite`): every pixel outside that alpha is the loop frame's own, and so
is everything below the loop frame's jaw line when the bundle has the loop frames' jaw lines
(:func:`~.bundle.jaw_keep`: the chin and the collar are never redrawn).
"""
from __future__ import annotations

import weakref

import numpy as np
import torch
import torch.nn.functional as F

from framegraph.models.audio import SPEAKING
from framegraph.models.audio.frontend import STATE_DIM
from framegraph.models.composite import composite
from framegraph.models.vae import crop_frames
from framegraph.models.vae.register import gaussian_blur
from framegraph.stream import PortSpec, Stage

from .jaw import jaw_keep
from .lipsync import MouthGenerator, ShapeHead

# the finest detail the generator leaves blurred, as a share of the region's side: a Gaussian of this σ splits
# the frame's own texture (laid over the lower face away from the lips) from the generated picture
TEXTURE_SCALE = 0.015

# generator -> the (box side, textured) picture paths already run once in this process (MouthRegion.setup)
_WARMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class MouthShape(Stage):
    """Per video frame, the standardised mouth shape ``float32 [P]`` from the audio features.

    Args:
        head: the :class:`ShapeHead`. rest: ``[P]`` the shape of the mouth at rest (silence).
        gate: ease to ``rest`` while the state is not speaking (for heads not trained on quiet audio; a
            gate also shuts lips that really move at the edges of speech, where the voice detector lags).
        ease: per frame, how far the shape moves towards the resting mouth when not speaking (and back
            when speaking): 1 = at once.
        limit: the output is clamped to ``±limit`` (standard deviations of the person's own shapes).

    Ports: in ``"features"`` ``float32 [D]``, ``"state"`` ``float32 [4]``; out ``"shape"`` ``float32 [P]``.
    """

    def __init__(self, head: ShapeHead, rest, *, gate: bool = True, ease: float = 0.5, limit: float = 3.0,
                 device: str = "cpu", name: str = "mouth_shape"):
        super().__init__(name)
        self.head = head.to(device).eval()
        c = head.config
        self.rest = torch.as_tensor(rest, dtype=torch.float32, device=device)
        if self.rest.shape != (c.shape_dim,):
            raise ValueError(f"MouthShape: rest shape {list(self.rest.shape)}; expected [{c.shape_dim}]")
        self.gate, self.ease, self.limit = bool(gate), float(ease), float(limit)
        self.inputs = {"features": PortSpec((c.feature_dim,), torch.float32, device),
                       "state": PortSpec((STATE_DIM,), torch.float32, device)}
        self.outputs = {"shape": PortSpec((c.shape_dim,), torch.float32, device)}
        self._context = torch.zeros(c.context, c.feature_dim, device=device)
        self.reset()

    def reset(self) -> None:
        self._seen = 0
        self._gate = 0.0

    @torch.no_grad()
    def step(self, features: torch.Tensor, speaking: bool) -> torch.Tensor:
        """The next frame's shape ``[P]`` from its features ``[D]`` (what :meth:`process` runs)."""
        if self._seen == 0:
            self._context.copy_(features.expand_as(self._context))  # the first frame repeated, as in training
        else:
            self._context = torch.roll(self._context, -1, 0)
            self._context[-1].copy_(features)
        self._seen += 1
        self._gate += self.ease * (float(speaking or not self.gate) - self._gate)
        pred = self.head(self._context[None])[0].clamp(-self.limit, self.limit)
        return self.rest + self._gate * (pred - self.rest)

    def process(self, inputs, out):
        speaking = int(torch.argmax(inputs["state"].data[:3])) == SPEAKING
        out.write("shape").data.copy_(self.step(inputs["features"].data, speaking))


class MouthRegion(Stage):
    """The loop frame with its lower face redrawn for the mouth shape, at the frame's resolution.

    Args:
        generator: the :class:`MouthGenerator`. mask / paste: ``float32 [S, S]`` the hidden lower face and
            the feathered paste-back alpha (0 wherever ``mask`` is 0). reference: ``uint8 [S, S, 3]``.
        frame_size: ``(H, W)`` of the frames. box_side: ``L``, the region's side in px of the frame.
        texture: ``float32 [S, S]`` or None: where the frame's own finest detail (stubble, pores, below
            about :data:`TEXTURE_SCALE` of the region's side) replaces the generated picture's — the lower face
            away from the lips, whose fine texture the generator only draws blurred (:meth:`picture`).
        max_lag_ms: live streams (realtime clock): a frame with a newer one waiting behind it, or whose audio
            arrived longer ago than this, is skipped (``frames_skipped``; :meth:`~framegraph.stream.Stage.stale`),
            so a slow machine shows fewer frames, each from the freshest audio, never a growing delay.
        torch_threads: intra-op threads of this stage's worker (None: unchanged).
        engine: what runs the generator (its runtime, :mod:`framegraph.models.runtime`): ``engine(generator)``
            → a function called as the generator is; None: the torch model itself.
        jaw_points: M, the points of the base frames' jaw lines (a bundle's ``jaws``): the stage takes each
            frame's jaw line and keeps the frame's own picture below it (:func:`~.jaw.jaw_keep`); None:
            the whole hidden area is redrawn (bundles without jaw lines).

    Ports: in ``"frame"`` ``uint8 [H, W, 3]``, ``"box"`` ``int32 [4]``, ``"shape"`` ``float32 [P]`` and with
    ``jaw_points`` ``"jaw"`` ``float32 [M, 2]`` (px of the frame); out ``"video"`` ``uint8 [H, W, 3]`` (pts and
    flags of the frame).
    """

    def __init__(self, generator: MouthGenerator, mask: torch.Tensor, paste: torch.Tensor, reference: torch.Tensor,
                 *, frame_size: tuple[int, int], box_side: int, texture: torch.Tensor | None = None,
                 max_lag_ms: float | None = None, torch_threads: int | None = None, engine=None,
                 jaw_points: int | None = None, name: str = "mouth_region"):
        super().__init__(name)
        self.generator = generator.eval()
        self.draw = self.generator if engine is None else engine(self.generator)
        S = int(mask.shape[0])
        self.size, self.side = S, int(box_side)
        self.mask = mask.float()[None, None]  # [1, 1, S, S]
        self.reference = reference.permute(2, 0, 1)[None].float() / 255.0
        alpha = F.interpolate(paste.float()[None, None], size=(self.side, self.side), mode="bilinear",
                              align_corners=False)[0, 0]
        hard = F.interpolate(self.mask, size=(self.side, self.side), mode="nearest")[0, 0]
        self.alpha = (alpha * (hard > 0.5)).clamp_(0, 1)  # [L, L]: never a pixel the generator saw
        self.texture = None
        if texture is not None:
            t = F.interpolate(texture.float()[None, None], size=(self.side, self.side), mode="bilinear",
                              align_corners=False)[0]
            self.texture = (t * (hard > 0.5)).clamp_(0, 1)  # [1, L, L]
        self.max_lag_ms, self.torch_threads = max_lag_ms, torch_threads
        self.frames_skipped = 0
        H, W = frame_size
        P = generator.config.shape_dim
        self.inputs = {"frame": PortSpec((H, W, 3), torch.uint8, "cpu"), "box": PortSpec((4,), torch.int32, "cpu"),
                       "shape": PortSpec((P,), torch.float32, "cpu")}
        if jaw_points:
            self.inputs["jaw"] = PortSpec((int(jaw_points), 2), torch.float32, "cpu")
        self.outputs = {"video": PortSpec((H, W, 3), torch.uint8, "cpu")}

    @classmethod
    def for_avatar(cls, avatar, **kwargs) -> MouthRegion:
        """The stage for a :class:`~.video_bundle.VideoAvatar` at its frames' size (``kwargs``: the rest)."""
        return cls(avatar.generator, avatar.mask, avatar.paste, avatar.reference, frame_size=(avatar.height,
                   avatar.width), box_side=avatar.box_side, texture=avatar.texture,
                   jaw_points=None if avatar.jaws is None else avatar.jaws.shape[1], **kwargs)

    def setup(self, ctx):
        super().setup(ctx)
        if self.torch_threads and "OpenMP" in torch.__config__.parallel_info():
            torch.set_num_threads(self.torch_threads)
        self.frames_skipped = 0
        L = self.side  # the first call of each kernel at a new size is the slow one: run the picture path
        warmed = _WARMED.setdefault(self.draw, set())  # (redraw, texture, paste) once per process, engine and
        if (L, self.texture is not None) not in warmed:  # size, on a frame the box's size, not on a user's frame
            self.picture(torch.zeros(L, L, 3, dtype=torch.uint8), (0, 0, L, L),
                         torch.zeros(self.generator.config.shape_dim))
            warmed.add((L, self.texture is not None))

    @torch.inference_mode()
    def redraw(self, frame: torch.Tensor, box, shape: torch.Tensor) -> torch.Tensor:
        """The generated region ``uint8 [S, S, 3]`` for ``frame [H, W, 3]`` at ``box`` (x, y, L, L)."""
        region = crop_frames(frame[None], tuple(int(v) for v in box), self.size)
        x = region.permute(0, 3, 1, 2).float() / 255.0
        y = self.draw(x * (1 - self.mask), self.mask, self.reference, shape[None].float())
        return (y[0] * 255.0).round_().clamp_(0, 255).to(torch.uint8).permute(1, 2, 0)

    @torch.inference_mode()
    def lay_texture(self, frame: torch.Tensor, box, region: torch.Tensor) -> torch.Tensor:
        """``region uint8 [S, S, 3]`` at the box's size ``uint8 [L, L, 3]``, its finest detail (below a
        Gaussian of ``TEXTURE_SCALE · L`` px) taken from ``frame``'s own pixels there, weighted by ``texture``."""
        x, y, L, _ = (int(v) for v in box)
        base = frame[y:y + L, x:x + L].permute(2, 0, 1)[None].float()  # [1, 3, L, L]
        gen = region.permute(2, 0, 1)[None].float()
        if gen.shape[-1] != L:
            gen = F.interpolate(gen, size=(L, L), mode="bilinear", align_corners=False)
        diff = base - gen  # fine(base) - fine(gen) = fine(base - gen): one blur
        out = gen + self.texture * (diff - gaussian_blur(diff, TEXTURE_SCALE * L))
        return out.round_().clamp_(0, 255).to(torch.uint8)[0].permute(1, 2, 0)

    def picture(self, frame: torch.Tensor, box, shape: torch.Tensor, out: torch.Tensor | None = None,
                jaw=None) -> torch.Tensor:
        """``frame uint8 [H, W, 3]`` with its lower face at ``box`` redrawn for ``shape [P]`` (the frame's
        fine texture laid over it where ``texture`` says) and pasted back — but not below the frame's ``jaw``
        line (``[M, 2]`` px of the frame, or None): what :meth:`process` emits."""
        region = self.redraw(frame, box, shape)
        if self.texture is not None:
            region = self.lay_texture(frame, box, region)
        alpha = self.alpha if jaw is None else self.alpha * (1 - jaw_keep(np.asarray(jaw), box))
        return composite(frame, region, box, alpha, out=out)

    def process(self, inputs, out):
        frame = inputs["frame"]
        if self.stale(frame, "frame", self.max_lag_ms):
            self.frames_skipped += 1
            return
        box = [int(v) for v in inputs["box"].data.tolist()]
        jaw = inputs["jaw"].data.numpy() if "jaw" in self.inputs else None
        self.picture(frame.data, box, inputs["shape"].data, out=out.write("video").data, jaw=jaw)


__all__ = ["MouthShape", "MouthRegion", "TEXTURE_SCALE"]
