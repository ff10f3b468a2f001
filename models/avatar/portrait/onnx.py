"""Export the portrait avatar's three stateful models to ONNX, every stream state an explicit input and output.

:func:`export_avatar` writes these files. The bundle fixes their shapes: its region size and chunk. The batch is 1
for the audio encoder and ``vae_first``. It is a dynamic axis ``B`` of the DiT's graphs and ``vae_next``: one session
runs ``B = 1``, a batch of sessions runs :class:`~.engines.OrtBlockStep` and :class:`~.engines.OrtDecodeStep`.

- ``audio.onnx``: the :class:`~framegraph.models.audio.AudioEncoder` conv stack, ``log_mel float32
  [1, n_mels, T] → features [1, D, T - R + 1]``. ``T`` is dynamic. The window holds the ``R - 1`` mel frames
  of context, the encoder's streaming state. The STFT front end stays in torch.
- ``dit_velocity.onnx``: one denoising call of :class:`~framegraph.models.dit.AvatarDiT` on a stream. Its inputs are
  ``x, t, audio, state_label``, the stream state and the block's rotary tables. The state is the reference latent and
  the audio history. Per layer it adds the linear-attention sums ``kv`` / ``k_sum`` and the FFN cache. It adds the
  identity keys / values. The rotary tables are ``[B, N, head_dim]``, each row's positions. The output is
  ``velocity``. The state is read only.
- ``dit_commit.onnx``: :meth:`AvatarDiT.append_step`. The same state goes in and the advanced state comes out.
  The outputs are ``*_out``: per layer ``kv, k_sum, ffn_cache``, then ``audio_history``.
- ``vae_first.onnx``: :meth:`VideoVAE.decode` of the first chunk of a stream. The latent and reference region
  go in. Frames and the whole decoder cache come out.
- ``vae_next.onnx``: the same for the next chunks. The latent, temporal cache and reference features go in.
  Frames and the next temporal cache come out. The reference features stay batch 1, shared by every row.

``manifest.json`` has format :data:`FORMAT`, from :mod:`framegraph.models.onnx.manifest`. It records the
opset and every input and output with its meaning and shape, at batch 1. A file with the batch axis says
``"batch": "dynamic"``. An export made before the axis, with rotary tables ``[N, head_dim]``, still runs single
sessions. The manifest records the hash of the bundle the files came from. The export traces the models' readable
torch path. That is the kernels' ``"torch"`` backend, from :mod:`framegraph.kernels.backend`.
"""
from __future__ import annotations

import os

import torch
from torch import nn

from framegraph.kernels.block_linear_attention import LinearAttentionState
from framegraph.models.audio.onnx import export_audio_encoder
from framegraph.models.dit.state import DiTStreamState, LayerStreamState
from framegraph.models.onnx.manifest import OPSET, check_manifest, weights_hash, write_manifest
from framegraph.models.onnx.trace import export_module, io_entries, require_onnx
from framegraph.models.vae import uint8_to_frames

FORMAT = "framegraph-onnx-avatar/1"
PARTS = ("audio", "dit_velocity", "dit_commit", "vae_first", "vae_next")  # the files of an export
MODELS = {"audio": ("audio",), "dit": ("dit_velocity", "dit_commit"), "vae": ("vae_first", "vae_next")}  # model → parts


def avatar_hash(avatar) -> str:
    """sha256 over what the exported graphs depend on.

    That is the three models' configs and weights, and the stream geometry: region size and chunk. Weights include
    buffers, such as the VAE's latent statistics. The portrait and the reference latent are graph *inputs*. So they are
    not part of it."""
    return weights_hash({"region_size": avatar.region_size, "chunk_frames": avatar.chunk_frames},
                        {name: getattr(avatar, name) for name in ("audio", "dit", "vae")})


def load_manifest(export_dir: str, avatar) -> dict:
    """The manifest of the avatar export ``export_dir``, checked against ``avatar``.

    Raises :class:`~framegraph.models.onnx.ExportError`."""
    return check_manifest(export_dir, fmt=FORMAT, want_hash=avatar_hash(avatar), parts=PARTS,
                          hint=f"run `framegraph export --avatar BUNDLE --out {export_dir}`", extra=("vae_cache",))


def dit_state_names(depth: int, identity: bool) -> list[str]:
    """Names of the stream-state inputs of both DiT graphs, in order."""
    names = ["ref", "audio_history"]
    for i in range(depth):
        names += [f"kv_{i}", f"k_sum_{i}", f"ffn_cache_{i}"]
    if identity:
        for i in range(depth):
            names += [f"ref_k_{i}", f"ref_v_{i}"]
    return names + ["rope_cos", "rope_sin"]


