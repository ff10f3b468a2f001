"""diffusers attention processors backed by framegraph kernels. They swap attention without touching a model."""
from .block_linear import (
    BlockLinearAttnProcessor,
    install_block_linear_processors,
    reset_block_linear_state,
    set_update_state,
)
from .monarch import MonarchAttnProcessor, grid_from_latents, install_monarch_processors
from .streaming_rope import StreamingRotaryPosEmbed
from .wan_causal import (
    KVCache,
    RowsKVCache,
    WanCausalAttnProcessor,
    install_wan_causal_processors,
    uninstall_wan_causal_processors,
)

__all__ = ["BlockLinearAttnProcessor", "install_block_linear_processors", "reset_block_linear_state",
           "set_update_state", "MonarchAttnProcessor", "grid_from_latents", "install_monarch_processors",
           "StreamingRotaryPosEmbed", "KVCache", "RowsKVCache", "WanCausalAttnProcessor",
           "install_wan_causal_processors", "uninstall_wan_causal_processors"]
