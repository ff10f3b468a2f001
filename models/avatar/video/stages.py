"""The video avatar's stream stages: audio features → mouth shape, and base frame + shape → the picture.

    AudioFeatures ─features─▶ MouthShape ─shape─────────────────────────▶ MouthRegion ─video─▶ sink
          └─state─▶ StateOverride ─state─┬▶ (MouthShape)                     ▲ ▲
                                         └▶ VideoLoop ─frame, box────────────┘─┘

:class:`MouthShape` keeps the last ``K`` feature vectors, causally. It runs the :class:`~.lipsync.ShapeHead`.
Some heads were trained to answer silence and noise with the person's resting mouth. Those are followed as
they are. An older head is gated. While the avatar does not speak, the shape eases to the resting mouth.

:class:`MouthRegion` cuts the region at the frame's box and hides the lower face. The :class:`~.lipsync.MouthGenerator`
redraws it for the shape. The loop frame's own finest texture is laid over it away from the lips. A bundle's ``texture``
map says where. The generator draws stubble and pores only blurred. The region is pasted back with the feathered alpha
(:func:`framegraph.models.composite.composite`). Every pixel outside that alpha is the loop frame's own. So is
everything below the loop frame's jaw line. That needs a bundle with the loop frames' jaw lines. The loop makes that
mask (:func:`~.jaw.kept_share`). The chin and the collar are never redrawn.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from framegraph.models.audio import SPEAKING
from framegraph.models.audio.frontend import STATE_DIM
from framegraph.models.composite import composite, resize_region
from framegraph.models.graphs import GraphedStep
from framegraph.models.vae import crop_frames
from framegraph.models.vae.register import gaussian_blur
from framegraph.stream import PortSpec, Stage
from framegraph.stream.batching import BatchClient, Missed, frame_deadline_ns

from .lipsync import MouthGenerator, ShapeHead

# the finest detail the generator leaves blurred, as a share of the region's side: a Gaussian of this σ splits
# the frame's own texture (laid over the lower face away from the lips) from the generated picture
TEXTURE_SCALE = 0.015

# generator -> the (box side, textured) picture paths already run once in this process (MouthRegion.setup)
_WARMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _inference(fn):
    """``fn`` called under ``torch.inference_mode()``. A compiled function is compiled without it inside."""
    def call(*args, **kwargs):
        with torch.inference_mode():
            return fn(*args, **kwargs)

    return call


class MouthShape(Stage):
    """Per video frame, the standardised mouth shape ``float32 [P]`` from the audio features.

    Args:
        head: the :class:`ShapeHead`.
        rest: ``[P]``, the shape of the mouth at rest, in silence.
        gate: ease to ``rest`` while the state is not speaking. This is for heads not trained on quiet audio.
            A gate also shuts lips that really move at the edges of speech. There the voice detector lags.
        ease: per frame, how far the shape moves towards rest when not speaking. The same holds
            back when speaking. 1 means at once.
        limit: the output is clamped to ``±limit``. The unit is the std of the person's own shapes.

    Ports: in ``"features"`` ``float32 [D]`` and ``"state"`` ``float32 [4]``. They come on the CPU, from the audio side.
    Out ``"shape"`` ``float32 [P]`` on ``device``, where the head runs. The inputs are uploaded, and the speaking
    gate is kept there. Nothing is read back. ``engine(head)``: the callable that runs the head, its runtime.
    """

    def __init__(self, head: ShapeHead, rest, *, gate: bool = True, ease: float = 0.5, limit: float = 3.0,
                 device: str = "cpu", engine=None, name: str = "mouth_shape"):
        super().__init__(name)
        self.head = head.to(device).eval()
        self.run_head = self.head if engine is None else engine(self.head)  # context [1, K, D] → shape [1, P]
        c = head.config
        self.rest = torch.as_tensor(rest, dtype=torch.float32, device=device)
        if self.rest.shape != (c.shape_dim,):
            raise ValueError(f"MouthShape: rest shape {list(self.rest.shape)}; expected [{c.shape_dim}]")
        self.gate, self.ease, self.limit = bool(gate), float(ease), float(limit)
        self.inputs = {"features": PortSpec((c.feature_dim,), torch.float32, "cpu"),
                       "state": PortSpec((STATE_DIM,), torch.float32, "cpu")}
        self.outputs = {"shape": PortSpec((c.shape_dim,), torch.float32, device)}
        self._inputs = torch.zeros(c.feature_dim + STATE_DIM, device=device)  # this frame's, uploaded
        self._context = torch.zeros(c.context, c.feature_dim, device=device)
        self._gate = torch.zeros((), device=device)  # on the device: the state is never read back to the host
        self.reset()

    def reset(self) -> None:
        self._seen = 0
        self._gate.zero_()

    @torch.no_grad()
    def step(self, features: torch.Tensor, speaking: bool | torch.Tensor) -> torch.Tensor:
        """The next frame's shape ``[P]`` from its features ``[D]`` and whether the avatar speaks.

        Speaking is a bool, or a 0-dim tensor with 1 for speaking. The tensor is what :meth:`process` passes, computed
        on the device."""
        if self._seen == 0:
            self._context.copy_(features.expand_as(self._context))  # the first frame repeated, as in training
        else:
            self._context[:-1] = self._context[1:].clone()  # in place: the context keeps its storage
            self._context[-1].copy_(features)
        self._seen += 1
        target = torch.as_tensor(speaking, dtype=torch.float32, device=self._gate.device)
        if not self.gate:
            target = torch.ones_like(target)
        self._gate += self.ease * (target - self._gate)
        pred = self.run_head(self._context[None])[0].clamp(-self.limit, self.limit)
        return self.rest + self._gate * (pred - self.rest)

    def process(self, inputs, out):
        d = self.head.config.feature_dim
        self._inputs[:d].copy_(inputs["features"].data, non_blocking=True)
        self._inputs[d:].copy_(inputs["state"].data, non_blocking=True)
        speaking = torch.argmax(self._inputs[d:d + 3]) == SPEAKING  # on the device: never read back
        out.write("shape").data.copy_(self.step(self._inputs[:d], speaking))


class MouthRegion(Stage):
    """The loop frame with its lower face redrawn for the mouth shape, at the frame's resolution.

    Args:
        generator: the :class:`MouthGenerator`.
        mask: ``float32 [S, S]``, the hidden lower face.
        paste: ``float32 [S, S]``, the feathered paste-back alpha. It is 0 wherever ``mask`` is 0.
        reference: ``uint8 [S, S, 3]``.
        frame_size: ``(H, W)`` of the frames.
        box_side: ``L``, the box's side in px of the frame.
        texture: ``float32 [S, S]`` or None. It says where the frame's own finest detail replaces the generated
            picture's. That detail is stubble and pores, below about :data:`TEXTURE_SCALE` of the region's side.
            It covers the lower face away from the lips. The generator draws that fine texture only blurred
            (:meth:`picture`).
        max_lag_ms: for live streams on a realtime clock. A frame with a newer one waiting behind it is
            skipped. So is a frame whose audio arrived longer ago than this. ``frames_skipped`` counts them; see
            :meth:`~framegraph.stream.Stage.stale`. So a slow machine shows fewer frames, each from the freshest
            audio. It never shows a growing delay.
        torch_threads: intra-op threads of this stage's worker. None: unchanged.
        device: where the generator runs and the frames arrive.
        out_device: where the picture goes. Default ``device``. Use ``"cpu"`` for an encoder after a GPU run.
        engine: ``engine(fn)`` → how the device path :meth:`picture_at` runs. That is its runtime: as it is, or
            compiled.
        generator_engine: what runs the generator inside that path; see :mod:`framegraph.models.runtime`.
            ``generator_engine(generator)`` → a function called as the generator is, such as ONNX Runtime's.
            None: the torch model itself. It may give a :class:`~framegraph.stream.batching.BatchClient`
                (:func:`~.engines.batched_generator`). That runs the generator in batches with other sessions'. The
                client
            is opened at setup and closed at teardown. ``interrupt`` cancels it. It gets the frame's deadline:
            live, its audio's arrival + ``max_lag_ms``. A frame the batch cannot make in time is skipped, and
            ``frames_skipped`` counts it.
        graphs: replay the device path from a CUDA graph, on CUDA. Its inputs are copied into static buffers.
        matte: the frame's person matte comes in on ``"alpha"``. It leaves beside the picture, unchanged. The
            redrawn lower face lies inside the person. It is skipped with the frame.
        kept_share: the frame's kept share of the box comes in on ``"kept_share"``. It is ``float32 [L, L]``, 1 at
            and below the frame's jaw line (:func:`~.jaw.kept_share`). :class:`~.loop.VideoLoop` makes it from a
            bundle's ``jaws``.
            Nothing there is redrawn. False: the whole hidden area is, as in older bundles.

    Ports: in ``"frame"`` ``uint8 [H, W, 3]``, ``"box"`` ``int32 [4]`` and ``"shape"`` ``float32 [P]``. With their
    options, ``"alpha"`` ``uint8 [H, W]`` and ``"kept_share"`` ``float32 [L, L]`` come in too. Out go ``"video"``
    ``uint8 [H, W, 3]`` and, with ``matte``, ``"alpha"``. They carry the frame's pts and flags, on
    ``out_device``. The rest is on ``device``.

    :meth:`process` cuts and pastes the region with index tensors (:meth:`picture_at`). They are made from the box on
    the device. No value is read back. The shapes do not depend on where the box is. Its readable twin is
    :meth:`picture`. It slices at a box of Python ints.
    """

    def __init__(self, generator: MouthGenerator, mask: torch.Tensor, paste: torch.Tensor, reference: torch.Tensor,
                 *, frame_size: tuple[int, int], box_side: int, texture: torch.Tensor | None = None,
                 max_lag_ms: float | None = None, torch_threads: int | None = None, device: str = "cpu",
                 out_device: str | None = None, engine=None, generator_engine=None, graphs: bool = False,
                 matte: bool = False, kept_share: bool = False, name: str = "mouth_region"):
        super().__init__(name)
        self.generator = generator.to(device).eval()
        self.draw = self.generator if generator_engine is None else generator_engine(self.generator)
        self.batched = isinstance(self.draw, BatchClient)
        self.device = str(torch.device(device))
        S = int(mask.shape[0])
        self.size, self.side = S, int(box_side)
        mask, paste, reference = mask.to(device), paste.to(device), reference.to(device)
        texture = None if texture is None else texture.to(device)
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
        self.frame_size = (int(H), int(W))
        self._offsets = torch.arange(self.side, device=device)  # [L]: a box's rows / columns from its corner
        P = generator.config.shape_dim
        self.inputs = {"frame": PortSpec((H, W, 3), torch.uint8, device), "box": PortSpec((4,), torch.int32, device),
                       "shape": PortSpec((P,), torch.float32, device)}
        out_device = str(torch.device(out_device or device))
        self.outputs = {"video": PortSpec((H, W, 3), torch.uint8, out_device)}
        if matte:
            self.inputs["alpha"] = PortSpec((H, W), torch.uint8, device)
            self.outputs["alpha"] = PortSpec((H, W), torch.uint8, out_device)
        if kept_share:
            self.inputs["kept_share"] = PortSpec((self.side, self.side), torch.float32, device)
        # the picture is made on the device and copied down when the output is elsewhere (an encoder's CPU), and
        # made before its slot is taken when a batch may skip it
        self._scratch = None if out_device == self.device and not graphs and not self.batched else \
            torch.empty(H, W, 3, dtype=torch.uint8, device=device)
        run = self.picture_at if engine is None else _inference(engine(self._picture))
        self.compiled = engine is not None
        self._step = GraphedStep(lambda *args: run(*args, out=self._scratch), enabled=graphs,
                                 name="video avatar picture") if self._scratch is not None else None
        self._direct = run

    @classmethod
    def for_avatar(cls, avatar, **kwargs) -> MouthRegion:
        """The stage for a :class:`~.bundle.VideoAvatar` at its frames' size. ``kwargs`` are the rest."""
        return cls(avatar.generator, avatar.mask, avatar.paste, avatar.reference, frame_size=(avatar.height,
                   avatar.width), box_side=avatar.box_side, texture=avatar.texture,
                   kept_share=avatar.jaws is not None, **kwargs)

    def setup(self, ctx):
        super().setup(ctx)
        self.frames_skipped = 0
        if self.batched:
            self.draw.open()
        if self._step is not None and self._step.enabled:
            self.warm()  # a CUDA graph per stage: captured here, not at the first frame
            return
        engine = self.draw.lane if self.batched else self.draw  # one warm-up per model, however many sessions
        if self.batched:  # the lane's cost per batch size (once per lane): what the batches it forms are sized by
            S = self.size
            engine.warm_once((torch.zeros(1, 3, S, S, device=self.device), self.mask, self.reference,
                              torch.zeros(1, self.generator.config.shape_dim, device=self.device)))
        warmed = _WARMED.setdefault(engine, set())  # the first call of each kernel at a new size is the
        key = (self.frame_size, self.side, self.texture is not None, self.device, self.compiled)  # slow one: once
        if key not in warmed:  # per process, size and runtime, on a blank frame, not on a user's frame
            self.warm()
            warmed.add(key)

    def warm(self) -> None:
        """Run the picture step once on a blank frame of the session's size.

        That makes the first calls of kernels. A compiled runtime compiles, and a CUDA graph is captured. This is done
        by :meth:`setup`, once per process, size and runtime. With a CUDA graph it is once per stage."""
        H, W = self.frame_size
        L = self.side
        frame = torch.zeros(H, W, 3, dtype=torch.uint8, device=self.device)
        args = (frame, torch.tensor([0, 0, L, L], dtype=torch.int32, device=self.device),
                torch.zeros(self.generator.config.shape_dim, device=self.device))
        if "kept_share" in self.inputs:
            args += (torch.zeros(L, L, device=self.device),)
        if self._step is not None:
            self._step(*args)
        else:
            self._direct(*args)

    @torch.inference_mode()
    def redraw(self, frame: torch.Tensor, box, shape: torch.Tensor) -> torch.Tensor:
        """The generated picture ``uint8 [S, S, 3]`` for ``frame [H, W, 3]`` at ``box`` (x, y, L, L)."""
        return self._generate(crop_frames(frame[None], tuple(int(v) for v in box), self.size), shape)

    def _generate(self, crop: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
        """``crop uint8 [1, S, S, 3]``, the box's pixels at the model's size → the redrawn ``uint8 [S, S, 3]``."""
        x = crop.permute(0, 3, 1, 2).float() / 255.0
        y = self.draw(x * (1 - self.mask), self.mask, self.reference, shape[None].float())
        return (y[0] * 255.0).round_().clamp_(0, 255).to(torch.uint8).permute(1, 2, 0)

    @torch.inference_mode()
    def lay_texture(self, frame: torch.Tensor, box, drawn: torch.Tensor) -> torch.Tensor:
        """``drawn uint8 [S, S, 3]`` at the box's size ``uint8 [L, L, 3]``, with ``frame``'s finest detail.

        That detail lies below a Gaussian of ``TEXTURE_SCALE · L`` px. It is taken from ``frame``'s own pixels
        there, weighted by ``texture``."""
        x, y, L, _ = (int(v) for v in box)
        return self._texture(frame[y:y + L, x:x + L], drawn)

    def _texture(self, base: torch.Tensor, drawn: torch.Tensor) -> torch.Tensor:
        """:meth:`lay_texture` given the box's pixels ``base uint8 [L, L, 3]``."""
        L = self.side
        base = base.permute(2, 0, 1)[None].float()  # [1, 3, L, L]
        gen = drawn.permute(2, 0, 1)[None].float()
        if gen.shape[-1] != L:
            gen = F.interpolate(gen, size=(L, L), mode="bilinear", align_corners=False)
        diff = base - gen  # fine(base) - fine(gen) = fine(base - gen): one blur
        out = gen + self.texture * (diff - gaussian_blur(diff, TEXTURE_SCALE * L))
        return out.round_().clamp_(0, 255).to(torch.uint8)[0].permute(1, 2, 0)

    def picture(self, frame: torch.Tensor, box, shape: torch.Tensor, kept_share: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """``frame uint8 [H, W, 3]`` with its lower face at ``box`` redrawn for ``shape [P]`` and pasted back.

        The frame's fine texture is laid over it where ``texture`` says. Nothing is pasted where ``kept_share`` keeps
        the frame. ``kept_share`` is ``float32 [L, L]`` or None: :func:`~.jaw.kept_share` of the frame's jaw line. This
        is what :meth:`process` emits."""
        drawn = self.redraw(frame, box, shape)
        if self.texture is not None:
            drawn = self.lay_texture(frame, box, drawn)
        alpha = self.alpha if kept_share is None else self.alpha * (1 - kept_share)
        return composite(frame, drawn, box, alpha, out=out)

    def window(self, box: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``box int [4]`` (x, y, L, L) on the device → the rows ``[L, 1]`` and columns ``[1, L]`` it covers.

        They are index tensors. The corner is clamped into the frame.
        :func:`~framegraph.models.vae.crop_frames` would refuse a box outside it."""
        H, W = self.frame_size
        box = box.long()
        rows = box[1].clamp(0, H - self.side) + self._offsets
        cols = box[0].clamp(0, W - self.side) + self._offsets
        return rows[:, None], cols[None, :]

    @torch.inference_mode()
    def picture_at(self, frame: torch.Tensor, box: torch.Tensor, shape: torch.Tensor,
                   kept_share: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`picture` with the box a tensor on the device.

        The region is gathered and pasted back through index tensors (:meth:`window`). So nothing is read back
        to the host, and every shape is fixed."""
        return self._picture(frame, box, shape, kept_share, out)

    def _picture(self, frame: torch.Tensor, box: torch.Tensor, shape: torch.Tensor,
                 kept_share: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`picture_at` without its grad mode. A runtime compiles this; it is called under inference mode."""
        rows, cols = self.window(box)
        base = frame[rows, cols]  # [L, L, 3]: the box's pixels
        crop = base[None]
        if self.side != self.size:  # the model's size, as crop_frames resizes
            f = F.interpolate(crop.permute(0, 3, 1, 2).float(), size=(self.size, self.size), mode="bilinear",
                              align_corners=False, antialias=self.size < self.side)
            crop = f.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        drawn = self._generate(crop, shape)
        if self.texture is not None:
            drawn = self._texture(base, drawn)
        alpha = self.alpha if kept_share is None else self.alpha * (1 - kept_share)
        blended = torch.lerp(base.float(), resize_region(drawn, self.side, self.side), alpha[:, :, None])
        out = frame.clone() if out is None else out.copy_(frame)
        out[rows, cols] = blended.round_().clamp_(0, 255).to(torch.uint8)
        return out

    def teardown(self) -> None:
        if self.batched:
            self.draw.close()

    def interrupt(self) -> None:
        if self.batched:
            self.draw.cancel()  # a call waiting on the batch returns now

    def process(self, inputs, out):
        frame = inputs["frame"]
        if self.stale(frame, "frame", self.max_lag_ms):
            self.frames_skipped += 1
            return
        args = (frame.data, inputs["box"].data, inputs["shape"].data)
        if "kept_share" in self.inputs:
            args += (inputs["kept_share"].data,)
        if self._step is None:
            self._direct(*args, out=out.write("video").data)
        else:
            if self.batched:
                self.draw.deadline_ns = frame_deadline_ns(frame, self.max_lag_ms, self.ctx.clock.mode)
            try:
                picture = self._step(*args)  # into the scratch frame
            except Missed:
                self.frames_skipped += 1
                return
            out.write("video").data.copy_(picture, non_blocking=True)  # a download slot on CUDA (see stream.Frame)
        if "alpha" in self.outputs:
            out.write("alpha").data.copy_(inputs["alpha"].data, non_blocking=True)


__all__ = ["MouthShape", "MouthRegion", "TEXTURE_SCALE"]
