"""The shipped demo: a spinning beach ball bouncing on a checkered floor while coloured blobs fade in
and out, built from ~1 500 4D Gaussians by our own code and saved as a fudan-zvg checkpoint.

    python -m framegraph.renderers.gaussians4d.demo --out assets/scenes4d/bouncing_ball.pth

Every moving part is a chain of 4D Gaussians: a Gaussian centred at time ``tau`` with temporal
standard deviation ``sigma_t``, spatial covariance ``C`` and velocity ``v`` has the 4D covariance

    [[C + sigma_t^2 v v^T, sigma_t^2 v], [sigma_t^2 v^T, sigma_t^2]]

so that slicing it at ``t`` gives mean ``mu + v (t - tau)``, covariance ``C`` and opacity
``o exp(-(t - tau)^2 / (2 sigma_t^2))``. A trajectory is followed piecewise linearly by Gaussians
spaced ``SEGMENT_S`` apart in time. The scene spans ``time_duration = (0, 2)`` seconds and loops
seamlessly (the motion is periodic and the chains run past both ends).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from torch import Tensor

from .io import save_checkpoint
from .reference import rotmat4_to_quats
from .scene import Gaussian4DScene

DURATION_S = 2.0
SEGMENT_S = 0.1  # time between consecutive Gaussians of a moving point
SH_C0 = 0.28209479177387814
SH_BLOCK = 16  # the demo stores SH degree 3 (zeros above the DC term) with one temporal block

BALL_RADIUS = 0.22
BOUNCE_HEIGHT = 0.9
BOUNCE_PERIOD_S = 1.0


def gaussians_from_motion(C: Tensor, sigma_t: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Scales ``[N, 4]`` and quaternions ``(q_l, q_r)`` ``[N, 4]`` of 4D Gaussians whose slices have
    covariance ``C [N, 3, 3]``, temporal std ``sigma_t [N]`` and velocity ``v [N, 3]`` (float64 in)."""
    n = C.shape[0]
    var_t = sigma_t**2
    cov = torch.zeros(n, 4, 4, dtype=torch.float64)
    cov[:, :3, :3] = C + var_t[:, None, None] * v[:, :, None] * v[:, None, :]
    cov[:, :3, 3] = cov[:, 3, :3] = var_t[:, None] * v
    cov[:, 3, 3] = var_t
    lam, V = torch.linalg.eigh(cov)
    V[:, :, 0] *= torch.sign(torch.linalg.det(V))[:, None]  # a rotation, det +1
    ql, qr = rotmat4_to_quats(V)
    return torch.sqrt(lam.clamp(min=1e-12)), ql, qr


def _rgb_to_dc(rgb) -> Tensor:
    return (torch.as_tensor(rgb, dtype=torch.float64) - 0.5) / SH_C0


def _fibonacci_sphere(n: int) -> Tensor:
    i = torch.arange(n, dtype=torch.float64) + 0.5
    z = 1 - 2 * i / n
    phi = math.pi * (1 + 5**0.5) * i
    r = torch.sqrt(1 - z * z)
    return torch.stack([r * torch.cos(phi), r * torch.sin(phi), z], dim=-1)


def _ball_center(t: Tensor) -> tuple[Tensor, Tensor]:
    """Centre ``[T, 3]`` and velocity ``[T, 3]`` of the ball at times ``t [T]`` (periodic in DURATION_S)."""
    w = 2 * math.pi / DURATION_S
    u = torch.remainder(t / BOUNCE_PERIOD_S, 1.0)
    x, vx = 0.7 * torch.sin(w * t), 0.7 * w * torch.cos(w * t)
    y, vy = 0.35 * torch.sin(2 * w * t), 0.7 * w * torch.cos(2 * w * t)
    z = BALL_RADIUS + BOUNCE_HEIGHT * 4 * u * (1 - u)
    vz = BOUNCE_HEIGHT * 4 * (1 - 2 * u) / BOUNCE_PERIOD_S
    return torch.stack([x, y, z], -1), torch.stack([vx, vy, vz], -1)


class _Builder:
    """Collects Gaussians as (mean, time, C, sigma_t, velocity, opacity, dc, temporal dc)."""

    def __init__(self):
        self.parts: list[dict] = []

    def add(self, mean, tau, C, sigma_t, v, opacity, dc, dc_t=None):
        n = mean.shape[0]
        f = lambda x, shape: torch.as_tensor(x, dtype=torch.float64).expand(shape).clone()  # noqa: E731
        self.parts.append({
            "mean": f(mean, (n, 3)), "tau": f(tau, (n,)), "C": f(C, (n, 3, 3)), "sigma_t": f(sigma_t, (n,)),
            "v": f(v, (n, 3)), "opacity": f(opacity, (n,)), "dc": f(dc, (n, 3)),
            "dc_t": f(dc_t if dc_t is not None else 0.0, (n, 3)),
        })

    def build(self) -> Gaussian4DScene:
        cat = {k: torch.cat([p[k] for p in self.parts]) for k in self.parts[0]}
        scales, ql, qr = gaussians_from_motion(cat["C"], cat["sigma_t"], cat["v"])
        n = scales.shape[0]
        sh = torch.zeros(n, 2 * SH_BLOCK, 3, dtype=torch.float64)
        sh[:, 0], sh[:, SH_BLOCK] = cat["dc"], cat["dc_t"]
        return Gaussian4DScene(
            means=cat["mean"].float(), times=cat["tau"].float(), scales=scales.float(), quats_l=ql.float(),
            quats_r=qr.float(), opacities=cat["opacity"].float(), sh=sh.float(), sh_degree_t=1,
            time_duration=(0.0, DURATION_S),
        )


