"""Small bias-free MLPs in readable torch. They have the shape of tiny-cuda-nn's ``FullyFusedMLP``.

An MLP is a list of weight matrices ``[W_0 [in, H], W_1 [H, H], ..., W_k [H, out]]``. They apply to row vectors:
``h = relu(h @ W_i)`` for every layer but the last. Then ``y = act(h @ W_k)``, with ``act`` ``"none"`` or
``"sigmoid"``. There are no biases, as in instant-ngp. The hash features carry the offsets.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

OUTPUT_ACTIVATIONS = ("none", "sigmoid")


def mlp_forward(x: Tensor, weights: Sequence[Tensor], output_activation: str = "none") -> Tensor:
    """``x [N, in]`` through ``weights`` → ``[N, out]``."""
    if output_activation not in OUTPUT_ACTIVATIONS:
        raise ValueError(f"mlp: output_activation={output_activation!r}; expected one of {OUTPUT_ACTIVATIONS}")
    h = x
    for w in weights[:-1]:
        h = torch.relu(h @ w)
    y = h @ weights[-1]
    return torch.sigmoid(y) if output_activation == "sigmoid" else y


def init_weights(sizes: Sequence[int], generator: torch.Generator | None = None) -> list[Tensor]:
    """He-uniform matrices, with ReLU gain, for layer widths ``sizes = [in, H, ..., out]``."""
    out = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        bound = (6.0 / fan_in) ** 0.5
        out.append((torch.rand(fan_in, fan_out, generator=generator) * 2 - 1) * bound)
    return out
