"""The video avatar's mouth generator phase.

:func:`train_generator` is the training loop, with its checkpoint and exact resume. :func:`estimate_generator`
measures its step on this machine, for the time said up front.

The checkpoint is ``OUT/train/generator_state.pt``. It holds the settings, the SHA-256 of the training pictures,
the step and the history. It holds every state the loop carries: weights, optimizers, the sampler's RNG and the
critic's guard. So a continued run ends where an uninterrupted one does. ``cfg`` is a
:class:`~.train.VideoTrainConfig`.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from framegraph.stream.files import written_whole
from framegraph.stream.progress import finish_step_on_interrupt

from ...training import Pace, cpu_threads, duration, lr_at
from .critic import CriticGuard, TextureCritic, adversarial_loss, critic_loss, lips_box
from .lipsync import SHAPE_NAMES, MouthGenerator, region_loss

GENERATOR_STATE = "generator_state.pt"  # in OUT/train: the generator phase's checkpoint
CHECKPOINT_S = 300.0  # seconds between the generator's checkpoints (and one at Ctrl-C and at the end)


def _generator_settings(cfg, regions: torch.Tensor, shapes: torch.Tensor) -> dict:
    """What a generator checkpoint must match to be continued.

    That is the settings, all but the steps. It is the training pictures and shapes, by their SHA-256. So
    another video in the same folder starts afresh."""
    keys = ("batch", "lr", "warmup", "channels", "edge_weight", "mouth_weight", "critic_weight", "critic_start",
            "critic_lr", "seed")
    digest = hashlib.sha256(regions.numpy().tobytes())
    digest.update(shapes.numpy().tobytes())
    return {**{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items() if k in keys},
            "frames": len(regions), "size": int(regions.shape[1]), "frames_sha256": digest.hexdigest()}


def _load_generator_state(path: Path | None, settings: dict, resume: bool, log) -> dict | None:
    """The checkpoint at ``path``, when resuming and made with the same ``settings``. Else None, and it says so."""
    if path is None or not resume or not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("settings") != settings:
        if log:
            differ = sorted(k for k in settings if state.get("settings", {}).get(k) != settings[k])
            log(f"the generator checkpoint {path} was made with other settings ({', '.join(differ)}): "
                f"training the generator from step 0")
        return None
    return state


def train_generator(regions: torch.Tensor, shapes: torch.Tensor, mask: torch.Tensor, reference: torch.Tensor,
                    cfg, lips: torch.Tensor | None = None, log=None, *,
                    checkpoint: Path | None = None, resume: bool = True, checkpoint_s: float = CHECKPOINT_S,
                    pace: Pace | None = None) -> tuple[MouthGenerator, list[dict], dict]:
    """The :class:`MouthGenerator` trained on ``regions uint8 [T, S, S, 3]``.

    The regions come with their standardised ``shapes [T, P]``, the hidden ``mask [S, S]`` and the ``reference
    uint8 [S, S, 3]``. The loss weighs the hidden lower face ``1 + mouth_weight``. It weighs the ``lips [S, S]``
    area, where the mouth moves, twice that again. A :class:`~.critic.TextureCritic` may join on the lips' box.
    There the L1 loss alone draws an average: a blur. It needs ``lips``, ``critic_weight`` > 0 and more than
    ``critic_start`` steps. From step ``critic_start`` it adds ``critic_weight`` · its loss. The critic trains
    from 100 steps before. A :class:`~.critic.CriticGuard` watches it.

    ``checkpoint``: the file that keeps the phase's state. That is weights, optimizers, sampler RNG, guard, step
    and history. It is written every ``checkpoint_s`` seconds, at Ctrl-C and at the end. At Ctrl-C
    ``KeyboardInterrupt`` is then raised. With ``resume`` a checkpoint of the same settings is continued from
    its step. The result is the uninterrupted run's. ``pace`` times the steps, for the ETA in the log lines.

    Returns the model in eval mode and the history. The history has, every 50 steps, the total loss, the L1 part
    and its running mean. It also returns the critic's report. That has its settings, the lips' box, and the
    step the guard dropped it at, or None."""
    gen = torch.Generator().manual_seed(cfg.seed)
    use_critic = lips is not None and cfg.critic_weight > 0 and cfg.steps > cfg.critic_start
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = MouthGenerator(channels=tuple(cfg.channels), shape_dim=shapes.shape[1], sample_size=regions.shape[1])
        critic = TextureCritic() if use_critic else None
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=1e-4)
    m = mask[None, None]
    ref = reference.permute(2, 0, 1)[None].float() / 255.0
    weight = 1.0 + cfg.mouth_weight * m
    if lips is not None:
        weight = weight + 2 * cfg.mouth_weight * lips[None, None]
    guard = CriticGuard()
    report = {"weight": cfg.critic_weight if use_critic else 0.0, "start": cfg.critic_start, "dropped_at": None}
    opt_critic = None
    if use_critic:
        opt_critic = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr, betas=(0.5, 0.999))
        rows, cols = lips_box(lips)
        report["box_px"] = [rows.start, rows.stop, cols.start, cols.stop]
        critic_m = m[..., rows, cols].expand(cfg.batch, -1, -1, -1)
    history, start = [], 0
    settings = _generator_settings(cfg, regions, shapes)
    state = _load_generator_state(checkpoint, settings, resume, log)
    if state is not None:
        start, history = min(state["step"], cfg.steps), state["history"]
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["rng"])
        guard.mean, guard.best, guard.dropped_at, guard._saved = state["guard"]
        if use_critic and state["critic"] is not None:
            critic.load_state_dict(state["critic"])
            opt_critic.load_state_dict(state["critic_optimizer"])
        if log:
            log(f"generator: continuing at step {start}/{cfg.steps} from the checkpoint {checkpoint}" if start <
                cfg.steps else f"generator: all {cfg.steps} steps were trained by an earlier run ({checkpoint})")

    def save(done: int) -> None:
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        with written_whole(checkpoint) as tmp:
            torch.save({"settings": settings, "step": done, "history": history, "model": model.state_dict(),
                        "optimizer": opt.state_dict(), "rng": gen.get_state(),
                        "guard": (guard.mean, guard.best, guard.dropped_at, guard._saved),
                        "critic": critic.state_dict() if use_critic else None,
                        "critic_optimizer": opt_critic.state_dict() if use_critic else None}, tmp)

    pace = pace or Pace()
    model.train()
    with finish_step_on_interrupt() as ctrl_c:
        pace.start()
        saved_at = time.monotonic()
        for step in range(start, cfg.steps):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
            idx = torch.randint(0, len(regions), (cfg.batch,), generator=gen)
            x = regions[idx].permute(0, 3, 1, 2).float() / 255.0
            B = len(idx)
            pred = model(x * (1 - m), m.expand(B, -1, -1, -1), ref.expand(B, -1, -1, -1), shapes[idx])
            l1 = region_loss(pred, x, weight.expand(B, -1, -1, -1), cfg.edge_weight)
            critic_trains = use_critic and guard.dropped_at is None and step >= cfg.critic_start - 100
            critic_on = critic_trains and step >= cfg.critic_start
            loss = l1
            if critic_trains:
                fake = (pred * m + x * (1 - m))[..., rows, cols]  # the lips as pasted: generated where hidden
            if critic_on:
                loss = l1 + cfg.critic_weight * adversarial_loss(critic, fake, critic_m[:B])
            if guard.update(step, l1.item(), critic_on, model, opt):  # before this step changes the weights
                if log:  # this step's losses came from the weights just replaced: no update
                    log(f"generator step {step}: the L1 loss rose to {guard.mean:.4f} (best {guard.best:.4f}) "
                        "with the texture critic; back to the last healthy weights, finishing without it")
            else:
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if critic_trains:
                    for g in opt_critic.param_groups:
                        g["lr"] = lr_at(step, cfg.steps, cfg.critic_lr, 0)
                    opt_critic.zero_grad(set_to_none=True)
                    critic_loss(critic, x[..., rows, cols], fake, critic_m[:B]).backward()
                    opt_critic.step()
                if step % 50 == 0 or step == cfg.steps - 1:
                    history.append({"step": step, "loss": round(loss.item(), 5), "l1": round(l1.item(), 5),
                                    "l1_mean": round(guard.mean, 5)})
                    if log:
                        left = pace.left(step + 1, cfg.steps)
                        log(f"generator step {step}/{cfg.steps} loss {loss.item():.4f} (L1 {l1.item():.4f})"
                            + (f", {left}" if left else ""))
            pace.tick()
            if checkpoint is not None and (ctrl_c.is_set() or time.monotonic() - saved_at >= checkpoint_s):
                save(step + 1)
                saved_at = time.monotonic()
            if ctrl_c.is_set():
                if log:
                    log(f"interrupted at generator step {step + 1}/{cfg.steps}" + (
                        f"; the checkpoint {checkpoint} keeps it: run the same command again to continue from "
                        f"there" if checkpoint is not None else ""))
                raise KeyboardInterrupt
    if checkpoint is not None and start < cfg.steps:
        save(cfg.steps)
    report["dropped_at"] = guard.dropped_at
    return model.eval(), history, report


def estimate_generator(cfg, size: int, trial_steps: int = 3) -> float:
    """Seconds per generator step at ``size``² with ``cfg``'s batch and channels, measured now.

    It times ``trial_steps`` steps after a warm-up one. They run on random pictures, without the texture critic."""
    gen = torch.Generator().manual_seed(cfg.seed)
    regions = torch.randint(0, 256, (2 * cfg.batch, size, size, 3), generator=gen, dtype=torch.uint8)
    mask = torch.zeros(size, size)
    mask[size // 2:] = 1
    pace = Pace()
    train_generator(regions, torch.randn(len(regions), len(SHAPE_NAMES), generator=gen), mask, regions[0],
                    replace(cfg, steps=trial_steps + 1, critic_weight=0.0), pace=pace)
    return float(pace.step_s)


def say_estimate(cfg, torch_threads: int | None, checkpoint: Path, log, resume: bool = True) -> None:
    """The time the generator will take, said up front.

    Its step is measured now, by :func:`estimate_generator`. When resuming from a checkpoint that has all the
    steps, that is said instead, and nothing is measured."""
    if resume and checkpoint.is_file():
        done = torch.load(checkpoint, map_location="cpu", weights_only=False).get("step", 0)
        if done >= cfg.steps:
            log(f"the generator's checkpoint {checkpoint} has all {cfg.steps} steps: if it was made with these "
                f"settings (checked once the video's frames are read) the generator is trained already")
            return
    with cpu_threads(torch_threads):
        step_s = estimate_generator(cfg, cfg.max_region)
        threads = torch.get_num_threads()
    log(f"the generator's {cfg.steps} steps will take about {duration(step_s * cfg.steps)} here: {step_s:.3g} s a "
        f"step, measured just now on 3 trial steps at {cfg.max_region}² with {threads} CPU thread"
        f"{'s' if threads != 1 else ''} (the texture "
        f"critic from step {cfg.critic_start} adds to it; the ETA below follows the measured pace). Before it: "
        f"the video's clips, landmarks and matte; after it: the sound and the openness calibration; each shows "
        f"its own progress. A checkpoint is kept in {checkpoint} every {CHECKPOINT_S / 60:.0f} min and at "
        f"Ctrl-C: the same command again continues from it")




__all__ = ["GENERATOR_STATE", "CHECKPOINT_S", "train_generator", "estimate_generator", "say_estimate"]
