"""``VideoVAE``: a small causal video autoencoder for the generated face region.

The defaults are a 128² region, 8 latent channels, 16× spatial compression and no temporal compression.
Shapes::

    x  float32 [B, 3, T, H, W]  in [-1, 1]   ──encode──▶  z  float32 [B, C, T, H/16, W/16]  (~unit variance)
    z                                          ──decode──▶  x̂  float32 [B, 3, T, H, W]  (≈ [-1, 1], not clamped)

**Architecture.** Per frame it is a plain 2-D conv autoencoder. It starts with a ``patch_size``
pixel-unshuffle, so no conv runs at full resolution. Each level has GroupNorm/SiLU residual blocks. A
stride-2 conv goes down to the next width. ``block_out_channels`` are the widths per level. Then come a
middle block and a 3×3 conv to the latent moments. The decoder mirrors it. It upsamples by nearest ×2, each
followed by a conv to the next width. It ends in a pixel shuffle. Spatial compression is
``patch_size · 2^(len(block_out_channels) - 1)``. By default that is 2 · 8 = 16. GroupNorm normalises each
frame on its own, so no statistic mixes frames. Frames run in channels-last layout. On a CPU, oneDNN runs it
faster. In half precision, cuDNN prefers it.

**Causal in time.** Some residual blocks also have a temporal branch. They are those of the coarser levels,
from ``temporal_from_level`` on, and the middle blocks. The branch is a ``(temporal_kernel, 1, 1)``
convolution. It sees frame ``t`` and the ``temporal_kernel - 1`` frames before it, never after. It is
zero-initialised, so a fresh model starts as a per-frame image autoencoder. Before a stream's first frame, the
missing past is the first frame repeated. So a still image encodes like a still video.

Streaming: each temporal conv keeps its last ``temporal_kernel - 1`` input frames in a **cache**. The cache
is a plain ``dict[str, Tensor]``, passed in and returned. It is never hidden in the module. This is
flash-linear-attention style::

    cache = None
    for z_chunk in chunks:                      # [B, C, T_chunk, h, w], any T_chunk >= 1
        frames, cache = vae.decode(z_chunk, cache)

That gives the same frames as ``vae.decode(z_all)``.

They agree to float rounding, ~1e-6. The encoder works the same
way, with ``encode(x_chunk, cache)``. Encoder and decoder caches are separate dicts.

**Identity reference.** It is optional, with ``reference_skip=True``. The avatar always knows its reference portrait, so
the decoder may read it. A small per-image :class:`ReferenceEncoder` reads the reference region ``[B, 3, H, W]``. It
makes features at every decoder resolution. A 3×3 conv of ``[decoder features, reference features]`` comes after each
decoder level. One more comes before the output conv. Each one's output is added to the decoder features. Those convs
are zero-initialised. The latent then has to carry what *changes*: mouth, eyes, pose. Fine identity detail comes from
the reference at full resolution: texture, hair, the eyes' shape. It is not squeezed through the 16× latent. ``decode(z,
cache, reference=ref)`` computes the reference features once and keeps them in the cache. Later chunks of the stream
pass only the cache.

**Reference warp.** It is optional, with ``reference_warp=True``, and needs ``reference_skip``. After the
decoder has drawn the frame, the reference is moved onto it. An affine registration of the reference to the
drawn frame gives the head pose. It is Lucas–Kanade, from :mod:`.register`. The drawn face may be soft, but
its pose is right. Low frequencies are what fix a pose. A head then gives a blend weight per pixel. It sees
the decoder's features, the drawn frame and the moved reference side by side. The frame is

    x̂ = rgb + m · (warp(reference, pose) − rgb),      m = clamp(blend, 0, 1)

So the decoder can hand back the reference's own pixels, moved with the head. It does so where the face did
not change, as in hair, open eyes and cheeks. It does not redraw them from the 16× latent. It draws only what
changed, such as the mouth and blinks. The blend head starts at zero, so ``m = 0``. The clamp still passes
gradients at 0. So the warp is off until trained. A trained ``reference_skip`` decoder given the head decodes
exactly as before. Then :func:`~.train.train_vae` with ``train_encoder=False`` can teach it the warp. The
encoder is not touched. The latent space stays valid, and so does any denoiser trained on it.

**Latent.** The posterior is a diagonal Gaussian. It is KL-regularised with a small weight while training.
That keeps the latent smooth and bounded, so a denoiser's small errors decode gracefully. Then comes a
per-channel shift and scale. The config stores them as ``latent_mean`` / ``latent_std``. After training,
:func:`~.train.train_vae` measures them on the training frames. So :meth:`VideoVAE.encode` returns a latent
with about zero mean and unit variance per channel. :meth:`VideoVAE.decode` takes the same. That is the scale the
denoiser expects. ``encode`` returns the posterior mean unless ``sample=True``.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..pretrained import PretrainedModel, register_to_config
from .register import affine_sample, register_affine

Cache = dict[str, Tensor]


class _CacheIO:
    """Threads a cache dict through one encode/decode call. It reads the old one and collects the new one."""

    def __init__(self, old: Cache | None):
        self.old = old or {}
        self.new: Cache = {}


class CausalTemporalConv(nn.Module):
    """Convolution along time over ``kernel`` frames that only looks back.

    ``forward(x [B·T, C, H, W], frames=T, io)`` → ``[B·T, C, H, W]``. Output frame ``t`` is a linear map of
    input frames ``t - kernel + 1 .. t``. The map works per pixel. That is a ``(kernel, 1, 1)`` conv. It is computed
    as one matmul over the stacked window in channels-last layout. The past comes from
    ``io.old[self.cache_key]``, shaped ``[B, kernel - 1, H, W, C]``. At the start of a stream it is the first
    frame repeated. The last ``kernel - 1`` frames are put in ``io.new`` for the next call. Weights start at
    zero, so the branch is off until trained.
    """

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.kernel = kernel
        self.cache_key = ""  # set by VideoVAE to the module's name
        self.proj = nn.Linear(kernel * channels, channels)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: Tensor, frames: int, io: _CacheIO) -> Tensor:
        k = self.kernel
        bt, c, h, w = x.shape
        xl = x.permute(0, 2, 3, 1).reshape(bt // frames, frames, h, w, c)  # free for channels-last x
        if k > 1:
            past = io.old.get(self.cache_key)
            if past is None:
                past = xl[:, :1].expand(-1, k - 1, -1, -1, -1)
            elif past.shape[0] != xl.shape[0] or past.shape[2:] != xl.shape[2:]:
                raise ValueError(f"VideoVAE cache entry {self.cache_key!r} has shape {list(past.shape)}, which does "
                                 f"not fit frames [B={xl.shape[0]}, H={h}, W={w}, C={c}]; was the cache made for "
                                 f"another batch or size?")
            xp = torch.cat([past.to(xl.dtype), xl], dim=1)  # [B, k - 1 + T, H, W, C]
            io.new[self.cache_key] = xp[:, -(k - 1):].detach().clone()
            xl = torch.cat([xp[:, j:j + frames] for j in range(k)], dim=-1)  # [B, T, H, W, k·C], oldest first
        y = self.proj(xl)
        return y.reshape(bt, h, w, c).permute(0, 3, 1, 2)


class ResBlock(nn.Module):
    """Residual block on ``[B·T, C, H, W]`` frames: two GroupNorm→SiLU→3×3 convs.

    When ``temporal_kernel`` is not None, the causal temporal branch follows: ``x + tconv(SiLU(GroupNorm(x)))``."""

    def __init__(self, c_in: int, c_out: int, groups: int, temporal_kernel: int | None):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.skip = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()
        self.temporal = temporal_kernel is not None
        if self.temporal:
            self.norm_t = nn.GroupNorm(groups, c_out)
            self.tconv = CausalTemporalConv(c_out, temporal_kernel)

    def forward(self, x: Tensor, frames: int, io: _CacheIO) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        x = self.skip(x) + h
        if self.temporal:
            x = x + self.tconv(F.silu(self.norm_t(x)), frames, io)
        return x


def _groups(channels: int, groups: int) -> int:
    if channels % groups:
        raise ValueError(f"VideoVAE: channel width {channels} is not divisible by norm_groups={groups}")
    return groups


def _down_path(c_in: int, widths: Sequence[int], level) -> tuple[nn.Conv2d, nn.ModuleList, nn.ModuleList, int]:
    """The downward path of an encoder: ``(conv_in, blocks, downs, c)``.

    ``conv_in`` is a 3×3 conv from ``c_in`` to ``widths[0]`` channels. ``blocks`` has one level per width.
    ``level(c, w, i)`` makes level ``i``'s module, from ``c`` to ``w`` channels. ``downs`` holds a stride-2
    conv straight to the next width after every level but the last. ``c`` is the channels at the bottom,
    ``widths[-1]``."""
    conv_in = nn.Conv2d(c_in, widths[0], 3, padding=1)
    blocks, downs = nn.ModuleList(), nn.ModuleList()
    c = widths[0]
    for i, w in enumerate(widths):
        blocks.append(level(c, w, i))
        c = w
        if i < len(widths) - 1:
            downs.append(nn.Conv2d(c, widths[i + 1], 3, stride=2, padding=1))
            c = widths[i + 1]
    return conv_in, blocks, downs, c


class Encoder(nn.Module):
    """``[B·T, 3·p², H/p, W/p]`` → moments ``[B·T, 2·C, H/f, W/f]``."""

    def __init__(self, c_in: int, widths: Sequence[int], layers: int, latent: int, groups: int, kt: int,
                 t_from: int):
        super().__init__()

        def level(c: int, w: int, i: int) -> nn.ModuleList:  # ``layers`` residual blocks, c → w channels
            return nn.ModuleList(ResBlock(c if j == 0 else w, w, _groups(w, groups), kt if i >= t_from else None)
                                 for j in range(layers))

        self.conv_in, self.blocks, self.downs, c = _down_path(c_in, widths, level)
        self.mid = ResBlock(c, c, groups, kt)
        self.norm_out = nn.GroupNorm(groups, c)
        self.conv_out = nn.Conv2d(c, 2 * latent, 3, padding=1)

    def forward(self, x: Tensor, frames: int, io: _CacheIO) -> Tensor:
        x = self.conv_in(x)
        for i, level in enumerate(self.blocks):
            for block in level:
                x = block(x, frames, io)
            if i < len(self.downs):
                x = self.downs[i](x)
        x = self.mid(x, frames, io)
        return self.conv_out(F.silu(self.norm_out(x)))


class Decoder(nn.Module):
    """Latent ``[B·T, C, H/f, W/f]`` → ``[B·T, 3·p², H/p, W/p]``.

    With ``reference`` it also takes the :class:`ReferenceEncoder` features, per clip as ``[B, ...]``. It
    fuses them after every level."""

    def __init__(self, c_out: int, widths: Sequence[int], layers: int, latent: int, groups: int, kt: int,
                 t_from: int, reference: bool = False, warp: bool = False):
        super().__init__()
        n = len(widths)
        widths = list(widths)[::-1]
        c = widths[0]
        self.conv_in = nn.Conv2d(latent, c, 3, padding=1)
        self.mid = ResBlock(c, c, groups, kt)
        self.blocks = nn.ModuleList()
        self.ups = nn.ModuleList()
        for i, w in enumerate(widths):
            level = nn.ModuleList()
            for _ in range(layers):
                level.append(ResBlock(c, w, _groups(w, groups), kt if n - 1 - i >= t_from else None))
                c = w
            self.blocks.append(level)
            if i < len(widths) - 1:  # nearest ×2, then a conv straight to the next (smaller) width
                self.ups.append(nn.Conv2d(c, widths[i + 1], 3, padding=1))
                c = widths[i + 1]
        self.norm_out = nn.GroupNorm(groups, c)
        self.conv_out = nn.Conv2d(c, c_out, 3, padding=1)
        self.fuse = None
        if reference:  # one zero-initialised conv per level, and one before the output conv
            ins = [2 * w for w in widths] + [2 * widths[-1] + c_out]
            outs = list(widths) + [widths[-1]]
            self.fuse = nn.ModuleList(nn.Conv2d(i, o, 3, padding=1) for i, o in zip(ins, outs))
            for conv in self.fuse:
                nn.init.zeros_(conv.weight)
                nn.init.zeros_(conv.bias)
        self.blend_head = None
        if warp:  # a blend weight per output pixel (after the pixel shuffle); zero at start: off
            self.patch = round((c_out // 3) ** 0.5)
            self.blend_head = nn.Conv2d(c + 2 * c_out, self.patch ** 2, 3, padding=1)
            nn.init.zeros_(self.blend_head.weight)
            nn.init.zeros_(self.blend_head.bias)

    def _fused(self, x: Tensor, i: int, ref: list[Tensor] | None, frames: int) -> Tensor:
        if self.fuse is None:
            return x
        r = ref[i].repeat_interleave(frames, dim=0).to(x.dtype)  # [B, c, h, w] → [B·T, c, h, w]
        return x + self.fuse[i](torch.cat([x, r], dim=1))

    def forward(self, z: Tensor, frames: int, io: _CacheIO, ref: list[Tensor] | None = None) -> Tensor:
        x = self.mid(self.conv_in(z), frames, io)
        for i, level in enumerate(self.blocks):
            for block in level:
                x = block(x, frames, io)
            x = self._fused(x, i, ref, frames)
            if i < len(self.ups):
                x = self.ups[i](F.interpolate(x, scale_factor=2.0, mode="nearest"))
        x = self._fused(x, len(self.blocks), ref, frames)
        h = F.silu(self.norm_out(x))
        if self.blend_head is None:
            return self.conv_out(h)
        return self._warp_blend(h, self.conv_out(h), ref[-1], frames)

    def _warp_blend(self, h: Tensor, out: Tensor, pixels: Tensor, frames: int) -> Tensor:
        """Blend the moved reference into the drawn frame; see the module docstring.

        ``h [B·T, c, H/p, W/p]`` are the final features. ``out [B·T, 3·p², H/p, W/p]`` is the drawn frame.
        ``pixels [B, 3, H, W]`` is the reference. Returns ``rgb + m · (warp(pixels) − rgb)``, pixel-unshuffled like
        ``out``."""
        p = self.patch
        rgb = F.pixel_shuffle(out, p)  # [B·T, 3, H, W]
        src = pixels.to(rgb.dtype).repeat_interleave(frames, dim=0)
        theta = register_affine(src, rgb)  # the drawn face's head pose (its low frequencies are right)
        warped = affine_sample(src, theta)
        # the blend weight sees both candidates, so it can take the portrait wherever the two agree
        m = self.blend_head(torch.cat([h, out, F.pixel_unshuffle(warped, p)], dim=1))
        m = F.pixel_shuffle(m, p).clamp(0.0, 1.0)
        return F.pixel_unshuffle(rgb + m * (warped - rgb), p)


class ReferenceEncoder(nn.Module):
    """Reference image → features at every decoder fusion point, finest last.

    The input is the pixel-unshuffled reference ``[B, 3·p², H/p, W/p]``. The output is a list of
    ``[B, c_i, H/f_i, W/f_i]`` in decoder order. There is one per decoder level, coarsest first, with the
    decoder's widths. Then comes the finest once more, with the unshuffled reference pixels concatenated. That
    last one is what the output conv fuses with.
    """

    def __init__(self, c_in: int, widths: Sequence[int], groups: int):
        super().__init__()
        self.conv_in, self.blocks, self.downs, _ = _down_path(
            c_in, widths, lambda c, w, i: ResBlock(c, w, _groups(w, groups), None))

    def forward(self, pixels: Tensor) -> list[Tensor]:
        x = self.conv_in(pixels)
        feats = []
        for i, block in enumerate(self.blocks):
            x = block(x, 1, _CacheIO(None))
            feats.append(x)
            if i < len(self.downs):
                x = self.downs[i](x)
        feats = feats[::-1]  # coarsest first, as the decoder runs
        return feats + [torch.cat([feats[-1], pixels], dim=1)]


class VideoVAE(PretrainedModel):
    """Causal video autoencoder for the face region; see the module docstring.

    Args:
        in_channels: image channels: 3, RGB in [-1, 1].
        latent_channels: C of the latent.
        block_out_channels: conv width per resolution level. Each level after the first halves the size.
        patch_size: pixel-unshuffle factor in front of the first conv: 1, 2 or 4.
        layers_per_block: residual blocks per level of the encoder.
        decoder_layers_per_block: the same for the decoder.
        temporal_kernel: frames each causal temporal conv sees: itself and ``temporal_kernel - 1`` before.
        temporal_from_level: residual blocks of levels ``>= temporal_from_level`` have a temporal branch.
            Level 0 is the finest. The middle blocks have one too. The finest levels stay per-frame. That is
            cheaper, and fine detail needs no temporal context.
        norm_groups: GroupNorm groups. It divides every width.
        sample_size: side in px of the square region it was built and trained for. It is informational.
            Any size that is a multiple of :attr:`spatial_compression` works.
        latent_mean: per-channel shift of the raw posterior mean. None means 0.
        latent_std: per-channel scale of the raw posterior mean. None means 1.
            ``encode`` returns ``(raw - mean) / std``; ``decode`` undoes it.
        reference_skip: the decoder also reads an identity reference image; see the module docstring.
            ``decode`` then needs ``reference=``, or a cache that holds its features.
        reference_warp: the decoder may also copy the reference's pixels. It moves them into the pose of the
            face it drew. It blends them per pixel; see the module docstring. Needs ``reference_skip``.
    """

    @register_to_config
    def __init__(self, in_channels: int = 3, latent_channels: int = 8,
                 block_out_channels: tuple[int, ...] = (32, 64, 128, 128), patch_size: int = 2,
                 layers_per_block: int = 1, decoder_layers_per_block: int = 1, temporal_kernel: int = 3,
                 temporal_from_level: int = 1, norm_groups: int = 8, sample_size: int = 128,
                 latent_mean: list[float] | None = None, latent_std: list[float] | None = None,
                 reference_skip: bool = False, reference_warp: bool = False):
        super().__init__()
        if reference_warp and not reference_skip:
            raise ValueError("VideoVAE: reference_warp=True needs reference_skip=True (the warp reads the reference)")
        if patch_size < 1 or not block_out_channels or min(block_out_channels) < 1:
            raise ValueError(f"VideoVAE: patch_size={patch_size}, block_out_channels={block_out_channels} must be >= 1")
        if temporal_kernel < 1:
            raise ValueError(f"VideoVAE: temporal_kernel={temporal_kernel} must be >= 1")
        if latent_channels < 1:
            raise ValueError(f"VideoVAE: latent_channels={latent_channels} must be >= 1")
        p2 = in_channels * patch_size * patch_size
        self.encoder = Encoder(p2, block_out_channels, layers_per_block, latent_channels, norm_groups,
                               temporal_kernel, temporal_from_level)
        self.decoder = Decoder(p2, block_out_channels, decoder_layers_per_block, latent_channels, norm_groups,
                               temporal_kernel, temporal_from_level, reference=reference_skip, warp=reference_warp)
        self.reference_encoder = ReferenceEncoder(p2, block_out_channels, norm_groups) if reference_skip else None
        for name, m in self.named_modules():
            if isinstance(m, CausalTemporalConv):
                m.cache_key = name
        self.register_buffer("_shift", torch.zeros(1, latent_channels, 1, 1, 1), persistent=False)
        self.register_buffer("_scale", torch.ones(1, latent_channels, 1, 1, 1), persistent=False)
        self._load_latent_stats(latent_mean, latent_std)

    # ---- geometry -----------------------------------------------------------------------------
    @property
    def spatial_compression(self) -> int:
        """Image pixels per latent pixel along each side; 16 by default."""
        c = self.config
        return c.patch_size * 2 ** (len(c.block_out_channels) - 1)

    @property
    def latent_channels(self) -> int:
        return self.config.latent_channels

    def latent_shape(self, frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """``(C, T, h, w)`` of the latent of ``frames`` frames of ``height × width`` pixels."""
        self._check_size(height, width)
        f = self.spatial_compression
        return (self.config.latent_channels, frames, height // f, width // f)

    def _check_size(self, height: int, width: int) -> None:
        f = self.spatial_compression
        if height % f or width % f or height <= 0 or width <= 0:
            raise ValueError(f"VideoVAE: frame size {height}x{width} must be a positive multiple of the spatial "
                             f"compression {f}")

    # ---- latent normalisation -----------------------------------------------------------------
    def _load_latent_stats(self, mean, std) -> None:
        c = self.config.latent_channels
        for name, values, default in (("latent_mean", mean, 0.0), ("latent_std", std, 1.0)):
            if values is not None and len(values) != c:
                raise ValueError(f"VideoVAE: {name} has {len(values)} values; expected latent_channels={c}")
        with torch.no_grad():
            self._shift.copy_(torch.tensor(mean if mean is not None else [0.0] * c).view(1, c, 1, 1, 1))
            self._scale.copy_(torch.tensor(std if std is not None else [1.0] * c).view(1, c, 1, 1, 1))
        if bool((self._scale <= 0).any()):
            raise ValueError(f"VideoVAE: latent_std must be positive, got {std}")

    def set_latent_stats(self, mean: Sequence[float], std: Sequence[float]) -> None:
        """Store the per-channel shift and scale. They go in the config too, so ``save_pretrained`` keeps them."""
        mean, std = [float(v) for v in mean], [float(v) for v in std]
        self._load_latent_stats(mean, std)
        self.register_to_config(latent_mean=mean, latent_std=std)

    def normalize(self, z_raw: Tensor) -> Tensor:
        """Raw posterior latent → the ~unit-variance latent that ``encode`` returns."""
        return (z_raw - self._shift.to(z_raw.dtype)) / self._scale.to(z_raw.dtype)

    def denormalize(self, z: Tensor) -> Tensor:
        return z * self._scale.to(z.dtype) + self._shift.to(z.dtype)

    # ---- encode / decode ----------------------------------------------------------------------
    def _check_video(self, x: Tensor, channels: int, what: str) -> None:
        if x.dim() != 5 or x.shape[1] != channels:
            raise ValueError(f"VideoVAE.{what}: expected a [B, {channels}, T, H, W] tensor, got {list(x.shape)}")

    def encode_moments(self, x: Tensor, cache: Cache | None = None) -> tuple[Tensor, Tensor, Cache]:
        """Posterior of ``x float [B, 3, T, H, W]`` in [-1, 1].

        Returns the raw ``mean`` and ``logvar`` ``[B, C, T, H/f, W/f]``, not normalised. It also returns the
        encoder cache for the next chunk."""
        self._check_video(x, self.config.in_channels, "encode")
        b, c, t, h, w = x.shape
        self._check_size(h, w)
        io = _CacheIO(cache)
        frames = F.pixel_unshuffle(x.transpose(1, 2).reshape(b * t, c, h, w), self.config.patch_size)
        m = self.encoder(frames.contiguous(memory_format=torch.channels_last), t, io)
        m = m.reshape(b, t, *m.shape[1:]).transpose(1, 2)
        mean, logvar = m.chunk(2, dim=1)
        return mean, logvar.clamp(-20.0, 10.0), io.new

    def encode(self, x: Tensor, cache: Cache | None = None, *, sample: bool = False,
               generator: torch.Generator | None = None) -> tuple[Tensor, Cache]:
        """``x float [B, 3, T, H, W]`` in [-1, 1] → (normalised latent ``[B, C, T, H/f, W/f]``, cache).

        The latent is the posterior mean, or a sample of it when ``sample``."""
        mean, logvar, cache = self.encode_moments(x, cache)
        z = mean
        if sample:
            noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
            z = mean + torch.exp(0.5 * logvar) * noise
        return self.normalize(z), cache

    @property
    def uses_reference(self) -> bool:
        """True when the decoder reads an identity reference image (``reference_skip``)."""
        return self.reference_encoder is not None

    def reference_features(self, reference: Tensor) -> list[Tensor]:
        """``reference float [B, 3, H, W]`` in [-1, 1] → the decoder's reference features.

        ``[B, 3, 1, H, W]`` works too. They are computed once per stream; :meth:`decode` keeps them in its
        cache."""
        if not self.uses_reference:
            raise ValueError("VideoVAE.reference_features: this model was built without reference_skip")
        if reference.dim() == 5:
            reference = reference[:, :, 0]
        if reference.dim() != 4 or reference.shape[1] != self.config.in_channels:
            raise ValueError(f"VideoVAE: expected a reference [B, {self.config.in_channels}, H, W] tensor, got "
                             f"{list(reference.shape)}")
        self._check_size(reference.shape[2], reference.shape[3])
        pixels = F.pixel_unshuffle(reference, self.config.patch_size).contiguous(memory_format=torch.channels_last)
        return self.reference_encoder(pixels)

    def _reference_for(self, z: Tensor, reference: Tensor | None, io: _CacheIO) -> list[Tensor] | None:
        if not self.uses_reference:
            return None
        n = len(self.decoder.fuse)
        if reference is not None:
            reference = reference[:, :, 0] if reference.dim() == 5 else reference
            feats = self.reference_features(reference.to(z.dtype))
            if self.decoder.blend_head is not None:
                feats.append(reference.to(z.dtype))
        elif all(f"reference.{i}" in io.old for i in range(n)) and \
                (self.decoder.blend_head is None or "reference.pixels" in io.old):
            feats = [io.old[f"reference.{i}"] for i in range(n)]
            if self.decoder.blend_head is not None:
                feats.append(io.old["reference.pixels"])
        else:
            raise ValueError("VideoVAE.decode: this VAE decodes with an identity reference; pass reference= (the "
                             "reference region [B, 3, H, W] in [-1, 1]) with the first chunk of a stream")
        b, h, w = z.shape[0], z.shape[3], z.shape[4]
        f = self.spatial_compression // self.config.patch_size
        s = self.spatial_compression
        bad_pixels = len(feats) > n and tuple(feats[n].shape[2:]) != (h * s, w * s)
        if feats[0].shape[0] not in (1, b) or feats[0].shape[2:] != (h, w) or feats[n - 1].shape[2] != h * f \
                or bad_pixels:
            raise ValueError(f"VideoVAE.decode: the reference features {list(feats[0].shape)} do not fit the latent "
                             f"{list(z.shape)} (another batch or size?)")
        feats = [t.expand(b, *t.shape[1:]) for t in feats]
        for i, t in enumerate(feats[:n]):
            io.new[f"reference.{i}"] = t
        if len(feats) > n:
            io.new["reference.pixels"] = feats[n]
        return feats

    def decode_raw(self, z_raw: Tensor, cache: Cache | None = None, *,
                   reference: Tensor | None = None) -> tuple[Tensor, Cache]:
        """Decode a raw latent, not normalised; see :meth:`decode`."""
        self._check_video(z_raw, self.config.latent_channels, "decode")
        b, c, t, h, w = z_raw.shape
        io = _CacheIO(cache)
        ref = self._reference_for(z_raw, reference, io)
        frames = z_raw.transpose(1, 2).reshape(b * t, c, h, w).contiguous(memory_format=torch.channels_last)
        x = self.decoder(frames, t, io, ref)
        x = F.pixel_shuffle(x, self.config.patch_size)
        return x.reshape(b, t, *x.shape[1:]).transpose(1, 2), io.new

    def decode(self, z: Tensor, cache: Cache | None = None, *,
               reference: Tensor | None = None) -> tuple[Tensor, Cache]:
        """Normalised latent ``z float [B, C, T, h, w]`` → (frames ``[B, 3, T, h·f, w·f]`` ≈ [-1, 1], cache).

        Pass the returned decoder cache with the next chunk of the same stream. None starts a stream. A
        ``reference_skip`` model needs ``reference float [B, 3, h·f, w·f]`` in [-1, 1] with the first chunk.
        Its features then travel in the cache."""
        self._check_video(z, self.config.latent_channels, "decode")
        return self.decode_raw(self.denormalize(z), cache, reference=reference)

    def forward(self, x: Tensor, sample: bool = True, generator: torch.Generator | None = None,
                reference: Tensor | None = None, latent_noise: Tensor | None = None):
        """Training pass over whole clips: ``x [B, 3, T, H, W]`` → (reconstruction, raw mean, logvar).

        A ``reference_skip`` model takes ``reference [B, 3, H, W]``. ``latent_noise float [B]`` is the std of
        Gaussian noise added to each sample's latent. Its unit is the normalised latent, what a denoiser
        makes. It teaches the decoder to decode a denoiser's imperfect latents gracefully."""
        mean, logvar, _ = self.encode_moments(x)
        z = mean
        if sample:
            noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
            z = mean + torch.exp(0.5 * logvar) * noise
        if latent_noise is not None:
            noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
            z = z + latent_noise.to(z).view(-1, 1, 1, 1, 1) * self._scale.to(z.dtype) * noise
        recon, _ = self.decode_raw(z, reference=reference)
        return recon, mean, logvar


