"""Real video diffusion models streamed block by block over the stock diffusers classes.

- :mod:`.sana`: the SANA-Video family (``SanaVideoTransformer3DModel``): block-causal linear attention with a
  constant-size state and a block-causal feed-forward temporal convolution with its cache (LongSANA style);
  ``SanaVideoStream.generate_chunk`` = few-step flow matching over one chunk, then a commit pass.
- :mod:`.vae`: streaming decode of the causal video VAE ``AutoencoderKLWan``, its temporal cache carried
  across calls in a ``WanDecodeState``.
"""
from .sana import BlockCausalTemporalConv, SanaVideoStream, install_block_causal_convs, sigmas_from_timesteps  # noqa: F401
from .vae import WanDecodeState, decode_chunk  # noqa: F401