def dit_state_outputs(depth: int) -> list[str]:
    """Names of the append graph's outputs: the advanced state. See :meth:`AvatarDiT.append_step`."""
    return [f"{n}_{i}_out" for i in range(depth) for n in ("kv", "k_sum", "ffn_cache")] + ["audio_history_out"]


def stream_from_inputs(model, ref, history, flat):
    """A :class:`~framegraph.models.dit.state.DiTStreamState` over graph inputs.

    Per layer they are ``kv, k_sum, ffn_cache``. Then come per layer ``ref_k, ref_v``, when the model has
    identity tokens."""
    depth = len(model.blocks)
    layers = [LayerStreamState(LinearAttentionState(flat[3 * i], flat[3 * i + 1]), flat[3 * i + 2])
              for i in range(depth)]
    rest = flat[3 * depth:]
    ref_kv = [(rest[2 * i], rest[2 * i + 1]) for i in range(depth)] if rest else [None] * depth
    return DiTStreamState(ref=ref, ref_kv=ref_kv, layers=layers, audio_history=history)


class DiTVelocity(nn.Module):
    """``(x, t, audio, state_label, *state, rope_cos, rope_sin)`` → velocity. It is one streamed denoising call."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, t, audio, state_label, ref, history, *rest):
        stream = stream_from_inputs(self.model, ref, history, list(rest[:-2]))
        return self.model(x, t, audio, state_label, stream=stream, rope=(rest[-2], rest[-1]))


class DiTAppend(nn.Module):
    """``(x0, audio, state_label, *state, rope_cos, rope_sin)`` → the advanced state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x0, audio, state_label, ref, history, *rest):
        stream = stream_from_inputs(self.model, ref, history, list(rest[:-2]))
        return tuple(self.model.append_step(x0, audio, state_label, stream, rope=(rest[-2], rest[-1])))


class VAEFirst(nn.Module):
    """``(z, [reference])`` → ``(frames, *cache)`` for the first chunk of a stream. The cache keys are ``keys``."""

    def __init__(self, vae, keys: list[str]):
        super().__init__()
        self.vae, self.keys = vae, keys

    def forward(self, z, reference=None):
        frames, cache = self.vae.decode(z, None, reference=reference)
        return (frames, *(cache[k] for k in self.keys))


class VAENext(nn.Module):
    """``(z, *temporal cache, *reference features)`` → ``(frames, *next temporal cache)``."""

    def __init__(self, vae, temporal: list[str], reference: list[str]):
        super().__init__()
        self.vae, self.temporal, self.reference = vae, temporal, reference

    def forward(self, z, *cache):
        old = dict(zip(self.temporal + self.reference, cache))
        frames, new = self.vae.decode(z, old)
        return (frames, *(new[k] for k in self.temporal))


@torch.no_grad()
def export_avatar(avatar, out_dir: str) -> dict:
    """Write the ONNX files of ``avatar`` and their ``manifest.json`` into ``out_dir``; returns the manifest.

    ``avatar`` is a loaded bundle, from :func:`~framegraph.models.avatar.load_avatar`."""
    require_onnx()
    os.makedirs(out_dir, exist_ok=True)
    files = {}
    files["audio"] = export_audio_encoder(avatar.audio.float().eval(), out_dir)
    files.update(_export_dit(avatar, out_dir))
    files.update(_export_vae(avatar, out_dir))
    return write_manifest(out_dir, {"format": FORMAT, "opset": OPSET, "bundle_hash": avatar_hash(avatar),
                                    "bundle": avatar.root, "torch": torch.__version__, "files": files})


DIT_MEANING = {"x0": "clean latent block to commit", "x": "noisy latent block", "t": "time in [0, 1] (1 = noise)",
               "audio_history": "audio features of the last committed frames", "audio": "audio features per frame",
               "state_label": "speaking-state label per frame", "ref_k": "identity cross-attention keys (layer i)",
               "ref_v": "identity cross-attention values (layer i)", "ref": "reference latent (identity)",
               "kv": "linear-attention numerator sums (layer i)",
               "k_sum": "linear-attention denominator sums (layer i)",
               "ffn_cache": "FFN temporal cache (layer i)", "rope": "rotary tables of the block's stream positions",
               "velocity": "predicted velocity eps - x0"}


