"""The generate pipeline's compiled runtime, ``"compiled"``; see :mod:`framegraph.models.compile`.

**Denoiser** (:func:`compile_stream`): Inductor compiles every transformer block of the stock diffusers model in
place.
This is regional compilation. The blocks share one code object, so one compilation serves all layers.
The streaming parts keep their Python bookkeeping out of the compiled graphs.
One is the self-attention processors' ``attend``: the KV cache or linear-attention state, with its frame counters.
The other is SANA's block-causal temporal conv, with its cache.
Both run as they are between the compiled pieces.
So a stream's position never becomes a guard that would recompile every chunk.

On CUDA each denoising step is replayed from a CUDA graph; see :class:`GraphedVelocity`.
A step is one velocity call of the transformer, with the cache read only.
The time, the latents and the prompt are copied into static buffers.
The rotary table of the stream's position is pinned into buffers before each step.
One graph is captured per state of the cache.
For Wan that is per number of frames it holds, until it is full.
For SANA it is before and after the first append.
The append pass runs compiled, not graphed.

**VAE decoder** (:class:`CompiledWanVAE`): :func:`~.vae.decode_chunk` with ``vae.decoder`` compiled.
Its feature cache is a Python list the decoder rebinds.
The first frame, the second and the steady ones each get their graph. It is not graphed.

The model objects are shared with the torch runtime.
Compiling the blocks in place means every later call of that transformer runs them compiled, whatever its runtime.
The numbers are the same: ``tests/models/test_compiled_generate.py`` holds both to ≤ 1e-4 relative in float32.
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
    """Compile the transformer's blocks in place: Wan's ``blocks``, SANA's ``transformer_blocks``.

    The streaming processors' ``attend`` and the block-causal convs stay out of the graphs; see the module docs.
    Idempotent. Returns the number of blocks compiled.
    """
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
    """A streamer's ``velocity`` call replayed from CUDA graphs, one per :meth:`graph_key` of the streamer.

    See the module docs. Off CUDA it is the call itself.
    :func:`compile_stream` installs it on the streamer.
    """

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
    """The compiled runtime applied to a :class:`~.family.CausalStream`. Returns ``stream``.

    Its transformer's blocks are compiled. On CUDA its denoising steps are graphed.
    """
    model = stream.model
    compile_transformer(model, settings)
    device = next(model.parameters()).device
    rope = model.rope if isinstance(getattr(model, "rope", None), StreamingRotaryPosEmbed) else None
    stream.streamer.velocity = GraphedVelocity(stream.streamer, rope, enabled=settings.graphs(device))
    stream.compiled = True
    return stream


class CompiledWanVAE:
    """The :class:`~.stages.CausalVAEEngine` of the compiled runtime: :func:`~.vae.decode_chunk` with the decoder
    compiled.

    It is a wrapper: the shared ``vae`` is left as it is.
    """

    def __init__(self, vae, settings: CompileSettings = CompileSettings()):
        self.vae, self.state = vae, None
        self._compiled = compiled(vae.decoder, settings)

    def decoder(self, x, *, feat_cache, feat_idx, first_chunk):
        """The compiled decoder on a feature cache made contiguous first.

        The decoder keeps slices of its inputs, whose strides depend on the chunk they came from.
        Static shapes include strides.
        So each new pattern would compile the decoder again, mid-stream.
        """
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
