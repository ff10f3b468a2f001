"""Real video diffusion models (stock diffusers classes) streamed chunk by chunk with a cache of the past.

- :mod:`framegraph.models.generate.wan`: :class:`WanCausal`, the Wan 2.1 family (``WanTransformer3DModel``)
  run block-causally (Self-Forcing / CausVid) with a rolling KV cache with attention sinks.
"""
from .wan import DEFAULT_TIMESTEPS, WanCausal  # noqa: F401
