"""The generate pipeline's causal VAE decoder on ONNX Runtime.

The decoder is diffusers' ``AutoencoderKLWan``: Wan 2.1 / 2.2, SANA-Video.
:func:`~framegraph.models.generate.vae.decode_chunk` is exported with the decoder's temporal cache as explicit inputs
and outputs.

:func:`export_wan_vae` writes these files.
Shapes are fixed per ``size = (H, W)`` and ``chunk_frames = F``, at batch 1.

- ``vae_first.onnx``: the stream's first chunk. ``z [1, z_dim, F, h, w]`` → ``frames [1, 3, 1 + r (F - 1), H, W]`` in
  [-1, 1] and the whole cache ``cache:feat_cache.<i>``. ``z`` is at VAE scale, what ``vae.decode`` takes.
- ``vae_next.onnx``: every later chunk. ``z`` + the cache → ``frames [1, 3, r F, H, W]`` + the next cache,
  ``cache:feat_cache.<i>:out``.

The cache: entry ``i`` is entry ``i`` of diffusers' ``feat_cache`` list, one per causal conv the decoder visits.
It holds the last 2 frames of that conv's input, ``[1, C_i, 2, h_i, w_i]``.
After the stream's first latent frame diffusers keeps only 1 frame per conv.
It keeps a marker ``"Rep"`` for each temporal upsampler, whose conv then pads with zeros.
:func:`steady_cache` writes that state as the 2-frame layout of every later chunk.
A zero frame goes in front, and zeros stand for ``"Rep"``.
The decoder computes identically with it: a causal conv pads the missing past with zeros either way.
So one ``next`` graph serves every chunk after the first, whatever ``F``.

Export needs one change to the model.
Its upsamplers' ``nn.Upsample(scale_factor=2, mode="nearest-exact")`` has no ONNX export in torch's exporter.
The missing op is ``aten::_upsample_nearest_exact2d``.
:class:`Nearest2x` computes the same thing with Expand + Reshape: an exact copy of pixels, no arithmetic.

``manifest.json`` has the layout of every export; see :mod:`framegraph.models.onnx.manifest`.
Its format is :data:`WAN_VAE_FORMAT`.
It also has its hash over the VAE's config, weights and the geometry; see :func:`wan_vae_hash`.
The runner is :class:`~framegraph.models.onnx.OrtVAEStream`, the streamed decoder every VAE shares.
:class:`OrtWanVAE` is the engine of :class:`~.stages.CausalVAEDecode` on ONNX Runtime, ``runtime="onnx"``.
"""
from __future__ import annotations

import copy
import os

import torch
from torch import nn

from framegraph.models.onnx import CheckedExport, OrtVAEStream, default_threads
from framegraph.models.onnx.manifest import OPSET, ExportError, check_manifest, weights_hash, write_manifest
from framegraph.models.onnx.trace import export_module, io_entries, require_onnx

from .vae import WanDecodeState, decode_chunk

WAN_VAE_FORMAT = "framegraph-onnx-wan-vae/1"
PARTS = ("vae_first", "vae_next")


