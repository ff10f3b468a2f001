"""The video avatar's texture critic, for training only. It asks the generated lips for the grain of real lips.

An L1 loss alone draws an average. It is the average of the lips it has seen for a shape. That is a blur. A small
PatchGAN critic on the lips' box sharpens them. It must not see how open the mouth is. A critic that sees the whole
mouth pulls it away from the shape asked for. That breaks the sync. It must also be kept from running away. The hinge
term ``-D(fake)`` has no floor. So::

    lips' box of the real / pasted frame [B, 3, h, w] + mask ─▶ TextureCritic (receptive field 10 px)
        critic:    hinge loss
        generator: softplus(-D(fake)) (bounded: no pull once the critic is fooled)
    CriticGuard watches the generator's own L1 loss; if it climbs well above its best since the critic came
    in, the generator goes back to its last healthy weights and finishes without the critic.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

CRITIC_FIELD_PX = 10  # TextureCritic's receptive field: 3 + 3 (4×4, stride 2) + 4 (3×3 at stride 2)


class TextureCritic(nn.Module):
    """A PatchGAN critic that judges the grain of the lips, not the shape of the mouth.

    Its receptive field is :data:`CRITIC_FIELD_PX` px. That is too small to see how open a mouth is. The layers are a
    3×3 conv, a 4×4 stride-2 conv and a 3×3 conv. They use spectral norm.

    ``forward(pictures [B, 3, h, w] in [0, 1], mask [B, 1, h, w])`` → scores ``[B, 1, h/2, w/2]``. Real scores
    are > 0.
    """

    def __init__(self, width: int = 32):
        super().__init__()
        sn = nn.utils.spectral_norm
        self.net = nn.Sequential(sn(nn.Conv2d(4, width, 3, 1, 1)), nn.LeakyReLU(0.2),
                                 sn(nn.Conv2d(width, 2 * width, 4, 2, 1)), nn.LeakyReLU(0.2),
                                 sn(nn.Conv2d(2 * width, 1, 3, 1, 1)))

    def forward(self, pictures: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([pictures * 2 - 1, mask], 1))


def critic_loss(critic: TextureCritic, real: torch.Tensor, fake: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The critic's hinge loss on ``real`` and generated ``fake`` pictures ``[B, 3, h, w]``, with their ``mask``.

    ``fake`` is detached."""
    return F.relu(1 - critic(real, mask)).mean() + F.relu(1 + critic(fake.detach(), mask)).mean()


def adversarial_loss(critic: TextureCritic, fake: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The generator's term: ``softplus(-D(fake))``.

    Its slope is at most 1. It has none once the critic calls the lips real. The hinge's ``-D(fake)`` would keep
    pulling without end."""
    return F.softplus(-critic(fake, mask)).mean()


def lips_box(lips: torch.Tensor, pad: int = 4) -> tuple[slice, slice]:
    """``(rows, cols)`` of the box around where ``lips [S, S]`` > 0.5, ``pad`` px wider.

    ``lips`` covers every frame's lips. The box is the whole picture when there are no lips."""
    ys, xs = torch.nonzero(lips > 0.5, as_tuple=True)
    if len(ys) == 0:
        return slice(None), slice(None)
    S = lips.shape[0]
    return (slice(max(int(ys.min()) - pad, 0), min(int(ys.max()) + pad + 1, S)),
            slice(max(int(xs.min()) - pad, 0), min(int(xs.max()) + pad + 1, S)))


@dataclass
class CriticGuard:
    """Watches the generator's L1 loss while the critic is on.

    The loss is a running mean over ~``1 / smoothing`` steps. Call :meth:`update` each step. Every ``every`` steps it
    may keep a copy of the generator and its optimizer. It does so if the loss is within ``keep`` × its best since the
    critic came in. It trips when the loss exceeds ``trip`` × that best. Then the last copy is put back.
    :attr:`dropped_at` records the step. The critic is off from then on. A healthy critic raises the L1 loss a little.
    It trades the average for a sharp sample. A runaway one raises it several-fold.
    """

    smoothing: float = 0.02
    every: int = 100
    keep: float = 1.15
    trip: float = 1.5
    mean: float | None = None
    best: float | None = None
    dropped_at: int | None = None
    _saved: tuple | None = field(default=None, repr=False)

    def update(self, step: int, l1: float, critic_on: bool, model: nn.Module, opt: torch.optim.Optimizer) -> bool:
        """Take this step's ``l1``; returns True when the guard trips at this step.

        ``l1`` is of ``model``'s weights as they are. Call it before the optimizer step. Then a copy holds the weights
        that scored it. Its optimizer is one the critic has not yet moved. When it trips, ``model`` and ``opt`` are
        already back at their last healthy copy."""
        self.mean = l1 if self.mean is None else self.mean + self.smoothing * (l1 - self.mean)
        if not critic_on or self.dropped_at is not None:
            return False
        self.best = self.mean if self.best is None else min(self.best, self.mean)
        if self._saved is not None and self.mean > self.trip * self.best:
            model.load_state_dict(self._saved[0])
            opt.load_state_dict(self._saved[1])
            self.dropped_at = step
            return True
        if self._saved is None or (step % self.every == 0 and self.mean <= self.keep * self.best):
            self._saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))
        return False


__all__ = ["CRITIC_FIELD_PX", "TextureCritic", "critic_loss", "adversarial_loss", "lips_box", "CriticGuard"]