def _export_dit(avatar, out_dir: str) -> dict:
    model = avatar.dit.float().eval()
    stream = model.init_stream(avatar.reference_latent())
    c, (h, w) = model.config, stream.ref.shape[-2:]
    k = c.frames_per_block
    x = torch.randn(1, c.latent_channels, k, h, w)
    audio, label = torch.randn(1, k, c.audio_dim), torch.rand(1, k, c.state_dim)
    flat = [t for layer in stream.layers for t in layer.tensors()]
    flat += [t for kv in stream.ref_kv if kv is not None for t in kv]
    state = [stream.ref, stream.audio_history, *flat, *(t[None] for t in model.stream_rope(stream))]
    names = dit_state_names(len(model.blocks), stream.ref_kv[0] is not None)
    vin = ["x", "t", "audio", "state_label"] + names
    vargs = (x, torch.ones(1), audio, label, *state)
    cin = ["x0", "audio", "state_label"] + names
    couts = dit_state_outputs(len(model.blocks))
    batch = {name: {0: "batch"} for name in (*vin, *cin, "velocity", *couts)}
    export_module(DiTVelocity(model), vargs, os.path.join(out_dir, "dit_velocity.onnx"), vin, ["velocity"],
                  dynamic_axes=batch)
    new = model.append_step(x, audio, label, stream)
    export_module(DiTAppend(model), (x, audio, label, *state), os.path.join(out_dir, "dit_commit.onnx"), cin, couts,
                  dynamic_axes=batch)
    return {"dit_velocity": {"file": "dit_velocity.onnx", "inputs": io_entries(vin, vargs, DIT_MEANING),
                             "outputs": io_entries(["velocity"], [x], DIT_MEANING), "batch": "dynamic"},
            "dit_commit": {"file": "dit_commit.onnx", "inputs": io_entries(cin, (x, audio, label, *state), DIT_MEANING),
                           "outputs": io_entries(couts, new, DIT_MEANING), "batch": "dynamic"}}


def vae_cache_keys(vae, avatar) -> tuple[list[str], list[str], torch.Tensor | None]:
    """``(temporal cache keys, reference keys, reference frames or None)`` of ``vae``'s decoder for ``avatar``."""
    ref = uint8_to_frames(avatar.region()[0])[None] if vae.uses_reference else None
    z = torch.zeros(1, *vae.latent_shape(avatar.chunk_frames, avatar.region_size, avatar.region_size))
    _, cache = vae.decode(z, None, reference=ref)
    temporal = [k for k in cache if not k.startswith("reference.")]
    return temporal, [k for k in cache if k.startswith("reference.")], ref


def _export_vae(avatar, out_dir: str) -> dict:
    vae = avatar.vae.float().eval()
    temporal, reference, ref = vae_cache_keys(vae, avatar)
    z = torch.randn(1, *vae.latent_shape(avatar.chunk_frames, avatar.region_size, avatar.region_size))
    keys = temporal + reference
    first_args = (z,) if ref is None else (z, ref)
    first_in = ["z"] + ([] if ref is None else ["reference"])
    first_out = ["frames"] + [f"cache:{k}" for k in keys]
    frames, cache = vae.decode(z, None, reference=ref)
    export_module(VAEFirst(vae, keys), first_args, os.path.join(out_dir, "vae_first.onnx"), first_in, first_out)
    next_in = ["z"] + [f"cache:{k}" for k in keys]
    next_out = ["frames"] + [f"cache:{k}:out" for k in temporal]
    batch = {name: {0: "batch"} for name in (*next_in[:1 + len(temporal)], *next_out)}  # not the reference's
    export_module(VAENext(vae, temporal, reference), (z, *(cache[k] for k in keys)),
                  os.path.join(out_dir, "vae_next.onnx"), next_in, next_out, dynamic_axes=batch)
    meaning = {"z": "normalised latent chunk", "reference": "identity reference region in [-1, 1]",
               "frames": "decoded frames in [-1, 1]", "cache:": "decoder cache entry (temporal conv past / "
               "reference features)"}
    return {"vae_first": {"file": "vae_first.onnx", "inputs": io_entries(first_in, first_args, meaning),
                          "outputs": io_entries(first_out, (frames, *(cache[k] for k in keys)), meaning)},
            "vae_next": {"file": "vae_next.onnx",
                         "inputs": io_entries(next_in, (z, *(cache[k] for k in keys)), meaning),
                         "outputs": io_entries(next_out, (frames, *(cache[k] for k in temporal)), meaning),
                         "batch": "dynamic"},
            "vae_cache": {"temporal": temporal, "reference": reference}}


__all__ = ["FORMAT", "PARTS", "MODELS", "avatar_hash", "load_manifest", "export_avatar", "dit_state_names",
           "dit_state_outputs", "vae_cache_keys"]
