"""Rectified-flow conventions, the Euler sampler, flow-matching and consistency-distillation losses,
checked against closed-form velocity fields of Gaussian transports."""
from __future__ import annotations

import math

import pytest
import torch

from framegraph.models.sampler import (
    distill_loss,
    expand_time,
    flow_matching_loss,
    interpolate,
    predict_x0,
    sample_euler,
    sample_timesteps,
    shift_time,
    timestep_schedule,
)

MU, S = 1.5, 0.5  # data N(MU, S^2) per dimension


def straight_field(x, t):
    """Exact velocity of the deterministic Gaussian-to-Gaussian transport eps = (x0 - MU) / S: its
    paths x_t = (1 - t) x0 + t eps are straight, so v(x_t, t) = eps - x0 exactly."""
    t = expand_time(t, x)
    x0 = (x + t * MU / S) / ((1 - t) + t / S)
    return (x0 - MU) / S - x0


def marginal_field(x, t):
    """Exact marginal velocity E[eps - x0 | x_t] for x0 ~ N(MU, S^2), eps ~ N(0, 1) independent."""
    t = expand_time(t, x)
    var = (1 - t) ** 2 * S**2 + t**2
    return -MU + (t - (1 - t) * S**2) / var * (x - (1 - t) * MU)


MODES = torch.tensor([[2.0, 2.0], [-2.0, 2.0], [2.0, -2.0], [-2.0, -2.0]], dtype=torch.float64)
MODE_STD = 0.1


def mixture_field(x, t):
    """Exact marginal velocity for x0 ~ equal mixture of N(MODES[k], MODE_STD^2 I) in 2-D."""
    t = expand_time(t, x)  # [B, 1]
    var = (1 - t) ** 2 * MODE_STD**2 + t**2  # [B, 1]
    means = (1 - t)[:, None] * MODES[None]  # [B, K, 2]
    logp = -((x[:, None] - means) ** 2).sum(-1) / (2 * var)  # [B, K]
    r = torch.softmax(logp, dim=1)
    cov = t - (1 - t) * MODE_STD**2
    per = -MODES[None] + (cov / var)[:, None] * (x[:, None] - means)  # E[eps - x0 | x_t, k]
    return (r[..., None] * per).sum(1)


