"""Real video diffusion models (stock diffusers classes) streamed chunk by chunk with a cache of the past.

- :mod:`.wan`: :class:`WanCausal`, the Wan 2.1 family (``WanTransformer3DModel``) run block-causally
  (Self-Forcing / CausVid) with a rolling KV cache with attention sinks.
- :mod:`.sana`: :class:`SanaVideoStream`, the SANA-Video family (``SanaVideoTransformer3DModel``):
  block-causal linear attention with a constant-size state and a block-causal feed-forward temporal
  convolution with its cache (LongSANA style).
- :mod:`.vae`: streaming decode of the causal video VAE ``AutoencoderKLWan``, its temporal cache carried
  across calls in a :class:`WanDecodeState`.

Both families offer ``generate_chunk`` (few-step flow matching over one chunk of latent frames, then a
commit pass on the clean chunk) and ``reset()``.

- :mod:`.family`: the family adapters (:data:`FAMILIES`: how attention is made block-causal, how the cache
  is kept and trimmed, which VAE) behind one :class:`CausalStream`.
- :mod:`.checkpoint`: diffusers folders and single-file Wan causal students, from local disk only.
- :mod:`.prompts`: prompt embeddings (the folder's text encoder or a safetensors file), cached per prompt.
- :mod:`.stages` / :mod:`.graph`: ``NoiseSource | video → VAEEncode → CausalDenoiser → CausalVAEDecode``; the
  decoder's engine by runtime (:mod:`framegraph.models.runtime`): torch, or ONNX Runtime (:mod:`.onnx`: the
  export of the causal decoder with its cache as explicit inputs / outputs, ``framegraph export --generate``).
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
