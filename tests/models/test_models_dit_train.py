"""Training the DiT: flow matching with teacher forcing learns a conditioned latent sequence, and its
1-step streamed sample follows the condition; the distillation loss runs on the DiT."""
from __future__ import annotations

import torch

from framegraph.models.dit import AvatarDiT, generate
from framegraph.models.sampler import distill_loss, flow_matching_loss, sample_timesteps

C, H, W, T, F = 4, 2, 2, 4, 8


class MouthData:
    """Synthetic talking latents: frame f = base + (2 m_f - 1) * pattern, where the "mouth" m_f in [0, 1]
    is random per frame and is what the audio features carry (m_f * a fixed vector); base is the
    reference latent."""

    def __init__(self, seed: int = 0):
        self.g = torch.Generator().manual_seed(seed)
        self.base = torch.randn(C, H, W, generator=self.g)
        self.pattern = torch.randn(C, H, W, generator=self.g)
        self.direction = torch.randn(F, generator=self.g)

    def batch(self, B: int):
        mouth = torch.rand(B, T, generator=self.g)
        x0 = self.base + (2 * mouth - 1)[:, None, :, None, None] * self.pattern[None, :, None]
        audio = mouth[..., None] * self.direction
        label = torch.zeros(B, T, 4)
        label[..., 1] = 1.0  # speaking
        label[..., 3] = mouth
        return mouth, x0, audio, label

    def mouth_of(self, x: torch.Tensor) -> torch.Tensor:
        """Project latents ``[B, C, T, h, w]`` back onto the mouth axis → ``[B, T]`` in units of 2m - 1."""
        d = x - self.base[None, :, None]
        return (d * self.pattern[None, :, None]).sum((1, 3, 4)) / self.pattern.pow(2).sum()


def test_a_tiny_dit_overfits_a_conditioned_sequence_and_its_one_step_sample_follows_the_mouth():
    torch.manual_seed(0)
    model = AvatarDiT(latent_channels=C, sample_size=H, width=32, depth=2, heads=2, audio_dim=F, audio_past_frames=1,
                      temporal_kernel=2, freq_dim=64, ffn_ratio=2.0)
    data = MouthData()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.0)
    losses = []
    for _ in range(100):
        mouth, x0, audio, label = data.batch(8)
        t = sample_timesteps((8, T), generator=data.g)
        loss = flow_matching_loss(model, x0, dict(audio=audio, state_label=label, ref=data.base, clean=x0), t=t,
                                  generator=data.g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = sum(losses[:15]) / 15, sum(losses[-15:]) / 15
    assert last < 0.25 * first, (first, last)

    model.eval()
    mouth, _, audio, label = data.batch(8)  # unseen mouth sequences
    with torch.inference_mode():
        x = generate(model, data.base, audio, label, steps=1, generator=torch.Generator().manual_seed(1))
    corr = torch.corrcoef(torch.stack([data.mouth_of(x).flatten(), (2 * mouth - 1).flatten()]))[0, 1]
    assert corr > 0.8, corr


def test_distill_loss_trains_a_dit_student_from_a_dit_teacher_with_per_block_times():
    torch.manual_seed(0)
    cfg = dict(latent_channels=C, sample_size=H, width=32, depth=1, heads=2, audio_dim=F, audio_past_frames=1,
               freq_dim=32, ffn_ratio=2.0, frames_per_block=2)
    teacher, student = AvatarDiT(**cfg).eval(), AvatarDiT(**cfg)
    torch.nn.init.normal_(teacher.final_proj.weight, std=0.1)  # a teacher that predicts something
    student.load_state_dict(teacher.state_dict())
    torch.nn.init.normal_(student.final_proj.weight, std=0.1)  # and a student that is not yet consistent
    data = MouthData()
    _, x0, audio, label = data.batch(2)
    cond = dict(audio=audio, state_label=label, ref=data.base, clean=x0)
    loss = distill_loss(student, teacher, x0, cond, time_shape=(2, T // 2), time_repeat=2, generator=data.g)
    loss.backward()
    assert torch.isfinite(loss)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())
    assert all(p.grad is None for p in teacher.parameters())
