"""The generate pipeline's compiled runtime (``"compiled"``, :mod:`framegraph.models.compile`).

- **Denoiser** (:func:`compile_stream`): every transformer block of the stock diffusers model is compiled by
  Inductor in place (regional compilation: the blocks share one code object, so one compilation serves all
  layers). The streaming parts keep their Python bookkeeping out of the compiled graphs: the self-attention
  processors' ``attend`` (the KV cache / linear-attention state, with its frame counters) and SANA's block-causal
  temporal conv (its cache) run as they are between the compiled pieces, so a stream's position never becomes a
  guard that would recompile every chunk. On CUDA each denoising step — one velocity call of the transformer,
  the cache read only — is replayed from a CUDA graph (:class:`GraphedVelocity`): the time, the latents and the
  prompt are copied into static buffers, the rotary table of the stream's position is pinned into buffers
  before each step, and one graph is captured per state of the cache (Wan: per number of frames it holds,
  until it is full; SANA: before and after the first commit). The commit pass runs compiled, not graphed.
- **VAE decoder** (:class:`CompiledWanVAE`): :func:`~.vae.decode_chunk` with ``vae.decoder`` compiled (its
  feature cache is a Python list the decoder rebinds: the first frame, the second and the steady ones each get
  their graph). Not graphed.

The model objects are shared with the torch runtime: compiling the blocks in place means every later call of
that transformer runs them compiled, whatever its runtime (the same numbers: ``tests/models/
test_compiled_generate.py`` holds both to ≤ 1e-4 relative in float32).
"""
from __future__ import annotations

import torch

from framegraph.kernels.processors.streaming_rope import StreamingRotaryPosEmbed
from framegraph.models.compile import CompileSettings, compile_in_place, compiled
from framegraph.models.graphs import GraphedStep

from .sana import BlockCausalTemporalConv
from .vae import decode_chunk

__all__ = ["CompiledWanVAE", "GraphedVelocity", "compile_stream", "compile_transformer"]

MAX_GRAPHS = 16  # captured velocity graphs kept per stream (a reset that reallocates the past captures anew)


def compile_transformer(model: torch.nn.Module, settings: CompileSettings = CompileSettings()) -> int:
    """Compile the transformer's blocks (Wan's ``blocks``, SANA's ``transformer_blocks``) in place, the streaming
    processors' ``attend`` and the block-causal convs left out of the graphs (see the module docs). Idempotent;
    returns the number of blocks compiled."""
    if not settings.inductor:
        return 0
    for module in model.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and hasattr(processor, "attend") and not getattr(processor, "_eager", False):
            processor.attend = torch.compiler.disable(processor.attend)
            processor._eager = True
        if isinstance(module, BlockCausalTemporalConv) and not getattr(module, "_eager", False):
            module.forward = torch.compiler.disable(module.forward)
            module._eager = True
    blocks = model.blocks if hasattr(model, "blocks") else model.transformer_blocks  # Wan / SANA-Video
    for block in blocks:
        compile_in_place(block, settings)
    return len(blocks)


class GraphedVelocity:
    """A streamer's ``velocity`` call replayed from CUDA graphs, one per :meth:`graph_key` of the streamer (see
    the module docs); off CUDA, the call itself. Installed on the streamer by :func:`compile_stream`."""

    def __init__(self, streamer, rope: StreamingRotaryPosEmbed | None, *, enabled: bool):
        self.streamer, self.rope, self.enabled = streamer, rope, enabled
        self.velocity = type(streamer).velocity.__get__(streamer)  # the class's own, not this wrapper
        self.graphs: dict[tuple, GraphedStep] = {}
        self.pool = torch.cuda.graph_pool_handle() if enabled else None

    def __call__(self, latents: torch.Tensor, t, *rest):
        if not self.enabled or not latents.is_cuda:
            return self.velocity(latents, t, *rest)
        if self.rope is not None:
            self.rope.pin(latents)  # this chunk's rows, into the buffers the graphs read
        t = torch.as_tensor(t, device=latents.device).expand(latents.shape[0]).contiguous()  # its own dtype
        key = self.streamer.graph_key()
        step = self.graphs.get(key)
        if step is None:
            if len(self.graphs) >= MAX_GRAPHS:
                self.graphs.pop(next(iter(self.graphs)))
            step = self.graphs[key] = GraphedStep(self.velocity, pool=self.pool, name=f"velocity {key}")
        try:
            return step(latents, t, *rest)
        finally:
            if self.rope is not None:
                self.rope.unpin()


def compile_stream(stream, settings: CompileSettings = CompileSettings()):
    """The compiled runtime applied to a :class:`~.family.CausalStream`: its transformer's blocks compiled, and on
    CUDA its denoising steps graphed. Returns ``stream``."""
    model = stream.model
    compile_transformer(model, settings)
    device = next(model.parameters()).device
    rope = model.rope if isinstance(getattr(model, "rope", None), StreamingRotaryPosEmbed) else None
    stream.streamer.velocity = GraphedVelocity(stream.streamer, rope, enabled=settings.graphs(device))
    stream.compiled = True
    return stream


class CompiledWanVAE:
    """The :class:`~.stages.CausalVAEEngine` of the compiled runtime: :func:`~.vae.decode_chunk` with the decoder
    compiled (a wrapper: the shared ``vae`` is left as it is)."""

    def __init__(self, vae, settings: CompileSettings = CompileSettings()):
        self.vae, self.state = vae, None
        self._compiled = compiled(vae.decoder, settings)

    def decoder(self, x, *, feat_cache, feat_idx, first_chunk):
        """The compiled decoder on a feature cache made contiguous first: the decoder keeps slices of its inputs,
        whose strides depend on the chunk they came from, and static shapes include strides (each new pattern
        would compile the decoder again, mid-stream)."""
        for i, t in enumerate(feat_cache):
            if isinstance(t, torch.Tensor) and not t.is_contiguous():
                feat_cache[i] = t.contiguous()
        return self._compiled(x, feat_cache=feat_cache, feat_idx=feat_idx, first_chunk=first_chunk)

    def decode(self, latents):
        video, self.state = decode_chunk(self.vae, latents, self.state, decoder=self.decoder)
        return video

    def reset(self) -> None:
        self.state = None


def torch_denoiser(**_):
    """``engine(stream)`` → the stream as it is."""
    return lambda stream: stream


def compiled_denoiser(*, cuda_graphs: bool | None = None, **_):
    options = CompileSettings(cuda_graphs=cuda_graphs)
    return lambda stream: compile_stream(stream, options)


def compiled_vae(**_):
    """``engine(vae)`` → :class:`CompiledWanVAE`."""
    return CompiledWanVAE
