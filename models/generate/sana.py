"""The SANA-Video family streamed block by block with a constant-size state, LongSANA style.

The model is the stock ``diffusers.SanaVideoTransformer3DModel``.
:class:`SanaVideoStream` changes two things inside it and holds nothing else:

- every self-attention gets a stateful :class:`~framegraph.kernels.processors.BlockLinearAttnProcessor`. It is
  block-causal ReLU linear attention whose past is a fixed-size sum per layer. ``model.rope`` becomes a
  :class:`~framegraph.kernels.processors.StreamingRotaryPosEmbed`, so frame positions continue across calls.
- every feed-forward's temporal convolution becomes a :class:`BlockCausalTemporalConv`. The stock one is
  ``GLUMBTempConv.conv_temp``, a centred ``(k, 1)`` conv over latent frames. The weights stay the same. But a frame
  sees its neighbours only inside its own block and the last ``k // 2`` frames before it. The frames after a block are
  zeros. The last ``k // 2`` frames of the stream so far are its cache, ``[B, C, k // 2, N]``.

A block is ``frames_per_block`` latent frames.
Both the attention and the convolution are then causal across blocks and bidirectional inside one.
So a stream fed a whole number of blocks per call computes exactly what the model computes over the whole sequence.
``tests/test_generate_sana_vae.py`` checks this.

State semantics are those of the processors.
A pass with ``append=False``, a denoising step, reads the past and leaves it as it was.
A pass with ``append=True`` appends the chunk to it. That is the pass over the clean chunk, at ``t = 0``.
:meth:`SanaVideoStream.reset` forgets the stream.
The state's size does not depend on how long the stream has run; see :meth:`SanaVideoStream.state_nbytes`.
The frame positions do.
A stream longer than the model's ``rope_max_seq_len`` latent frames is refused with a ``ValueError``.
``StreamingRotaryPosEmbed`` raises it, and the stream must be reset.

**This is a model change.** The stock model's ``conv_temp`` reads the next frame.
Here the last frame of each block reads zeros instead, exactly as at the end of a stock clip.
Attention cannot see later blocks.
A checkpoint trained for the stock, bidirectional model runs, such as the released SANA-Video weights.
But it was not trained for this, and its output degrades, most at block boundaries.
Weights trained causally this way stream as trained.
LongSANA's chunk-causal students are such weights.
Its ``CachedGLUMBConvTemp`` prepends the cached last frame and pads the future with zeros, as here.
``frames_per_block`` must then be the chunk size they were trained with.

Use::

    stream = SanaVideoStream(model, latent_size=(h, w), frames_per_block=3)
    for prompt_embeds in prompts:                                # may change from chunk to chunk
        noise = torch.randn(1, C, 3, h, w)
        clean = stream.generate_chunk(noise, prompt_embeds, timesteps=[1000, 750, 500, 250])
        # clean [1, C, 3, h, w]: the chunk's latents, for the VAE (see .vae)
    stream.reset()                                               # a new stream
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import SanaVideoTransformer3DModel

from framegraph.kernels.processors import install_block_linear_processors, reset_block_linear_state, set_update_state

from ..sampler import sample_euler

__all__ = ["BlockCausalTemporalConv", "SanaVideoStream", "install_block_causal_convs", "sigmas_from_timesteps"]

NUM_TRAIN_TIMESTEPS = 1000  # diffusers' FlowMatchEulerDiscreteScheduler: model timestep = sigma * 1000


class BlockCausalTemporalConv(torch.nn.Module):
    """Drop-in for ``GLUMBTempConv.conv_temp``: the stock conv's weights, causal across blocks of frames.

    A block is ``frames_per_block`` consecutive frames, counted from the first frame of the call.
    For its frames the output is the stock convolution of ``[last k//2 frames before the block, the block, k//2 zero
    frames]``.
    So a frame sees neighbours inside the block and in the past, never after the block.

    Args:
        conv: the stock ``nn.Conv2d``, kept as ``self.conv`` and used as is. Its kernel is ``(k, 1)`` with ``k`` odd,
            padding ``(k // 2, 0)`` and stride 1.
        frames_per_block: frames per block. A call must hold whole blocks.
        stateful: carry the last ``k // 2`` frames of appended input from call to call in ``self.cache``. The cache
            is ``[B, C, k // 2, N]``, detached. ``False``: every call starts from an empty, zero past.
        update_state: when ``stateful``, append this call's frames to the cache. ``False``: read only.
    """

    def __init__(self, conv: torch.nn.Conv2d, frames_per_block: int, *, stateful: bool = True,
                 update_state: bool = True) -> None:
        super().__init__()
        k = conv.kernel_size[0]
        if (conv.kernel_size[1] != 1 or k % 2 == 0 or tuple(conv.padding) != (k // 2, 0)
                or tuple(conv.stride) != (1, 1) or tuple(conv.dilation) != (1, 1)):
            raise ValueError(
                f"BlockCausalTemporalConv: conv has kernel {tuple(conv.kernel_size)}, padding {conv.padding}, "
                f"stride {conv.stride}, dilation {conv.dilation}; expected GLUMBTempConv's conv_temp: kernel (k, 1) "
                f"with k odd, padding (k // 2, 0), stride 1, dilation 1"
            )
        if isinstance(frames_per_block, bool) or not isinstance(frames_per_block, int) or frames_per_block < 1:
            raise ValueError(f"BlockCausalTemporalConv: frames_per_block={frames_per_block!r}; expected an int >= 1")
        self.conv = conv
        self.frames_per_block = frames_per_block
        self.context = k // 2  # frames of past (and of zero future) each block reads
        self.stateful = stateful
        self.update_state = update_state
        self.cache: torch.Tensor | None = None  # [B, C, context, N]: the last appended frames

    def reset(self) -> None:
        """Forget the stream: the next call starts from an empty past."""
        self.cache = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[B, C, F, N]`` -> ``[B, C, F, N]``, with ``N`` = height * width."""
        batch, channels, frames, tokens = x.shape
        if frames % self.frames_per_block:
            raise ValueError(
                f"BlockCausalTemporalConv: {frames} frames is not a whole number of {self.frames_per_block}-frame "
                f"blocks; feed whole blocks"
            )
        past = self.cache if self.stateful else None
        if past is None:
            past = x.new_zeros(batch, channels, self.context, tokens)
        elif past.shape != (batch, channels, self.context, tokens):
            raise ValueError(
                f"BlockCausalTemporalConv: input [B, C, F, N]={tuple(x.shape)} does not continue the streamed cache "
                f"{tuple(past.shape)} (batch, channels or frame size differ); call reset() to start a new stream"
            )
        seq = torch.cat([past.to(x.dtype), x], dim=2)  # [B, C, context + F, N]
        future = x.new_zeros(batch, channels, self.context, tokens)
        outs = []
        for start in range(0, frames, self.frames_per_block):  # x's frames [start, start + b) and `context` before
            window = torch.cat([seq[:, :, start:start + self.context + self.frames_per_block], future], dim=2)
            outs.append(F.conv2d(window, self.conv.weight, self.conv.bias, groups=self.conv.groups))
        if self.stateful and self.update_state:
            last = seq[:, :, seq.shape[2] - self.context:].detach()
            if self.cache is None or self.cache.shape != last.shape:
                self.cache = last.clone()  # a copy, not a view of seq
            else:
                self.cache.copy_(last)  # in place: the cache keeps its storage (CUDA graphs read it there)
        return torch.cat(outs, dim=2)


def install_block_causal_convs(
    model: torch.nn.Module, frames_per_block: int, **kwargs
) -> dict[str, BlockCausalTemporalConv]:
    """Replace every ``GLUMBTempConv.conv_temp`` in ``model`` with its own ``BlockCausalTemporalConv(conv,
    frames_per_block, **kwargs)``.

    Installing again rewraps the stock conv. Returns them by module name.
    """
    installed = {}
    feed_forwards = [(name, m) for name, m in model.named_modules() if type(m).__name__ == "GLUMBTempConv"]
    for name, module in feed_forwards:
        conv = module.conv_temp.conv if isinstance(module.conv_temp, BlockCausalTemporalConv) else module.conv_temp
        module.conv_temp = BlockCausalTemporalConv(conv, frames_per_block, **kwargs)
        installed[f"{name}.conv_temp"] = module.conv_temp
    if not installed:
        raise ValueError(f"install_block_causal_convs: {type(model).__name__} has no GLUMBTempConv feed-forward")
    return installed


def sigmas_from_timesteps(timesteps: Sequence[float]) -> torch.Tensor:
    """Model timesteps -> the sampler's schedule ``float32 [steps + 1]``: ``t / 1000``, then ``0`` for the clean end.

    Timesteps satisfy ``0 < t <= 1000`` and strictly decrease, e.g. ``[1000, 750, 500, 250]``.
    """
    return torch.tensor(host_sigmas(timesteps), dtype=torch.float32)


def host_sigmas(timesteps: Sequence[float]) -> list[float]:
    """:func:`sigmas_from_timesteps` as Python floats of float32 values. The sampler takes these.

    So no step reads a tensor back. Checks and error messages are the same.
    """
    values = [float(t) for t in timesteps] if isinstance(timesteps, (list, tuple)) else None
    if not values:
        raise ValueError(f"timesteps={timesteps!r}; expected a non-empty list of numbers such as [1000, 750, 500, 250]")
    if any(not 0 < t <= NUM_TRAIN_TIMESTEPS for t in values) or any(a <= b for a, b in zip(values, values[1:])):
        raise ValueError(
            f"timesteps={values}; expected strictly decreasing values in (0, {NUM_TRAIN_TIMESTEPS}] "
            f"(the noisiest first, e.g. [1000, 750, 500, 250])"
        )
    return [float(np.float32(t / NUM_TRAIN_TIMESTEPS)) for t in values] + [0.0]


class SanaVideoStream:
    """A stock ``SanaVideoTransformer3DModel`` generating latent video block by block, endlessly.

    It installs the streaming processors, rotary table and :class:`BlockCausalTemporalConv` s into ``model``.
    See the module docs: this is a model change.
    Every chunk passed in must be whole blocks of latent frames of ``latent_size``.

    Args:
        model: the stock model in eval mode, any float dtype and device.
        latent_size: ``(height, width)`` of the latent frames: pixels / the VAE's spatial factor.
        frames_per_block: latent frames per causal block. Use the chunk size a causal checkpoint was trained with.
        backend: attention kernel backend, ``"auto" | "triton" | "torch"``.
    """

    def __init__(self, model: SanaVideoTransformer3DModel, *, latent_size: tuple[int, int], frames_per_block: int,
                 backend: str = "auto") -> None:
        if not isinstance(model, SanaVideoTransformer3DModel):
            raise TypeError(
                f"SanaVideoStream: model is a {type(model).__name__}; expected a SanaVideoTransformer3DModel"
            )
        p_t, p_h, p_w = model.config.patch_size
        if p_t != 1:
            raise ValueError(
                f"SanaVideoStream: the model's patch_size={tuple(model.config.patch_size)} groups {p_t} latent frames "
                f"per token; streaming needs a temporal patch size of 1 (as SANA-Video's (1, 2, 2))"
            )
        height, width = latent_size
        if height % p_h or width % p_w or height <= 0 or width <= 0:
            raise ValueError(
                f"SanaVideoStream: latent_size={tuple(latent_size)}; expected positive multiples of the patch size "
                f"({p_h}, {p_w})"
            )
        if isinstance(frames_per_block, bool) or not isinstance(frames_per_block, int) or frames_per_block < 1:
            raise ValueError(f"SanaVideoStream: frames_per_block={frames_per_block!r}; expected an int >= 1")
        self.model = model
        self.latent_size = (height, width)
        self.frames_per_block = frames_per_block
        self.tokens_per_frame = (height // p_h) * (width // p_w)
        self.processors = install_block_linear_processors(
            model, block_size=frames_per_block * self.tokens_per_frame, stateful=True, stream_rope=True,
            backend=backend,
        )
        self.convs = install_block_causal_convs(model, frames_per_block, stateful=True)

    # ------------------------------------------------------------------ state

    def reset(self) -> None:
        """Forget the stream, on barge-in or a new prompt session.

        The next chunk starts at frame 0 with an empty past.
        """
        reset_block_linear_state(self.processors)
        for conv in self.convs.values():
            conv.reset()

    @property
    def frames_seen(self) -> int:
        """Latent frames appended to the stream so far: the next chunk's first frame position."""
        return next(iter(self.processors.values())).tokens_seen // self.tokens_per_frame

    def graph_key(self) -> tuple:
        """What a captured velocity call depends on besides its inputs: where the past lives.

        It is None before the first append. From then on the storage is kept until :meth:`reset`.
        """
        state = next(iter(self.processors.values())).state
        conv = next(iter(self.convs.values())).cache
        return ("sana", None if state is None else state.kv.data_ptr(), None if conv is None else conv.data_ptr())

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor of the stream's past: per layer the attention sums and the convolution cache."""
        tensors = []
        for processor in self.processors.values():
            if processor.state is not None:
                tensors += [processor.state.kv, processor.state.k_sum]
        return tensors + [conv.cache for conv in self.convs.values() if conv.cache is not None]

    def state_nbytes(self) -> int:
        """Bytes of the stream's past: the same after the first chunk however long the stream runs."""
        return sum(t.numel() * t.element_size() for t in self.state_tensors())

    def _set_append(self, append: bool) -> None:
        set_update_state(self.processors, append)
        for conv in self.convs.values():
            conv.update_state = append

    # ------------------------------------------------------------------ passes

    def _check(self, latents: torch.Tensor, prompt_embeds: torch.Tensor) -> None:
        config = self.model.config
        if latents.dim() != 5 or latents.shape[1] != config.in_channels or tuple(latents.shape[3:]) != self.latent_size:
            raise ValueError(
                f"SanaVideoStream: latents have shape {tuple(latents.shape)}; expected [B, C={config.in_channels}, "
                f"F, H={self.latent_size[0]}, W={self.latent_size[1]}]"
            )
        frames = latents.shape[2]
        if frames == 0 or frames % self.frames_per_block:
            raise ValueError(
                f"SanaVideoStream: a chunk of {frames} latent frames is not a whole number of "
                f"{self.frames_per_block}-frame blocks; pass F = a positive multiple of frames_per_block"
            )
        if prompt_embeds.dim() != 3 or prompt_embeds.shape[0] != latents.shape[0] \
                or prompt_embeds.shape[2] != config.caption_channels:
            raise ValueError(
                f"SanaVideoStream: prompt_embeds have shape {tuple(prompt_embeds.shape)}; expected "
                f"[B={latents.shape[0]}, L, caption_channels={config.caption_channels}] "
                f"(the text encoder's hidden states)"
            )

    def _forward(self, latents, sigma, prompt_embeds, prompt_mask, append: bool) -> torch.Tensor:
        self._check(latents, prompt_embeds)
        self._set_append(append)
        timestep = (torch.as_tensor(sigma, dtype=torch.float32, device=latents.device) * NUM_TRAIN_TIMESTEPS)
        timestep = timestep.expand(latents.shape[0])
        return self.model(latents, prompt_embeds, timestep, encoder_attention_mask=prompt_mask).sample

    @torch.no_grad()
    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor | float, prompt_embeds: torch.Tensor,
                 prompt_mask: torch.Tensor | None = None) -> torch.Tensor:
        """A read-only pass, as in a denoising step. Returns the predicted flow velocity ``[B, C, F, H, W]``.

        ``latents [B, C, F, H, W]`` are at noise level ``sigma``, a scalar or ``[B]`` in ``[0, 1]``.
        ``prompt_embeds`` is ``[B, L, caption_channels]``. In ``prompt_mask [B, L]`` 1 means keep.
        The past is unchanged.
        """
        return self._forward(latents, sigma, prompt_embeds, prompt_mask, append=False)

    @torch.no_grad()
    def append(self, clean: torch.Tensor, prompt_embeds: torch.Tensor, prompt_mask: torch.Tensor | None = None) -> None:
        """Append a clean chunk ``[B, C, F, H, W]`` to the stream's past: one pass at ``t = 0``."""
        self._forward(clean, 0.0, prompt_embeds, prompt_mask, append=True)

    @torch.no_grad()
    def generate_chunk(
        self,
        noise: torch.Tensor,
        prompt_embeds: torch.Tensor,
        timesteps: Sequence[float] = (1000, 750, 500, 250),
        *,
        prompt_mask: torch.Tensor | None = None,
        renoise: bool = False,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """The next chunk of the stream: few-step flow matching from ``noise``, then an append pass.

        Args:
            noise: ``[B, C, F, H, W]``, the chunk at its first timestep. ``F`` is whole blocks. For text-to-video it
                is pure noise. For video-to-video it is input latents noised to that timestep.
            prompt_embeds: ``[B, L, caption_channels]``. May differ from chunk to chunk.
            timesteps: model timesteps, strictly decreasing in ``(0, 1000]``, one per model evaluation.
            prompt_mask: ``[B, L]`` with 1 meaning keep, or ``None``.
            renoise: a distilled few-step model's sampler, as in CausVid / Self-Forcing / LCM. It estimates the clean
                chunk and noises it again to the next timestep with fresh noise from ``generator``. ``False``:
                deterministic Euler steps; see :func:`framegraph.models.sampler.sample_euler`.

        Returns:
            the clean chunk ``[B, C, F, H, W]`` in the model's latent space, now part of the stream's past.
        """
        clean = self.denoise(noise, prompt_embeds, timesteps, prompt_mask=prompt_mask, renoise=renoise,
                             generator=generator)
        self.append(clean, prompt_embeds, prompt_mask)
        return clean

    @torch.no_grad()
    def denoise(self, noise, prompt_embeds, timesteps=(1000, 750, 500, 250), *, prompt_mask=None,
                renoise: bool = False, generator: torch.Generator | None = None,
                fresh: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """:meth:`generate_chunk`'s sampling alone: the clean chunk, the past unchanged.

        ``fresh`` is the re-noising noise drawn ahead; see :func:`~framegraph.models.sampler.sample_euler`.
        """
        sigmas = host_sigmas(timesteps)
        self._check(noise, prompt_embeds)
        return sample_euler(lambda x, t: self.velocity(x, t, prompt_embeds, prompt_mask), noise, timesteps=sigmas,
                            renoise=renoise, generator=generator, fresh=fresh)
