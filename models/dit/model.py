"""``AvatarDiT``: the block-autoregressive linear DiT that denoises the avatar's face latents.

It follows SANA-Video. Latents ``[B, C, T, h, w]`` come from the video VAE.
The VAE does not compress time, so there is one latent frame per video frame.
The latents are patchified into tokens. Each block is adaLN-modulated per frame.
A block has block-causal ReLU linear attention with 3-D RoPE and a cross-attention to the frame's context.
A gated conv FFN with a causal temporal conv follows.
It predicts the flow-matching velocity ``eps - x0``; see :mod:`framegraph.models.sampler`.

Conditioning, per latent frame ``f``:

- **audio**: the features of frames ``f - audio_past_frames .. f``. These are ``AudioFeatures``' 128-d vectors, which
  already look ≤ 80 ms ahead. They enter as cross-attention tokens. They are also flattened through an MLP and added
  to the frame's adaLN vector.
- **state label**: ``[4]``, one-hot idle / speaking / listening + speech probability. It is embedded and added to the
  timestep embedding.
- **identity**: the reference latent ``[C, h, w]`` of the portrait. It is channel-concatenated to every frame's input.
  Being pixel-aligned, the model can copy what does not move. With ``identity_tokens``, its patch tokens are also in
  every frame's cross-attention context. It is deliberately *not* only in the linear-attention state. There its weight
  would fade as ``1 / frames`` over a long stream.

Three ways to call it; see :meth:`AvatarDiT.forward`:

1. ``model(x_t, t, audio, state_label, ref)``: a whole sequence, block-causal over itself. With ``t`` per frame this
   is diffusion forcing. It is the only mode of ``attention="monarch"``.
2. ``model(x_t, t, audio, state_label, ref, clean=x0)``: teacher forcing for training. Noisy block ``b`` sees the
   *clean* blocks ``< b``. This is exactly what streaming computes, in one parallel call.
3. streaming: ``stream = model.init_stream(ref)``. Per block, call ``model(x_t, t, audio, state_label,
   stream=stream)`` while denoising; it reads the state. Then ``model.append(x0, audio, state_label, stream)`` runs
   the clean block once more at ``t = 0`` to advance the state. This follows Self-Forcing and SANA-Video. Memory is
   flat however long the stream.

Attention variants:

- ``attention="linear"``: the default, with a constant-memory streaming state.
- ``"monarch"``: softmax attention approximated by a Monarch matrix, frame-causal, over the whole sequence. It needs
  all past tokens, so it has no constant-memory state. Use it for an offline teacher or offline rendering, not for the
  live stream.
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from framegraph.kernels.block_linear_attention import zero_state
from framegraph.kernels.modulation import norm_modulate

from ..pretrained import PretrainedModel, register_to_config
from .block import ATTENTIONS, DiTBlock, Geometry
from .layers import audio_windows, patchify, rope_tables, sincos_2d, timestep_embedding, unpatchify
from .state import DiTStreamState, LayerStreamState

# Named sizes: "tiny" trains on a CPU in minutes (tests, smoke runs), "small" on a CPU in hours,
# "base" is the GPU model (16x16 latents of a 256x256 face, patch 1).
DiTPreset = Literal["tiny", "small", "base"]
PRESETS: dict[DiTPreset, dict] = {
    "tiny": dict(width=128, depth=4, heads=4, ffn_ratio=2.5),
    "small": dict(width=256, depth=8, heads=8, ffn_ratio=2.5),
    "base": dict(width=768, depth=16, heads=12, ffn_ratio=2.5, sample_size=16),
}


class AvatarDiT(PretrainedModel):
    """Block-autoregressive linear DiT for avatar face latents. It predicts velocity.

    Args:
        latent_channels: ``C`` of the VAE latents, 8.
        sample_size: latent ``h`` (= ``w``) or ``[h, w]`` the model is built for. 8 for a 128x128 face, 16 for
            256x256. Other sizes divisible by ``patch_size`` also run.
        patch_size: ``p``, 1 or 2. Tokens per frame: ``n = (h / p) * (w / p)``.
        width, depth, heads: transformer width ``D``, blocks, attention heads. Head dim is ``D / heads``.
        ffn_ratio: FFN hidden width / ``D``.
        temporal_kernel: frames seen by the FFN's causal temporal conv. Its cache holds ``k - 1`` frames.
        frames_per_block: latent frames per attention block, which is per generated chunk: 1-4.
        audio_dim: audio feature size, 128.
        audio_past_frames: earlier frames in each frame's window.
        state_dim: size of the state label, 4.
        attention: ``"linear"`` or ``"monarch"``; see the module docs.
        attention_decay: per-block decay of the streamed linear-attention sums. 1 is Sana-Video's plain sum. Below 1
            it bounds the context for long streams; see ``BlockCausalSelfAttention``.
        qk_norm: RMSNorm on queries and keys.
        identity_tokens: also put the reference latent's tokens in every frame's cross-attention context.
        rope_theta: RoPE base.
        freq_dim: sinusoidal timestep embedding size.
        backend: kernel backend ``"auto" | "torch" | "triton"``. Auto is Triton on CUDA.
    """

    @register_to_config
    def __init__(self, latent_channels: int = 8, sample_size: int | list[int] = 8, patch_size: int = 1,
                 width: int = 128, depth: int = 4, heads: int = 4, ffn_ratio: float = 2.5, temporal_kernel: int = 3,
                 frames_per_block: int = 1, audio_dim: int = 128, audio_past_frames: int = 2, state_dim: int = 4,
                 attention: str = "linear", attention_decay: float = 1.0, qk_norm: bool = True,
                 identity_tokens: bool = True, rope_theta: float = 10_000.0, freq_dim: int = 256,
                 backend: str = "auto"):
        super().__init__()
        h, w = (sample_size, sample_size) if isinstance(sample_size, int) else tuple(sample_size)
        if patch_size not in (1, 2, 4) or h % patch_size or w % patch_size:
            raise ValueError(f"AvatarDiT: patch_size={patch_size} with sample_size={sample_size}; expected a patch "
                             f"of 1, 2 or 4 dividing the latent size")
        if width % heads or (width // heads) % 2:
            raise ValueError(f"AvatarDiT: width={width}, heads={heads}; expected an even head dim width / heads")
        if attention not in ATTENTIONS:
            raise ValueError(f"AvatarDiT: attention={attention!r}; expected one of {ATTENTIONS}")
        if attention == "monarch" and frames_per_block != 1:
            raise ValueError(f"AvatarDiT: attention='monarch' is frame-causal; expected frames_per_block=1, "
                             f"got {frames_per_block}")
        if not 1 <= frames_per_block <= 16 or audio_past_frames < 0 or temporal_kernel < 1:
            raise ValueError(f"AvatarDiT: frames_per_block={frames_per_block} (1..16), audio_past_frames="
                             f"{audio_past_frames} (>= 0), temporal_kernel={temporal_kernel} (>= 1)")
        token_dim = latent_channels * patch_size**2
        window = audio_past_frames + 1
        self.x_embed = nn.Linear(2 * token_dim, width)  # noisy latent ⊕ reference latent, per token
        self.ref_embed = nn.Linear(token_dim, width) if identity_tokens else None
        self.time_embed = nn.Sequential(nn.Linear(freq_dim, width), nn.SiLU(), nn.Linear(width, width))
        self.label_embed = nn.Sequential(nn.Linear(state_dim, width), nn.SiLU(), nn.Linear(width, width))
        self.audio_tokens = nn.Linear(audio_dim, width)
        self.audio_pos = nn.Parameter(torch.randn(window, width) * 0.02)
        self.audio_pool = nn.Sequential(nn.Linear(window * audio_dim, width), nn.SiLU(), nn.Linear(width, width))
        self.adaln = nn.Sequential(nn.SiLU(), nn.Linear(width, 6 * width))
        hidden = int(round(width * ffn_ratio))
        self.blocks = nn.ModuleList(
            DiTBlock(width, heads, hidden, temporal_kernel, qk_norm, attention, backend, attention_decay)
            for _ in range(depth))
        self.final_adaln = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))
        self.final_proj = nn.Linear(width, token_dim)
        nn.init.zeros_(self.final_proj.weight)
        nn.init.zeros_(self.final_proj.bias)

    @classmethod
    def from_preset(cls, name: DiTPreset, **overrides) -> AvatarDiT:
        """A fresh model of a named size: ``"tiny"``, ``"small"`` or ``"base"``. Config overrides go on top."""
        if name not in PRESETS:
            raise ValueError(f"AvatarDiT.from_preset: unknown preset {name!r}; expected one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    # ---- geometry -----------------------------------------------------------------------------
    @property
    def latent_size(self) -> tuple[int, int]:
        s = self.config.sample_size
        return (s, s) if isinstance(s, int) else tuple(s)

    @property
    def head_dim(self) -> int:
        return self.config.width // self.config.heads

    def _geometry(self, batch: int, frames: int, height: int, width: int, offset: int, device) -> Geometry:
        p = self.config.patch_size
        hh, ww = height // p, width // p
        rope = rope_tables(offset, frames, hh, ww, self.head_dim, self.config.rope_theta, device)
        return Geometry(batch, frames, hh, ww, self.config.frames_per_block, rope)

    def _check(self, x: torch.Tensor, audio: torch.Tensor, state_label: torch.Tensor, what: str) -> None:
        c = self.config
        if x.dim() != 5 or x.shape[1] != c.latent_channels:
            raise ValueError(f"AvatarDiT: {what} has shape {tuple(x.shape)}; expected "
                             f"[B, C={c.latent_channels}, T, h, w]")
        B, _, T, h, w = x.shape
        if h % c.patch_size or w % c.patch_size:
            raise ValueError(f"AvatarDiT: latent size {h}x{w} is not divisible by patch_size={c.patch_size}")
        if T % c.frames_per_block:
            raise ValueError(f"AvatarDiT: {what} has T={T} frames; expected a multiple of frames_per_block="
                             f"{c.frames_per_block}")
        if tuple(audio.shape) != (B, T, c.audio_dim):
            raise ValueError(f"AvatarDiT: audio has shape {tuple(audio.shape)}; expected [B, T, F]="
                             f"{(B, T, c.audio_dim)}")
        if tuple(state_label.shape) != (B, T, c.state_dim):
            raise ValueError(f"AvatarDiT: state_label has shape {tuple(state_label.shape)}; expected [B, T, S]="
                             f"{(B, T, c.state_dim)}")

    @staticmethod
    def _frame_times(t, B: int, T: int, device) -> torch.Tensor:
        """``t`` as a scalar, ``[B]`` or ``[B, T]`` → ``float32 [B, T]``."""
        t = torch.as_tensor(t, dtype=torch.float32, device=device)
        if t.dim() == 0:
            return t.expand(B, T)
        if t.dim() == 1 and t.shape[0] == B:
            return t[:, None].expand(B, T)
        if t.dim() == 2 and tuple(t.shape) == (B, T):
            return t
        raise ValueError(f"AvatarDiT: t has shape {tuple(t.shape)}; expected a scalar, [B]=({B},) or [B, T]=({B}, {T})")

    def _ref(self, ref: torch.Tensor, B: int, h: int, w: int) -> torch.Tensor:
        c = self.config
        if ref.dim() == 3:
            ref = ref[None]
        if ref.dim() != 4 or tuple(ref.shape[1:]) != (c.latent_channels, h, w) or ref.shape[0] not in (1, B):
            raise ValueError(f"AvatarDiT: ref has shape {tuple(ref.shape)}; expected [B, C, h, w] or [C, h, w] with "
                             f"C, h, w={(c.latent_channels, h, w)}")
        return ref.expand(B, -1, -1, -1)

    # ---- embeddings ---------------------------------------------------------------------------
    def _embed(self, x: torch.Tensor, ref: torch.Tensor, geo: Geometry) -> torch.Tensor:
        """``x [B, C, T, h, w]`` ⊕ ``ref`` → tokens ``[B, T*n, D]``, fixed 2-D positions added."""
        T = x.shape[2]
        inp = torch.cat([x, ref[:, :, None].expand(-1, -1, T, -1, -1).to(x.dtype)], dim=1)
        tokens = self.x_embed(patchify(inp, self.config.patch_size))
        pos = sincos_2d(geo.height, geo.width, self.config.width, tokens.device).to(tokens.dtype)
        return (tokens.unflatten(1, (T, -1)) + pos).flatten(1, 2)

    def _ref_kv(self, ref: torch.Tensor, geo: Geometry) -> list:
        """Per block, the identity tokens' cross-attention keys/values, or Nones."""
        if self.ref_embed is None:
            return [None] * len(self.blocks)
        tokens = self.ref_embed(patchify(ref[:, :, None], self.config.patch_size))  # [B, n, D]
        tokens = tokens + sincos_2d(geo.height, geo.width, self.config.width, tokens.device).to(tokens.dtype)
        return [blk.cross.kv(tokens) for blk in self.blocks]

    def _conditioning(self, t: torch.Tensor, audio: torch.Tensor, state_label: torch.Tensor,
                      history: torch.Tensor | None):
        """Per-frame conditioning: ``(c [B, T, D], adaLN mod [B, T, 6, D], audio tokens [B*T, W, D])``."""
        windows = audio_windows(audio, history, self.config.audio_past_frames)  # [B, T, W, F]
        c = (self.time_embed(timestep_embedding(t, self.config.freq_dim).to(audio.dtype))
             + self.label_embed(state_label) + self.audio_pool(windows.flatten(2)))
        mod = self.adaln(c).unflatten(-1, (6, -1))
        tokens = (self.audio_tokens(windows) + self.audio_pos).flatten(0, 1)
        return c, mod, tokens

    def _head(self, h: torch.Tensor, c: torch.Tensor, geo: Geometry, height: int, width: int) -> torch.Tensor:
        """Final adaLN + linear + unpatchify: ``[B, T*n, D]`` → velocity ``[B, C, T, h, w]``."""
        B, T, n = geo.batch, geo.frames, geo.tokens_per_frame
        shift, scale = self.final_adaln(c).flatten(0, 1)[:, None].chunk(2, dim=-1)  # [B*T, 1, D] each
        out = norm_modulate(h.reshape(B * T, n, -1), scale, shift, backend=self.config.backend)
        out = self.final_proj(out).reshape(B, T * n, -1)
        return unpatchify(out, self.config.latent_channels, T, height, width, self.config.patch_size)

    # ---- forward ------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, t, audio: torch.Tensor, state_label: torch.Tensor,
                ref: torch.Tensor | None = None, *, clean: torch.Tensor | None = None,
                stream: DiTStreamState | None = None, rope: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> torch.Tensor:
        """Predict the velocity ``eps - x0`` of noisy latents.

        Args:
            x: ``[B, C, T, h, w]`` noisy latents ``x_t``. ``T`` is a multiple of ``frames_per_block``, exactly
                ``frames_per_block`` when streaming.
            t: time in [0, 1], where 1 is noise. A scalar, ``[B]`` or ``[B, T]`` with one per frame. Keep it constant
                within a block.
            audio: ``[B, T, audio_dim]`` audio features, one vector per latent frame.
            state_label: ``[B, T, state_dim]`` idle / speaking / listening one-hot + speech probability.
            ref: ``[B, C, h, w]`` or ``[C, h, w]`` reference latent. Not needed with ``stream``.
            clean: ``[B, C, T, h, w]`` clean latents of the same frames, for teacher forcing. Block ``b`` attends to
                the clean blocks ``< b``. Gradients flow through both passes.
            stream: a :class:`DiTStreamState` to continue. It is read only; see :meth:`append`.
            rope: streaming only. The rotary tables ``(cos, sin)`` of the block's positions. By default they are
                computed from ``stream.frames``. The ONNX export passes them as graph inputs; see :meth:`stream_rope`.
                ``[B, N, head_dim]`` tables give each row its own positions: a batch of sessions' streams.

        Returns:
            ``[B, C, T, h, w]`` predicted velocity, in x's dtype.
        """
        self._check(x, audio, state_label, "x")
        audio, state_label = audio.to(x.dtype), state_label.to(x.dtype)
        B, _, T, h, w = x.shape
        tt = self._frame_times(t, B, T, x.device)
        if stream is not None:
            if clean is not None:
                raise ValueError("AvatarDiT: pass either clean= (teacher forcing) or stream=, not both")
            if T != self.config.frames_per_block:
                raise ValueError(f"AvatarDiT: a streamed denoising call takes one block of frames_per_block="
                                 f"{self.config.frames_per_block} frames; x has T={T}")
            self._check_stream(stream, B, h, w)
            geo = self._stream_geometry(B, T, h, w, stream, rope)
            c, mod, tokens = self._conditioning(tt, audio, state_label, stream.audio_history)
            hs = self._embed(x, stream.ref, geo)
            for blk, layer, ref_kv in zip(self.blocks, stream.layers, stream.ref_kv):
                hs, _, _ = blk.forward_self(hs, mod, geo, ref_kv, tokens, state=layer)
            return self._head(hs, c, geo, h, w)
        if ref is None:
            raise ValueError("AvatarDiT: ref (the reference latent) is required without a stream")
        ref = self._ref(ref, B, h, w)
        geo = self._geometry(B, T, h, w, 0, x.device)
        ref_kvs = self._ref_kv(ref, geo)
        c, mod, tokens = self._conditioning(tt, audio, state_label, None)
        hs = self._embed(x, ref, geo)
        if clean is None:
            for blk, ref_kv in zip(self.blocks, ref_kvs):
                hs, _, _ = blk.forward_self(hs, mod, geo, ref_kv, tokens)
            return self._head(hs, c, geo, h, w)
        if clean.shape != x.shape:
            raise ValueError(f"AvatarDiT: clean has shape {tuple(clean.shape)}; expected x's shape {tuple(x.shape)}")
        _, mod_clean, _ = self._conditioning(torch.zeros_like(tt), audio, state_label, None)
        hc = self._embed(clean, ref, geo)
        for blk, ref_kv in zip(self.blocks, ref_kvs):
            hc, _, context = blk.forward_self(hc, mod_clean, geo, ref_kv, tokens, want_context=True)
            hs = blk.forward_context(hs, mod, geo, ref_kv, tokens, context)
        return self._head(hs, c, geo, h, w)

    # ---- streaming ----------------------------------------------------------------------------
    def init_stream(self, ref: torch.Tensor, batch: int | None = None) -> DiTStreamState:
        """A fresh :class:`DiTStreamState` for reference latent ``ref [B, C, h, w]`` or ``[C, h, w]``.

        A single reference is copied ``batch`` times.
        Build it under the grad mode you will stream in: ``torch.inference_mode()`` for inference.
        """
        c = self.config
        if ref.dim() == 3:
            ref = ref[None]
        B = batch or ref.shape[0]
        h, w = ref.shape[-2:]
        ref = self._ref(ref.to(self.device, self.dtype), B, h, w).contiguous()
        geo = self._geometry(B, 1, h, w, 0, ref.device)
        with torch.no_grad():
            ref_kv = [None if kv is None else tuple(t.detach().contiguous() for t in kv)
                      for kv in self._ref_kv(ref, geo)]
        d, n = self.head_dim, geo.tokens_per_frame
        layers = [LayerStreamState(attn=zero_state(B, c.heads, d, d, device=ref.device),
                                   ffn_cache=ref.new_zeros(B, c.temporal_kernel - 1, n, c.width))
                  for _ in self.blocks]
        history = ref.new_zeros(B, c.audio_past_frames, c.audio_dim)
        return DiTStreamState(ref=ref, ref_kv=ref_kv, layers=layers, audio_history=history)

    def _check_stream(self, stream: DiTStreamState, B: int, h: int, w: int) -> None:
        if self.config.attention != "linear":
            raise ValueError(f"AvatarDiT: attention={self.config.attention!r} cannot stream (no constant-memory "
                             f"state); use attention='linear'")
        if stream.batch != B or tuple(stream.ref.shape[-2:]) != (h, w):
            raise ValueError(f"AvatarDiT: the stream holds batch {stream.batch} of {tuple(stream.ref.shape[-2:])} "
                             f"latents; got batch {B} of {(h, w)}")

    def stream_rope(self, stream: DiTStreamState, frames: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary tables ``(cos, sin)`` of the next ``frames`` positions of ``stream``.

        Each is float32 ``[frames * n, head_dim]``. ``frames`` defaults to one block.
        """
        h, w = stream.ref.shape[-2:]
        T = frames or self.config.frames_per_block
        return self._geometry(stream.batch, T, h, w, stream.frames, stream.ref.device).rope

    def _stream_geometry(self, B: int, T: int, h: int, w: int, stream: DiTStreamState, rope) -> Geometry:
        if rope is None:
            return self._geometry(B, T, h, w, stream.frames, stream.ref.device)
        p = self.config.patch_size  # int(): under the ONNX tracer, sizes taken from shapes are tensors
        B = B if torch.jit.is_tracing() else int(B)  # traced, the batch stays a size of the graph's inputs
        return Geometry(B, int(T), int(h) // p, int(w) // p, self.config.frames_per_block, tuple(rope))

    def append_step(self, x0: torch.Tensor, audio: torch.Tensor, state_label: torch.Tensor, stream: DiTStreamState,
                    rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[torch.Tensor]:
        """What :meth:`append` writes, without writing it.

        Per layer it gives ``kv, k_sum, ffn_cache``, then the new audio history.
        That is the order of the streamed part in :meth:`DiTStreamState.tensors`.
        The ONNX export returns these as graph outputs. ``rope``: as in :meth:`forward`.
        """
        self._check(x0, audio, state_label, "x0")
        audio, state_label = audio.to(x0.dtype), state_label.to(x0.dtype)
        B, _, T, h, w = x0.shape
        self._check_stream(stream, B, h, w)
        geo = self._stream_geometry(B, T, h, w, stream, rope)
        c, mod, tokens = self._conditioning(x0.new_zeros(B, T), audio, state_label, stream.audio_history)
        hs = self._embed(x0, stream.ref, geo)
        out = []
        for blk, layer, ref_kv in zip(self.blocks, stream.layers, stream.ref_kv):
            hs, (attn, cache), _ = blk.forward_self(hs, mod, geo, ref_kv, tokens, state=layer)
            out += [attn.kv.detach(), attn.k_sum.detach(), cache.detach()]
        P = self.config.audio_past_frames
        history = stream.audio_history
        if P:
            seq = torch.cat([stream.audio_history, audio.detach().to(stream.audio_history.dtype)], dim=1)
            history = seq[:, seq.shape[1] - P:]
        return out + [history]

    def append(self, x0: torch.Tensor, audio: torch.Tensor, state_label: torch.Tensor, stream: DiTStreamState) -> None:
        """Advance ``stream`` past clean latents ``x0 [B, C, T, h, w]``. ``T`` is a multiple of ``frames_per_block``.

        It runs one block-causal pass at ``t = 0``.
        It updates every layer's attention sums and FFN cache in place, detached.
        It also updates the audio history and the frame counter.
        """
        new = self.append_step(x0, audio, state_label, stream)
        for layer, i in zip(stream.layers, range(0, 3 * len(stream.layers), 3)):
            for t, v in zip(layer.tensors(), new[i:i + 3]):
                t.copy_(v)
        stream.audio_history.copy_(new[-1])
        stream.frames += x0.shape[2]