def with_reference_warp(vae: VideoVAE) -> VideoVAE:
    """A copy of a ``reference_skip`` ``vae`` with the reference-warp head added (``reference_warp=True``).

    The head starts off. So the copy decodes exactly as ``vae`` does until it is trained."""
    if not vae.uses_reference:
        raise ValueError("with_reference_warp: the VAE was built without reference_skip; the warp reads the "
                         "decoder's identity reference, so train a reference_skip VAE first")
    if vae.config.reference_warp:
        raise ValueError("with_reference_warp: the VAE already has the reference-warp head")
    new = VideoVAE(**{**dict(vae.config), "reference_warp": True})
    missing, unexpected = new.load_state_dict(vae.state_dict(), strict=False)
    if unexpected or any(not k.startswith("decoder.blend_head.") for k in missing):
        raise RuntimeError(f"with_reference_warp: weights do not line up (missing {missing}, unexpected {unexpected})")
    return new.to(next(vae.parameters()).device)


def frames_to_uint8(x: Tensor) -> Tensor:
    """``[..., 3, H, W]`` in [-1, 1] → ``uint8 [..., H, W, 3]``, rounded and clamped."""
    return ((x.float() + 1.0) * 127.5).round_().clamp_(0, 255).to(torch.uint8).movedim(-3, -1)


def uint8_to_frames(x: Tensor) -> Tensor:
    """``uint8 [..., H, W, 3]`` → ``float32 [..., 3, H, W]`` in [-1, 1]."""
    return x.movedim(-1, -3).float() / 127.5 - 1.0