def _add_floor(b: _Builder) -> None:
    n = 12
    g = (torch.arange(n, dtype=torch.float64) - (n - 1) / 2) * 0.25
    gx, gy = torch.meshgrid(g, g, indexing="ij")
    xy = torch.stack([gx.flatten(), gy.flatten()], -1)
    mean = torch.cat([xy, torch.zeros(n * n, 1, dtype=torch.float64)], -1)
    checker = ((torch.arange(n)[:, None] + torch.arange(n)[None, :]) % 2).flatten().bool()
    dc = torch.where(checker[:, None], _rgb_to_dc((0.85, 0.85, 0.8)), _rgb_to_dc((0.25, 0.3, 0.45)))
    C = torch.diag(torch.tensor([0.1, 0.1, 0.01], dtype=torch.float64) ** 2)
    # static: centred mid-loop, far wider in time than the loop, so its marginal stays ~1
    b.add(mean, DURATION_S / 2, C, 100.0, 0.0, 0.98, dc)


def _add_ball(b: _Builder) -> None:
    surface = _fibonacci_sphere(48) * (BALL_RADIUS - 0.08)
    sector = torch.floor((torch.atan2(surface[:, 1], surface[:, 0]) + math.pi) / (2 * math.pi) * 6).long() % 6
    palette = torch.stack([_rgb_to_dc(c) for c in [(0.95, 0.15, 0.1), (0.97, 0.97, 0.95), (0.1, 0.35, 0.95),
                                                   (0.97, 0.97, 0.95), (1.0, 0.85, 0.1), (0.97, 0.97, 0.95)]])
    dc = palette[sector]
    spin = 2 * math.pi / DURATION_S  # one turn per loop, about the y axis
    C = torch.eye(3, dtype=torch.float64) * 0.08**2
    n_seg = round(DURATION_S / SEGMENT_S)
    for k in range(-1, n_seg + 1):  # one segment past each end, so the loop is seamless
        tau = (k + 0.5) * SEGMENT_S
        centre, vel = _ball_center(torch.tensor([tau], dtype=torch.float64))
        a = spin * tau
        rot = torch.tensor([[math.cos(a), 0, math.sin(a)], [0, 1, 0], [-math.sin(a), 0, math.cos(a)]],
                           dtype=torch.float64)
        offset = surface @ rot.T
        omega = torch.tensor([0.0, spin, 0.0], dtype=torch.float64)
        v = vel + torch.linalg.cross(omega.expand_as(offset), offset, dim=-1)
        b.add(centre + offset, tau, C, 0.5 * SEGMENT_S, v, 0.9, dc)


def _add_blobs(b: _Builder, g: torch.Generator) -> None:
    blobs = [  # (appear time, centre, velocity, colour, colour shift at the peak)
        (0.3, (-0.9, 0.8, 0.8), (0.5, 0.0, 0.1), (0.1, 0.9, 0.3), (0.2, -0.3, 0.3)),
        (0.8, (0.9, 0.7, 0.6), (0.0, -0.5, 0.2), (0.1, 0.8, 0.95), (0.3, 0.2, -0.3)),
        (1.3, (0.8, -0.9, 0.9), (-0.5, 0.1, 0.0), (0.95, 0.2, 0.85), (-0.3, 0.3, 0.1)),
        (1.8, (-0.8, -0.8, 0.7), (0.2, 0.5, 0.0), (1.0, 0.75, 0.1), (-0.2, 0.1, 0.3)),
    ]
    sigma_t = 0.18
    reach = 2.5 * sigma_t  # beyond this the marginal is below the 0.05 cull threshold
    for tau, centre, vel, rgb, shift in blobs:
        n = 40
        offsets = torch.randn(n, 3, generator=g, dtype=torch.float64) * 0.12
        stds = 0.05 + 0.05 * torch.rand(n, generator=g, dtype=torch.float64)
        C = torch.diag_embed(stds[:, None].expand(n, 3) ** 2)
        for shift_t in (-DURATION_S, 0.0, DURATION_S):  # copies so blobs near the ends wrap around
            tc = tau + shift_t
            if tc + reach < 0 or tc - reach > DURATION_S:
                continue
            b.add(torch.tensor(centre, dtype=torch.float64) + offsets, tc, C, sigma_t, vel, 0.85,
                  _rgb_to_dc(rgb), torch.as_tensor(shift, dtype=torch.float64) / SH_C0)


def demo_scene(seed: int = 0) -> Gaussian4DScene:
    """The demo scene (deterministic for a given ``seed``)."""
    g = torch.Generator().manual_seed(seed)
    b = _Builder()
    _add_floor(b)
    _add_ball(b)
    _add_blobs(b, g)
    return b.build()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m framegraph.renderers.gaussians4d.demo",
                                description="Build the 4DGS demo scene and save it as a fudan-zvg checkpoint.")
    p.add_argument("--out", required=True, help="output .pth (a .json sidecar with time_duration goes beside it)")
    p.add_argument("--seed", type=int, default=0, help="random seed for the blobs (default 0)")
    args = p.parse_args(argv)
    scene = demo_scene(args.seed)
    path = save_checkpoint(scene, args.out)
    print(f"wrote {path}: {scene.n} 4D Gaussians, time_duration {scene.time_duration}, "
          f"{Path(path).stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