class Nearest2x(nn.Module):
    """``[N, C, H, W]`` → ``[N, C, 2H, 2W]``, every pixel repeated 2 × 2.

    That is what ``nn.Upsample(scale_factor=2, mode="nearest-exact")`` computes.
    For a factor of 2, nearest-exact's source index ``floor((i + 0.5) / 2)`` is ``i // 2``.
    It is written as Expand + Reshape, which export to ONNX.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        return x[:, :, :, None, :, None].expand(n, c, h, 2, w, 2).reshape(n, c, 2 * h, 2 * w)


def exportable(vae):
    """A float32 copy of ``vae`` whose 2× nearest-exact upsamplers are :class:`Nearest2x`. ``vae`` is untouched."""
    vae = copy.deepcopy(vae).float().eval()
    for module in list(vae.modules()):
        for name, child in module.named_children():
            if isinstance(child, nn.Upsample):
                factor = child.scale_factor
                factor = tuple(factor) if isinstance(factor, (tuple, list)) else (factor, factor)
                if child.mode != "nearest-exact" or factor != (2.0, 2.0):
                    raise ExportError(f"{type(vae).__name__}: an upsampler {child} that is not 2x nearest-exact; "
                                      f"this exporter converts only those (the Wan VAE's)")
                setattr(module, name, Nearest2x())
    return vae


def latent_size(vae, size: tuple[int, int]) -> tuple[int, int]:
    """Pixels ``(H, W)`` → latent ``(h, w)`` of ``vae``. Raises for a size it does not tile."""
    s = vae.config.scale_factor_spatial
    height, width = size
    if height <= 0 or width <= 0 or height % s or width % s:
        raise ValueError(f"size {height}x{width} (HxW): expected positive multiples of the VAE's {s}x downscale")
    return height // s, width // s


def wan_vae_hash(vae, size: tuple[int, int], chunk_frames: int) -> str:
    """sha256 over what an export depends on.

    That is the VAE's config and weights, the frame size and the chunk length.
    Diffusers' bookkeeping keys in the config are left out, such as the folder it was loaded from.
    """
    return weights_hash({"size_hw": list(size), "chunk_frames": int(chunk_frames)}, {"vae": vae})


def steady_cache(feat_cache: list, shapes: dict[int, tuple[int, ...]]) -> list[torch.Tensor]:
    """``feat_cache`` as the cache layout of the stream's later chunks.

    ``feat_cache`` is a :class:`~framegraph.models.generate.vae.WanDecodeState`'s.
    Entry ``i`` of each key of ``shapes`` becomes a 2-frame ``shapes[i]`` tensor.
    1-frame entries get a zero frame in front, and ``"Rep"`` becomes zeros; see the module docs.
    """
    out = []
    for i, shape in shapes.items():
        t = feat_cache[i]
        if isinstance(t, str) or t is None:  # "Rep": the temporal upsampler's conv has seen no past yet
            out.append(torch.zeros(shape))
        elif t.shape[2] < shape[2]:
            out.append(torch.cat([t.new_zeros(*t.shape[:2], shape[2] - t.shape[2], *t.shape[3:]), t], dim=2))
        else:
            out.append(t)
    return out


def cache_shapes(vae, latent_hw: tuple[int, int], chunk_frames: int) -> dict[int, tuple[int, ...]]:
    """``{feat_cache index: shape}`` of the cache between two later chunks. Decoded once here, on zeros."""
    z = torch.zeros(1, vae.config.z_dim, chunk_frames, *latent_hw)
    _, state = decode_chunk(vae, z)
    _, state = decode_chunk(vae, z, state)  # two chunks: at least 2 latent frames, every entry 2 frames
    return {i: tuple(t.shape) for i, t in enumerate(state.feat_cache) if isinstance(t, torch.Tensor)}


def cache_key(i: int) -> str:
    return f"feat_cache.{i}"


class WanDecodeFirst(nn.Module):
    """``z`` → ``(frames, *cache)``: :func:`decode_chunk` of a stream's first chunk, the cache in the steady layout.
    """

    def __init__(self, vae, shapes: dict[int, tuple[int, ...]]):
        super().__init__()
        self.vae, self.shapes = vae, shapes

    def forward(self, z):
        frames, state = decode_chunk(self.vae, z)
        return (frames, *steady_cache(state.feat_cache, self.shapes))


class WanDecodeNext(nn.Module):
    """``(z, *cache)`` → ``(frames, *next cache)``: :func:`decode_chunk` of a later chunk."""

    def __init__(self, vae, shapes: dict[int, tuple[int, ...]], entries: int):
        super().__init__()
        self.vae, self.shapes, self.entries = vae, shapes, entries

    def forward(self, z, *cache):
        feat = [None] * self.entries
        for i, t in zip(self.shapes, cache):
            feat[i] = t
        state = WanDecodeState(feat, frames=z.shape[2], latent_shape=(z.shape[0], *z.shape[3:]))
        frames, new = decode_chunk(self.vae, z, state)
        return (frames, *(new.feat_cache[i] for i in self.shapes))


@torch.no_grad()
def export_wan_vae(vae, out_dir: str, *, size: tuple[int, int], chunk_frames: int, source: str | None = None) -> dict:
    """Write ``vae_first.onnx``, ``vae_next.onnx`` and ``manifest.json`` of ``vae`` into ``out_dir``. Returns the
    manifest.

    ``vae`` is an ``AutoencoderKLWan``.
    The export is for frames of ``size = (H, W)``, decoded ``chunk_frames`` latent frames at a time.
    ``source`` says where the VAE came from. It is recorded for the stale-export message.
    """
    require_onnx()
    if chunk_frames < 1:
        raise ValueError(f"chunk_frames={chunk_frames}; expected a positive number of latent frames")
    model = exportable(vae)
    hw = latent_size(model, size)
    shapes = cache_shapes(model, hw, chunk_frames)
    entries = len(WanDecodeState.empty(model).feat_cache)
    keys = [cache_key(i) for i in shapes]
    os.makedirs(out_dir, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(1, model.config.z_dim, chunk_frames, *hw, generator=gen)
    first_frames, state = decode_chunk(model, z)
    first_cache = steady_cache(state.feat_cache, shapes)
    first_out = ["frames"] + [f"cache:{k}" for k in keys]
    export_module(WanDecodeFirst(model, shapes), (z,), os.path.join(out_dir, "vae_first.onnx"), ["z"], first_out)
    next_in = ["z"] + [f"cache:{k}" for k in keys]
    next_out = ["frames"] + [f"cache:{k}:out" for k in keys]
    next_frames, new = decode_chunk(model, z, state)
    export_module(WanDecodeNext(model, shapes, entries), (z, *first_cache), os.path.join(out_dir, "vae_next.onnx"),
            next_in, next_out)
    meaning = {"z": "latent chunk at the VAE's scale (x * latents_std + latents_mean)",
               "frames": "decoded frames in [-1, 1]",
               "cache:": "causal conv's last 2 input frames (feat_cache entry)"}
    files = {
        "vae_first": {"file": "vae_first.onnx", "inputs": io_entries(["z"], [z], meaning),
                      "outputs": io_entries(first_out, (first_frames, *first_cache), meaning)},
        "vae_next": {"file": "vae_next.onnx", "inputs": io_entries(next_in, (z, *first_cache), meaning),
                     "outputs": io_entries(next_out, (next_frames, *(new.feat_cache[i] for i in shapes)), meaning)},
        "vae_cache": {"temporal": keys, "reference": []},
    }
    return write_manifest(out_dir, {
        "format": WAN_VAE_FORMAT, "opset": OPSET, "bundle_hash": wan_vae_hash(vae, size, chunk_frames),
        "bundle": source, "size_hw": list(size), "chunk_frames": int(chunk_frames), "torch": torch.__version__,
        "files": files})


def export_command(model: str, size: tuple[int, int], chunk_frames: int, out: str | None = None) -> str:
    """The ``framegraph export`` command line that writes this export."""
    return (f"framegraph export --generate {model} --size {size[0]}x{size[1]} --chunk-frames {chunk_frames}"
            + (f" --out {out}" if out else ""))


def default_wan_onnx_dir(model_dir: str, size: tuple[int, int], chunk_frames: int) -> str:
    """Where ``framegraph export --generate`` puts an export by default and ``--runtime onnx`` looks.

    It is ``MODEL_DIR/onnx/vae_<H>x<W>_f<F>``, one per size and chunk length.
    """
    return os.path.join(model_dir, "onnx", f"vae_{size[0]}x{size[1]}_f{chunk_frames}")


def load_wan_manifest(export_dir: str, vae, *, size: tuple[int, int], chunk_frames: int,
                      model: str = "MODEL_DIR") -> dict:
    """The manifest of ``export_dir``, checked against ``vae``, ``size`` and ``chunk_frames``.

    Raises :class:`~framegraph.models.onnx.ExportError` naming the export command.
    ``model`` is the folder to name in it.
    """
    default = os.path.normpath(export_dir) == os.path.normpath(default_wan_onnx_dir(model, size, chunk_frames))
    hint = f"run `{export_command(model, size, chunk_frames, None if default else export_dir)}`"
    return check_manifest(export_dir, fmt=WAN_VAE_FORMAT, want_hash=wan_vae_hash(vae, size, chunk_frames),
                          parts=PARTS, hint=hint, source="VAE", extra=("vae_cache",),
                          geometry={"size_hw": list(size), "chunk_frames": int(chunk_frames)})


class WanVAEExport(CheckedExport):
    """An export directory checked against ``vae``, ``size`` and ``chunk_frames`` by :func:`load_wan_manifest`."""

    def __init__(self, export_dir: str, vae, *, size: tuple[int, int], chunk_frames: int, model: str = "MODEL_DIR"):
        super().__init__(export_dir, load_wan_manifest(export_dir, vae, size=size, chunk_frames=chunk_frames,
                                                       model=model))
        self.vae = vae

    def stream(self, threads: int = 1) -> OrtVAEStream:
        """A fresh :class:`~framegraph.models.onnx.OrtVAEStream` of the two graphs, ``threads`` intra-op threads each.
        """
        return OrtVAEStream(self.graph("vae_first", threads), self.graph("vae_next", threads), self.manifest["files"])


class OrtWanVAE:
    """The :class:`~.stages.CausalVAEEngine` on ONNX Runtime, float32 on the CPU.

    It runs the export in ``export_dir``: :func:`export_wan_vae` of ``vae`` at this frame size and ``chunk_frames``.
    A missing or stale one raises :class:`~framegraph.models.onnx.ExportError` naming the export command.
    ``model`` is the folder named in it.
    The decoder's cache is bound in place between chunks.
    """

    def __init__(self, vae, export_dir: str, *, size: tuple[int, int], chunk_frames: int, threads: int | None = None,
                 model: str = "MODEL_DIR"):
        self.export = WanVAEExport(export_dir, vae, size=size, chunk_frames=chunk_frames, model=model)
        self.stream = self.export.stream(threads or default_threads())
        self.graphs = {"vae_first": self.stream.first, "vae_next": self.stream.next}

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.stream.decode(latents)

    def reset(self) -> None:
        self.stream.reset()


def onnx_vae_engine(*, export_dir: str | None, size: tuple[int, int], chunk_frames: int, device: str,
                    dtype: torch.dtype, threads: int | None = None, model: str = "MODEL_DIR"):
    """``engine(vae)`` → :class:`OrtWanVAE` from ``export_dir``. Float32 on the CPU only."""
    if export_dir is None:
        raise ValueError("the VAE decoder on runtime 'onnx' needs the folder `framegraph export --generate` wrote")
    if dtype != torch.float32 or torch.device(device).type != "cpu":
        raise ValueError(f"the ONNX Runtime VAE decoder runs float32 on the CPU; got {dtype} on {device} (use the "
                         f"cpu device, or runtime torch)")
    return lambda vae: OrtWanVAE(vae, export_dir, size=size, chunk_frames=chunk_frames, threads=threads, model=model)


__all__ = ["WAN_VAE_FORMAT", "PARTS", "export_wan_vae", "export_command", "default_wan_onnx_dir", "load_wan_manifest",
           "WanVAEExport", "OrtWanVAE", "exportable", "wan_vae_hash", "steady_cache", "cache_shapes", "latent_size"]
