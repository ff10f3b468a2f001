"""The video avatar's two small models: mouth shape → mouth pixels, and audio features → mouth shape.

    masked region [3, S, S] ─┐
    mask          [1, S, S] ─┼─▶ MouthGenerator (UNet, shape FiLM) ─▶ region [3, S, S] in [0, 1]
    reference     [3, S, S] ─┤
    shape         [P]       ─┘
    audio features [K, D] (the last K frames, causal) ─▶ ShapeHead (linear) ─▶ shape [P]

The shape is :data:`SHAPE_NAMES`, measured from the lip landmarks:

- ``openness``: inner gap / mouth width.
- ``width``: mouth width / face width.
- ``roundness``: outer lip height / width.

Each is standardised per person, as ``(value - mean) / std`` over their video. The generator is trained on the
person's own frames with each frame's *measured* shape. So it is sharp, and its input is always a real mouth
shape. At run time the shape comes from the audio through :class:`ShapeHead`. The lower face is masked in the
target, the jaw line included. So only the shape says how open the mouth is.

Both save and load as diffusers-format folders (:class:`~framegraph.models.pretrained.PretrainedModel`).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from framegraph.stream.media import SAMPLE_RATE

from ...pretrained import PretrainedModel, register_to_config

SHAPE_NAMES = ("openness", "width", "roundness")
# RMS levels (share of full scale) of the no-speech clips the shape head learns to answer with the rest mouth
QUIET_LEVELS = (0.0, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1)
MAX_SHAPE_GAIN = 2.0  # the most the shape head's swing is scaled up to the person's own (fit_shape_head)
GAIN_FOLDS = 8  # the contiguous folds the head's gain is measured on: each fit sees 7/8 of the frames, like the last


def _conv(cin: int, cout: int, k: int = 3, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2)


class _Up(nn.Module):
    """×2 nearest upsample, concat the skip, 1×1 merge, 3×3 conv, FiLM by the shape."""

    def __init__(self, cin: int, cskip: int, cout: int, shape_dim: int):
        super().__init__()
        self.merge = _conv(cin + cskip, cout, 1)
        self.conv = _conv(cout, cout)
        self.film = nn.Linear(shape_dim, 2 * cout)

    def forward(self, x, skip, cond):
        x = F.interpolate(x, size=skip.shape[-2:], mode="nearest")
        x = F.silu(self.merge(torch.cat([x, skip], 1)))
        scale, shift = self.film(cond)[:, :, None, None].chunk(2, 1)
        return F.silu(self.conv(x) * (1 + scale) + shift)


class MouthGenerator(PretrainedModel):
    """A small UNet that redraws the masked lower face of a region for a given mouth shape.

    Args:
        channels: widths of the four strided levels: S/2, S/4, S/8, S/16.
        shape_dim: P, the size of the shape vector.
        sample_size: S, the region side in px it was trained at. Any multiple of 16 runs.

    ``forward(masked [B, 3, S, S], mask [B, 1, S, S], reference [B, 3, S, S], shape [B, P])`` →
    ``float32 [B, 3, S, S]`` in [0, 1]. Images are RGB in [0, 1]. ``mask`` is 1 where the pixels are hidden.
    The skips carry the unmasked pixels and the reference to the output. They do so at full resolution.
    """

    @register_to_config
    def __init__(self, channels: tuple[int, ...] = (24, 48, 96, 96), shape_dim: int = len(SHAPE_NAMES),
                 sample_size: int = 256):
        super().__init__()
        c0, c1, c2, c3 = channels
        cin = 3 + 1 + 3 + shape_dim
        self.cond = nn.Sequential(nn.Linear(shape_dim, 64), nn.SiLU(), nn.Linear(64, 64))
        self.e0 = _conv(cin, c0, 3, 2)
        self.e1 = _conv(c0, c1, 3, 2)
        self.e2 = _conv(c1, c2, 3, 2)
        self.e3 = _conv(c2, c3, 3, 2)
        self.mid = nn.ModuleList([_conv(c3, c3), _conv(c3, c3)])
        self.mid_film = nn.Linear(64, 2 * c3)
        self.u2 = _Up(c3, c2, c2, 64)
        self.u1 = _Up(c2, c1, c1, 64)
        self.u0 = _Up(c1, c0, c0, 64)
        self.out = _conv(c0 + cin, 3)

    def forward(self, masked, mask, reference, shape):
        B, _, H, W = masked.shape
        if H % 16 or W % 16:
            raise ValueError(f"MouthGenerator: region {W}x{H} must be a multiple of 16 px on each side")
        planes = shape[:, :, None, None].expand(B, shape.shape[1], H, W)
        x = torch.cat([masked, mask, reference, planes], 1)
        cond = self.cond(shape)
        h0 = F.silu(self.e0(x))
        h1 = F.silu(self.e1(h0))
        h2 = F.silu(self.e2(h1))
        h = F.silu(self.e3(h2))
        scale, shift = self.mid_film(cond)[:, :, None, None].chunk(2, 1)
        h = h * (1 + scale) + shift
        for conv in self.mid:
            h = h + F.silu(conv(h))
        h = self.u2(h, h2, cond)
        h = self.u1(h, h1, cond)
        h = self.u0(h, h0, cond)
        h = F.interpolate(h, size=(H, W), mode="nearest")
        return torch.sigmoid(self.out(torch.cat([h, x], 1)))


class ShapeHead(PretrainedModel):
    """Audio features of the last ``context`` frames → the standardised mouth shape, by a linear map.

    Args:
        feature_dim: D of the audio encoder's features.
        context: K frames: this one and K - 1 before it. That is causal. The encoder's own look-ahead is inside
            each frame's features.
        shape_dim: P.

    ``forward(features float32 [B, K, D])`` → ``[B, P]``. The input is normalised with the stored per-dimension
    ``mean`` / ``std`` buffers. Weights are fitted in closed form by :func:`fit_shape_head`.
    """

    @register_to_config
    def __init__(self, feature_dim: int = 128, context: int = 3, shape_dim: int = len(SHAPE_NAMES)):
        super().__init__()
        self.register_buffer("mean", torch.zeros(context * feature_dim))
        self.register_buffer("std", torch.ones(context * feature_dim))
        self.linear = nn.Linear(context * feature_dim, shape_dim)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = features.reshape(features.shape[0], -1)
        return self.linear((x - self.mean) / self.std)


def context_windows(features: torch.Tensor, context: int) -> torch.Tensor:
    """``[T, D]`` → ``[T, K, D]``: row ``t`` holds frames ``t - K + 1 .. t``.

    The first frame is repeated before the start. This is what the streaming stage keeps."""
    pad = features[:1].expand(context - 1, -1)
    x = torch.cat([pad, features], 0)
    return torch.stack([x[k:k + len(features)] for k in range(context)], 1)


def fit_shape_head(features: torch.Tensor, shapes: torch.Tensor, *, context: int = 3,
                   ridge: float | None = None, folds: int = 4, quiet_features: list[torch.Tensor] = (),
                   rest: torch.Tensor | None = None, known: list[tuple[torch.Tensor, torch.Tensor]] = (),
                   max_gain: float = MAX_SHAPE_GAIN, gain_folds: int = GAIN_FOLDS) -> tuple[ShapeHead, dict]:
    """Ridge regression of ``shapes [T, P]`` on the causal windows of ``features [T, D]``.

    ``quiet_features``: feature sequences ``[T_i, D]`` of audio without speech. They are silence and noise at several
    levels. Each is windowed on its own. All are answered with ``rest [P]``, the person's mouth in silence. These rows
    are added to every fit and never validated on. So the head keeps the mouth at rest on sounds that are not speech. An
    example is a microphone's hiss. It needs no gate.

    ``known``: ``(features [T_i, D], shapes [T_i, P])`` pairs of other speech. Their shapes are set rather than
    measured. They are typed text spoken by eSpeak NG (:mod:`.espeak_rows`). Its visemes are on the person's scale.
    They are also windowed on their own. They join every fit and are never validated on.

    ``ridge`` None: chosen from a grid by ``folds`` contiguous folds. Each fold is a block of time. So
    neighbouring frames do not leak into the validation.

    Amplitude: a regression answers what it cannot tell apart with the average. So its shapes swing less than
    the person's. The fitted head is scaled by ``gain`` about the person's mean shape over ``shapes``. ``gain``
    is the measured first shape number's std / the folds' predictions' std. It lies within ``[1, max_gain]``.
    So the mouth opens as wide as the person's. On average it opens as far as theirs. The correlation is unchanged.
    The gain's folds are ``gain_folds``, more than the ridge's. A fit on fewer frames swings less on new ones. So
    each fold's fit should see nearly all the frames, as the final fit does.

    The quiet and known rows must still answer their shapes once scaled. So the final fit asks them for ``mean + (shape
    - mean) / gain``. Known rows have shapes that swing, unlike the rest shape. With them, the folds are fitted again,
    asking the same. Then the gain is measured again. That repeats three times. The scale centre is the mean, not the
    rest. Scaling about the rest would move the speech's mean. It would move by ``(gain - 1) · (mean - rest)``.

    Returns the head and a report. It has the ridge chosen and the gain. It has the folds' correlation of the first
    shape number.
    """
    X = context_windows(features.float(), context).reshape(len(features), -1).double()
    Y = shapes.double()
    mean, std = X.mean(0), X.std(0).clamp_min(1e-6)
    Z = (X - mean) / std
    if len(quiet_features) and rest is None:
        raise ValueError("fit_shape_head: quiet_features need the rest shape they stand for")
    centre = Y.mean(0)
    rest_y = torch.as_tensor(rest, dtype=Y.dtype) if rest is not None else centre
    extra = [(f, rest_y.expand(len(f), -1)) for f in quiet_features] + [(f, y.to(Y.dtype)) for f, y in known]
    Zx = torch.cat([(context_windows(f.float(), context).reshape(len(f), -1).double() - mean) / std
                    for f, _ in extra]) if extra else Z[:0]
    Yx = torch.cat([y for _, y in extra]) if extra else Y[:0]

    def solve(Zt, Yt, lam, gain=1.0):  # the quiet and known rows asked for what lands on their shapes once scaled
        Zt, Yt = torch.cat([Zt, Zx]), torch.cat([Yt, centre + (Yx - centre) / gain])
        zm, ym = Zt.mean(0), Yt.mean(0)
        A = (Zt - zm).T @ (Zt - zm) + lam * len(Zt) * torch.eye(Zt.shape[1], dtype=Zt.dtype)
        w = torch.linalg.solve(A, (Zt - zm).T @ (Yt - ym))
        return w, ym - zm @ w

    scores = {}
    grid = [ridge] if ridge is not None else [0.01, 0.03, 0.1, 0.3, 1.0, 3.0]

    def folds_predict(lam, gain=1.0, k=folds):  # each of k folds predicted by a fit on the others (extra rows in all)
        bounds = [round(i * len(Z) / k) for i in range(k + 1)]
        preds = torch.zeros_like(Y)
        for i in range(k):
            val = torch.zeros(len(Z), dtype=torch.bool)
            val[bounds[i]:bounds[i + 1]] = True
            w, b = solve(Z[~val], Y[~val], lam, gain)
            preds[val] = Z[val] @ w + b
        return preds

    def spread(preds):  # the gain that makes the folds' predictions swing as wide as the person
        s = float(Y[:, 0].std() / preds[:, 0].std().clamp_min(1e-9))
        return min(max(s, 1.0), max_gain) if s == s else 1.0

    for lam in grid:
        preds = folds_predict(lam)
        scores[lam] = float(torch.corrcoef(torch.stack([preds[:, 0], Y[:, 0]]))[0, 1])
    best = max(scores, key=lambda k: scores[k] if scores[k] == scores[k] else -2.0)
    gain = spread(folds_predict(best, k=gain_folds))
    if len(known):  # their shapes swing: the folds measured with them asked for what the final fit asks for
        for _ in range(3):
            gain = spread(folds_predict(best, gain, gain_folds))
    w, b = solve(Z, Y, best, gain)
    w, b = gain * w, gain * b + (1 - gain) * centre  # mean + gain · (prediction - mean), still one linear map
    head = ShapeHead(feature_dim=features.shape[1], context=context, shape_dim=shapes.shape[1])
    with torch.no_grad():
        head.mean.copy_(mean.float())
        head.std.copy_(std.float())
        head.linear.weight.copy_(w.T.float())
        head.linear.bias.copy_(b.float())
    return head.eval(), {"ridge": best, "cv_openness_corr": {str(k): round(v, 4) for k, v in scores.items()},
                         "gain": round(gain, 4), "gain_folds": gain_folds,
                         "quiet_rows": sum(len(f) for f in quiet_features), "known_rows": sum(len(f) for f, _ in known)}


def openness_lines(shapes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """How the person's other shape numbers go with their openness.

    Returns ``slope [P - 1]`` and ``intercept [P - 1]`` as float64. They are a least-squares line per number
    over ``shapes [T, P]``."""
    z = shapes.double()
    coef = torch.linalg.lstsq(torch.stack([z[:, 0], torch.ones_like(z[:, 0])], 1), z[:, 1:]).solution
    return coef[0], coef[1]


def follow_openness(head: ShapeHead, shapes: torch.Tensor, rest: torch.Tensor) -> tuple[ShapeHead, torch.Tensor, dict]:
    """The head with every shape number but openness following the predicted openness.

    Openness is the first number. The others follow it as they do in the person's own ``shapes [T, P]``. Each follows a
    least-squares line. That replaces their own regression. The ``rest [P]`` shape is moved onto those lines. It is
    still one linear map.

    Why: the audio tells width and roundness apart far worse than openness. So their regressions answer with about their
    mean, whatever the openness. Scaled by the gain, they make combinations the person never made. The generator draws
    those badly. Returns the head, the rest shape and a report. The report has each line's slope, intercept and
    correlation with openness."""
    z = shapes.double()
    o = z[:, 0]
    coef = torch.stack(openness_lines(shapes))  # [2, P - 1]: slope, intercept
    W, b = head.linear.weight.data.double(), head.linear.bias.data.double()
    W_new, b_new = W.clone(), b.clone()
    W_new[1:] = coef[0][:, None] * W[0][None]
    b_new[1:] = coef[0] * b[0] + coef[1]
    c = head.config
    out = ShapeHead(feature_dim=c.feature_dim, context=c.context, shape_dim=c.shape_dim)
    out.load_state_dict(head.state_dict())
    with torch.no_grad():
        out.linear.weight.copy_(W_new.float())
        out.linear.bias.copy_(b_new.float())
    rest = torch.as_tensor(rest, dtype=torch.float64)
    new_rest = torch.cat([rest[:1], coef[0] * rest[0] + coef[1]]).float()
    r = [float(torch.corrcoef(torch.stack([o, z[:, k]]))[0, 1]) for k in range(1, z.shape[1])]
    return out.eval(), new_rest, {"slope": [round(float(v), 4) for v in coef[0]],
                                  "intercept": [round(float(v), 4) for v in coef[1]], "corr": [round(v, 4) for v in r]}


def quiet_audio(seconds: float = 2.0, levels: tuple[float, ...] = QUIET_LEVELS, seed: int = 0) -> list[np.ndarray]:
    """``int16 [seconds * 16000]`` clips of no speech, for :func:`fit_shape_head`'s ``quiet_features``.

    They are digital silence and white noise at each of ``levels``. A level is an RMS as a share of full scale. A level
    of 1e-4 is ≈ -80 dBFS. A level of 0.1 is -20 dBFS."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds * SAMPLE_RATE))
    return [np.clip(rng.standard_normal(n) * level * 32767, -32768, 32767).astype(np.int16) for level in levels]


def sobel_edges(x: torch.Tensor) -> torch.Tensor:
    """``[B, C, H, W]`` → ``[B, 2C, H, W]``: horizontal and vertical Sobel responses, for the edge loss."""
    k = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], device=x.device, dtype=x.dtype)
    C = x.shape[1]
    kx = k.expand(C, 1, 3, 3)
    ky = k.T.expand(C, 1, 3, 3)
    xp = F.pad(x, (1, 1, 1, 1), mode="replicate")
    return torch.cat([F.conv2d(xp, kx, groups=C), F.conv2d(xp, ky, groups=C)], 1)


def region_loss(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, edge: float = 0.5) -> torch.Tensor:
    """L1 + ``edge`` · L1 of the Sobel edges, weighted per pixel by ``weight [B, 1, H, W]``.

    The masked lower face counts most."""
    w = weight / weight.mean()
    l1 = ((pred - target).abs() * w).mean()
    e = ((sobel_edges(pred) - sobel_edges(target)).abs() * w).mean()
    return l1 + edge * e


__all__ = ["SHAPE_NAMES", "MouthGenerator", "ShapeHead", "context_windows", "fit_shape_head", "follow_openness",
           "quiet_audio",
           "sobel_edges", "region_loss"]
