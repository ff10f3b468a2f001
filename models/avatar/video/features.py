"""What a video avatar's shape head hears: the audio encoder's features, alone or with Whisper's beside them.

    audio ─▶ joined features [T, D + W] (:func:`~framegraph.models.audio.joined.joined_features`: the encoder's D,
             then Whisper's W) ─▶ each candidate's columns ─▶ the shape head fitted on each, same folds and rows
          ─▶ the best cross-validated openness fit kept, its head folded back onto the raw columns

The candidates are :data:`CHOICES`:

- ``"encoder"``: the encoder's D columns alone. Every bundle heard this before. It runs without Whisper.
- ``"encoder+whisper16"``: the encoder's columns and the first 16 principal components of Whisper's. The
  components are of the training frames, each scaled to unit variance.
- ``"encoder+whisper"``: all D + W columns.

A head fitted on principal components is one linear map of the raw columns too (:func:`fold_head`). So a
bundle's head reads the raw joined features, whatever was chosen. The live graph runs
:class:`~framegraph.models.audio.joined.JoinedFeatures`. For ``"encoder"`` it runs the encoder's stage alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .lipsync import ShapeHead

CHOICES = ("encoder", "encoder+whisper16", "encoder+whisper")
PCA_DIMS = 16


@dataclass
class Columns:
    """One candidate: ``x [T, D + W]`` (raw joined) → ``x @ A + c`` (``A [D + W, d]``), the columns its head reads."""

    name: str
    A: torch.Tensor
    c: torch.Tensor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.double() @ self.A + self.c

    @property
    def raw_dim(self) -> int:
        """How many raw columns a bundle's head reads: D for ``"encoder"``, else D + W."""
        return self.A.shape[1] if self.name == "encoder" else self.A.shape[0]


def candidates(joined_train: torch.Tensor, encoder_dim: int, names=CHOICES) -> list[Columns]:
    """The candidates' maps for ``joined_train [T, D + W]``; ``names`` is a subset of :data:`CHOICES`.

    ``joined_train`` holds the training frames. The principal components are theirs."""
    x = joined_train.double()
    total = x.shape[1]
    out = []
    for name in names:
        if name == "encoder":
            A = torch.eye(total, encoder_dim, dtype=torch.float64)
            out.append(Columns(name, A, torch.zeros(encoder_dim, dtype=torch.float64)))
        elif name == "encoder+whisper":
            out.append(Columns(name, torch.eye(total, dtype=torch.float64), torch.zeros(total, dtype=torch.float64)))
        elif name == f"encoder+whisper{PCA_DIMS}":
            w = x[:, encoder_dim:]
            mean = w.mean(0)
            _, _, v = torch.linalg.svd(w - mean, full_matrices=False)
            basis = v[:PCA_DIMS].T  # [W, k]
            scale = ((w - mean) @ basis).std(0).clamp_min(1e-9)
            A = torch.zeros(total, encoder_dim + basis.shape[1], dtype=torch.float64)
            A[:encoder_dim, :encoder_dim] = torch.eye(encoder_dim, dtype=torch.float64)
            A[encoder_dim:, encoder_dim:] = basis / scale
            c = torch.cat([torch.zeros(encoder_dim, dtype=torch.float64), -(mean @ basis) / scale])
            out.append(Columns(name, A, c))
        else:
            raise ValueError(f"audio features {name!r}: expected one of {CHOICES}")
    return out


def fold_head(head: ShapeHead, columns: Columns) -> ShapeHead:
    """``head``, which reads ``columns(x)``, as a head reading the raw ``x``.

    The raw ``x`` has :attr:`Columns.raw_dim` columns. The numbers are the same; it is one linear map.
    ``"encoder"`` heads come back unchanged, since they read the encoder's columns."""
    if columns.name == "encoder":
        return head
    c = head.config
    K, d = c.context, c.feature_dim
    W = head.linear.weight.data.double().reshape(c.shape_dim, K, d)
    mu, sigma = head.mean.double().reshape(K, d), head.std.double().reshape(K, d)
    scaled = W / sigma  # [P, K, d]
    new_w = torch.einsum("pkd,nd->pkn", scaled, columns.A)  # [P, K, D + W]
    new_b = head.linear.bias.data.double() + torch.einsum("pkd,kd->p", scaled, columns.c[None] - mu)
    out = ShapeHead(feature_dim=columns.A.shape[0], context=K, shape_dim=c.shape_dim)
    with torch.no_grad():
        out.linear.weight.copy_(new_w.reshape(c.shape_dim, -1).float())
        out.linear.bias.copy_(new_b.float())
    return out.eval()


__all__ = ["CHOICES", "PCA_DIMS", "Columns", "candidates", "fold_head"]
