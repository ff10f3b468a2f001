"""The video avatar's texture critic: it sees the lips' grain, not the mouth's shape, and a guard stops it
from wrecking the generator."""
import dataclasses

import numpy as np
import torch

from framegraph.models.avatar.video.critic import CRITIC_FIELD_PX, CriticGuard, TextureCritic, lips_box
from framegraph.models.avatar.video.lipsync import region_loss
from framegraph.models.avatar.video.train import VideoTrainConfig, train_generator


def test_texture_critic_sees_the_grain_of_the_lips_not_the_shape_of_the_mouth():
    """A score moves only with pixels within CRITIC_FIELD_PX of it: too close to tell how open a mouth is
    (a critic that saw the whole mouth pulled it away from the shape asked for and broke the sync)."""
    x = torch.rand(1, 3, 64, 64, requires_grad=True)
    TextureCritic()(x, torch.ones(1, 1, 64, 64))[0, 0, 16, 16].backward()
    ys, xs = torch.nonzero(x.grad.abs().sum((0, 1)) > 0, as_tuple=True)
    assert ys.max() - ys.min() + 1 == xs.max() - xs.min() + 1 == CRITIC_FIELD_PX == 10


def test_lips_box_pads_the_lips_and_stays_inside():
    lips = torch.zeros(40, 40)
    lips[30:38, 10:20] = 1
    assert lips_box(lips, pad=4) == (slice(26, 40), slice(6, 24))
    assert lips_box(torch.zeros(8, 8)) == (slice(None), slice(None))


def test_guard_puts_back_the_last_healthy_weights_when_the_loss_climbs():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(model.parameters())
    guard = CriticGuard(smoothing=0.5, every=10)
    for step in range(30):  # healthy: the loss keeps falling, a copy is kept every 10 steps
        assert not guard.update(step, 1.0 / (step + 1), critic_on=step >= 5, model=model, opt=opt)
    healthy = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight += 5  # the critic runs away with the weights ...
    tripped = [guard.update(step, 1.0, critic_on=True, model=model, opt=opt) for step in range(30, 40)]
    assert tripped.count(True) == 1 and guard.dropped_at == 30 + tripped.index(True)  # ... once, and is dropped
    assert all(torch.equal(v, healthy[k]) for k, v in model.state_dict().items())
    assert not guard.update(40, 5.0, critic_on=True, model=model, opt=opt)  # off for good


def _mouths(n: int = 48, size: int = 32, seed: int = 0):
    """Frames of a face-coloured region with a dark mouth whose height is the shape (``uint8 [n, S, S, 3]``,
    standardised shapes ``[n, 1]``), the mask, reference and lips."""
    rng = np.random.default_rng(seed)
    open_px = rng.uniform(1, 7, n)
    yy, xx = np.mgrid[:size, :size]
    frames = np.empty((n, size, size, 3), np.uint8)
    frames[:] = (200, 150, 130)
    for i, h in enumerate(open_px):
        inside = ((xx - size / 2) / 8) ** 2 + ((yy - 22) / h) ** 2 < 1
        frames[i][inside] = (60, 20, 30)
    frames = np.clip(frames + rng.normal(0, 6, frames.shape), 0, 255).astype(np.uint8)  # grain
    mask = torch.zeros(size, size)
    mask[12:, 4:-4] = 1
    lips = torch.zeros(size, size)
    lips[14:31, 8:-8] = 1
    shapes = torch.tensor((open_px - open_px.mean()) / open_px.std(), dtype=torch.float32)[:, None]
    return torch.from_numpy(frames), shapes, mask, torch.from_numpy(frames[0]), lips


def _l1(model, regions, shapes, mask, reference):
    x = regions.permute(0, 3, 1, 2).float() / 255
    m = mask[None, None].expand(len(x), -1, -1, -1)
    ref = reference.permute(2, 0, 1)[None].float().expand(len(x), -1, -1, -1) / 255
    with torch.no_grad():
        return region_loss(model(x * (1 - m), m, ref, shapes), x, 1 + m).item()


def test_a_runaway_critic_is_dropped_and_the_generator_keeps_what_it_learned():
    """Trained for real on small mouths: at the default weight the critic stays in; at 1000× it runs away,
    the guard drops it, and the generator ends as good as one trained without a critic."""
    data = _mouths()
    cfg = VideoTrainConfig(steps=300, batch=8, channels=(8, 16, 16, 16), critic_start=100)
    scores, reports = {}, {}
    for weight in (0.0, cfg.critic_weight, 1000 * cfg.critic_weight):
        model, history, reports[weight] = train_generator(*data[:4], dataclasses.replace(cfg, critic_weight=weight),
                                                          lips=data[4])
        scores[weight] = _l1(model, *data[:4])
        assert history[-1]["step"] == 299 and "l1" in history[-1]
    assert reports[0.0]["dropped_at"] is None and reports[0.0]["weight"] == 0.0
    assert reports[cfg.critic_weight]["dropped_at"] is None
    assert reports[1000 * cfg.critic_weight]["dropped_at"] is not None
    assert scores[1000 * cfg.critic_weight] < 1.3 * scores[0.0], scores
