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
"""
from .sana import BlockCausalTemporalConv, SanaVideoStream, install_block_causal_convs, sigmas_from_timesteps
from .vae import WanDecodeState, decode_chunk
from .wan import DEFAULT_TIMESTEPS, WanCausal

__all__ = ["DEFAULT_TIMESTEPS", "BlockCausalTemporalConv", "SanaVideoStream", "WanCausal", "WanDecodeState",
           "decode_chunk", "install_block_causal_convs", "sigmas_from_timesteps"]
