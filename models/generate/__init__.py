"""Real video diffusion models, stock diffusers classes, streamed chunk by chunk with a cache of the past.

- :mod:`.wan`: :class:`WanCausal`, the Wan 2.1 family (``WanTransformer3DModel``). It runs block-causally, as in
  Self-Forcing / CausVid, with a rolling KV cache with attention sinks.
- :mod:`.sana`: :class:`SanaVideoStream`, the SANA-Video family (``SanaVideoTransformer3DModel``). It has block-causal
  linear attention with a constant-size state. Its block-causal feed-forward temporal convolution keeps a cache,
  LongSANA style.
- :mod:`.vae`: streaming decode of the causal video VAE ``AutoencoderKLWan``. Its temporal cache is carried across
  calls in a :class:`WanDecodeState`.

Both families offer ``generate_chunk`` and ``reset()``.
``generate_chunk`` runs few-step flow matching over one chunk of latent frames, then an append pass on the clean chunk.

- :mod:`.family`: the family adapters behind one :class:`CausalStream`. :data:`FAMILIES` says how attention is made
  block-causal, how the cache is kept and trimmed, and which VAE.
- :mod:`.checkpoint`: diffusers folders and single-file Wan causal students, from local disk only.
- :mod:`.prompts`: prompt embeddings from the folder's text encoder or a safetensors file, cached per prompt.
- :mod:`.stages` / :mod:`.graph`: ``NoiseSource | video → VAEEncode → CausalDenoiser → CausalVAEDecode``. The
  decoder's engine goes by runtime; see :mod:`framegraph.models.runtime`. It is torch or ONNX Runtime.
- :mod:`.onnx`: the export of the causal decoder with its cache as explicit inputs / outputs, ``framegraph export
  --generate``.
- :mod:`.compiled`: the compiled runtime.
"""
from .checkpoint import GenerateModel, detect_family, load_folder_vae, load_generate_model
from .family import FAMILIES, SHIFT, CausalStream, Family, warp_timesteps
from .graph import GenerateGraph, build_generate_graph, default_dtype, file_source
from .prompts import PromptBook, load_prompt_embeds
from .sana import BlockCausalTemporalConv, SanaVideoStream, install_block_causal_convs, sigmas_from_timesteps
from .stages import (
    STRENGTH_MEANING,
    CausalDenoiser,
    CausalVAEDecode,
    NoiseSource,
    VAEEncode,
    check_strength,
    first_frame,
    video_frames,
)
from .vae import WanDecodeState, WanEncodeState, decode_chunk, encode_chunk, from_vae_scale, to_vae_scale
from .wan import DEFAULT_TIMESTEPS, WanCausal

__all__ = [
    "DEFAULT_TIMESTEPS", "FAMILIES", "SHIFT", "STRENGTH_MEANING", "BlockCausalTemporalConv", "CausalDenoiser",
    "CausalStream", "CausalVAEDecode", "Family", "GenerateGraph", "GenerateModel", "NoiseSource", "PromptBook",
    "SanaVideoStream", "VAEEncode", "WanCausal", "WanDecodeState", "WanEncodeState", "build_generate_graph",
    "check_strength", "decode_chunk", "default_dtype", "detect_family", "encode_chunk", "file_source", "first_frame",
    "from_vae_scale", "install_block_causal_convs", "load_folder_vae", "load_generate_model", "load_prompt_embeds",
    "sigmas_from_timesteps", "to_vae_scale", "video_frames", "warp_timesteps",
]