def test_schedule_runs_from_noise_to_data_and_shift_moves_it_towards_noise():
    ts = timestep_schedule(4)
    assert torch.allclose(ts, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    shifted = timestep_schedule(4, shift=3.0)
    assert shifted[0] == 1 and shifted[-1] == 0
    assert (shifted[1:-1] > ts[1:-1]).all() and (shifted[1:] < shifted[:-1]).all()
    assert torch.allclose(shift_time(torch.tensor(0.5), 3.0), torch.tensor(0.75))
    with pytest.raises(ValueError, match="steps"):
        timestep_schedule(0)


def test_interpolation_conventions():
    x0, eps = torch.randn(3, 2, 5, 4, 4), torch.randn(3, 2, 5, 4, 4)
    assert torch.equal(interpolate(x0, eps, torch.zeros(3)), x0)
    assert torch.equal(interpolate(x0, eps, torch.ones(3)), eps)
    t = torch.rand(3, 5)  # per frame of [B, C, T, h, w]
    x_t = interpolate(x0, eps, t)
    assert torch.allclose(x_t[:, :, 2],
                          (1 - t[:, 2, None, None, None]) * x0[:, :, 2] + t[:, 2, None, None, None] * eps[:, :, 2])
    assert torch.allclose(predict_x0(x_t, eps - x0, t), x0, atol=1e-6)
    with pytest.raises(ValueError, match="expected"):
        expand_time(torch.rand(3, 4), x0)


@pytest.mark.parametrize("steps, shift", [(1, 1.0), (2, 1.0), (4, 3.0)])
def test_few_step_euler_is_exact_on_straight_paths(steps, shift):
    eps = torch.randn(64, 3, dtype=torch.float64)
    x = sample_euler(straight_field, eps, steps=steps, shift=shift)
    assert torch.allclose(x, MU + S * eps, atol=1e-10)


def test_many_step_sampler_recovers_a_2d_mixture():
    g = torch.Generator().manual_seed(0)
    eps = torch.randn(4000, 2, generator=g, dtype=torch.float64)
    x = sample_euler(mixture_field, eps, steps=60, shift=1.0)
    dist = torch.cdist(x, MODES)
    nearest = dist.argmin(dim=1)
    assert dist.min(dim=1).values.median() < 2 * MODE_STD
    counts = torch.bincount(nearest, minlength=4).double() / len(x)
    assert torch.allclose(counts, torch.full((4,), 0.25, dtype=torch.float64), atol=0.04), counts
    for k in range(4):  # each mode recovered with its mean and spread
        pts = x[nearest == k]
        assert torch.allclose(pts.mean(0), MODES[k], atol=0.03)
        assert abs(pts.std(0).mean().item() - MODE_STD) < 0.03


def test_renoise_sampler_matches_euler_for_one_step_and_stays_on_the_data():
    eps = torch.randn(256, 3, dtype=torch.float64)
    assert torch.allclose(sample_euler(straight_field, eps, steps=1, renoise=True),
                          sample_euler(straight_field, eps, steps=1))
    x = sample_euler(marginal_field, eps, steps=4, renoise=True, generator=torch.Generator().manual_seed(0))
    assert abs(x.mean().item() - MU) < 0.1


def test_flow_matching_loss_is_zero_for_the_exact_field_of_a_gaussian_transport():
    x0 = MU + S * torch.randn(512, 3, dtype=torch.float64)
    coupled = (x0 - MU) / S
    assert flow_matching_loss(straight_field, x0, noise=coupled).item() < 1e-20
    wrong = flow_matching_loss(lambda x, t: straight_field(x, t) + 0.1, x0, noise=coupled).item()
    assert math.isclose(wrong, 0.01, rel_tol=1e-6)


def test_flow_matching_loss_of_the_marginal_field_is_the_conditional_variance():
    """With independent noise, the minimum over fields is Var(eps - x0 | x_t) = S^2 / ((1-t)^2 S^2 + t^2)."""
    g = torch.Generator().manual_seed(0)
    x0 = MU + S * torch.randn(200_000, 1, generator=g, dtype=torch.float64)
    for t in (0.2, 0.5, 0.9):
        tt = torch.full((len(x0),), t, dtype=torch.float64)
        loss = flow_matching_loss(marginal_field, x0, t=tt, generator=g).item()
        expected = S**2 / ((1 - t) ** 2 * S**2 + t**2)
        assert math.isclose(loss, expected, rel_tol=0.02), (t, loss, expected)
        worse = flow_matching_loss(lambda x, tt: marginal_field(x, tt) * 1.1, x0, t=tt, generator=g).item()
        assert worse > loss


def test_flow_matching_loss_passes_conditioning_and_per_frame_times():
    seen = {}

    def model(x, t, scale):
        seen["t"], seen["scale"] = t.shape, scale
        return torch.zeros_like(x)

    x0 = torch.randn(2, 3, 4, 2, 2)
    flow_matching_loss(model, x0, dict(scale=2.0), time_shape=(2, 2), time_repeat=2)
    assert seen == {"t": (2, 4), "scale": 2.0}
    t = sample_timesteps((5, 3), repeat=2, generator=torch.Generator().manual_seed(0))
    assert t.shape == (5, 6) and torch.equal(t[:, 0], t[:, 1]) and ((t > 0) & (t < 1)).all()


def test_distill_loss_is_zero_for_a_consistent_student_and_positive_otherwise():
    x0 = MU + S * torch.randn(256, 3, dtype=torch.float64)
    coupled = (x0 - MU) / S
    zero = distill_loss(straight_field, straight_field, x0, noise=coupled, intervals=16, skip=2, teacher_steps=2)
    assert zero.item() < 1e-20
    off = distill_loss(lambda x, t: straight_field(x, t) * 1.05, straight_field, x0, target=straight_field,
                       noise=coupled, generator=torch.Generator().manual_seed(0))
    assert off.item() > 1e-4
    huber = distill_loss(straight_field, straight_field, x0, noise=coupled, huber_c=0.01)
    assert huber.item() < 1e-12
    with pytest.raises(ValueError, match="skip"):
        distill_loss(straight_field, straight_field, x0, intervals=4, skip=5)


def test_distilling_a_curved_teacher_gives_one_step_samples_of_the_data_distribution():
    """The marginal field of N(MU, S^2) has curved paths: one teacher Euler step collapses every sample
    onto the mean. Consistency-distilled into an affine student (coefficients cubic in t), one student
    step lands where 40 teacher steps do."""
    coef = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)

    def student(x, t):
        tt = expand_time(t, x)
        powers = torch.stack([tt**i for i in range(4)])
        a, b = (torch.tensordot(coef[i], powers, dims=1) for i in range(2))
        return a * x + b

    opt = torch.optim.Adam([coef], lr=0.05)
    g = torch.Generator().manual_seed(1)
    for _ in range(300):
        x0 = MU + S * torch.randn(512, 1, generator=g, dtype=torch.float64)
        loss = distill_loss(student, marginal_field, x0, intervals=8, teacher_steps=8, generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
    eps = torch.randn(4096, 1, generator=g, dtype=torch.float64)
    target = sample_euler(marginal_field, eps, steps=40)
    teacher_one = sample_euler(marginal_field, eps, steps=1)
    assert teacher_one.std() < 1e-6  # one teacher step: the mean, for every sample
    with torch.no_grad():
        one = sample_euler(student, eps, steps=1)
    assert abs(one.mean().item() - target.mean().item()) < 0.03 and abs(one.std().item() - target.std().item()) < 0.03
    assert (one - target).pow(2).mean().item() < 0.01 * (teacher_one - target).pow(2).mean().item()
