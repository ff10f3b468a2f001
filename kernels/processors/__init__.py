"""diffusers attention processors backed by framegraph kernels (swap attention without touching a model)."""
from .block_linear import (  # noqa: F401
    BlockLinearAttnProcessor,
    install_block_linear_processors,
    reset_block_linear_state,
    set_update_state,
)
from .monarch import MonarchAttnProcessor, grid_from_latents, install_monarch_processors  # noqa: F401
from .streaming_rope import StreamingRotaryPosEmbed  # noqa: F401
from .wan_causal import (  # noqa: F401
    KVCache,
    WanCausalAttnProcessor,
    install_wan_causal_processors,
    uninstall_wan_causal_processors,
)
