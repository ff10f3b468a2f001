"""Train an avatar bundle from talking clips: ``train_avatar(clips_dir, out_dir, ...)``.

Each phase runs as one named function, such as ``_vae_phase``. The DiT phases are one method over a shared
checkpoint, ``_DiTTraining.train``. On ``resume`` every phase follows the one rule of
:func:`framegraph.models.training.resume_or_train`. A phase an earlier run finished with at least the steps
asked for is loaded. Any other is trained. It continues from its own checkpoint where it keeps one::

    vae      VideoVAE on the face region (``models.vae.train_vae``: its own checkpoint / resume); with
             ``vae_reference`` its decoder also reads the portrait's face region (sharp identity), with
             ``vae_warp`` it may also copy the portrait's pixels moved with the head; with ``vae_redraw``
             synthetic clips are learnt as redrawn without the video codec (``models.synth.truth``)
    audio    the audio encoder learns to predict the clips' ground-truth mouth parameters
             (``models.audio.train``), when the clips have them; else it comes from ``audio_from`` (a
             trained encoder or avatar folder) or stays the seeded untrained one
    data     every clip encoded once: latents, offline AudioFeatures, VAD state labels (a .pt cache
             keyed by the models and the clip files, so it has no steps and is reused while they match)
    flow     AvatarDiT flow matching, teacher forcing (noisy block b sees the clean blocks < b)
    distill  few-step consistency distillation: student from the teacher, target = EMA of the student
    rollout  against drift: the context is the model's own rollout (generated block by block with the
             streaming state), the target still the data — the model learns to return to the data

Output: ``out_dir`` is an avatar bundle, for ``load_avatar(out_dir)``, with ``train_report.json``.
``out_dir/train/`` holds the VAE run, the trained audio encoder and the data cache. It holds the DiT
checkpoint: ``dit/`` + ``trainer_state.pt``. That is written every ``checkpoint_every`` steps and at the end of
each phase. It holds ``teacher/``, the many-step flow model before distillation. ``avatar eval --dit``
compares the two.

The DiT phases weight their loss. The weight is ``mouth_weight`` on the latent pixels under the mouth, and 1 elsewhere.
The mouth is the rest box grown down by the largest jaw drop. The avatar is judged on the mouth.
"""
from __future__ import annotations

import copy
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import torch

from framegraph import assets
from framegraph.models.audio import AudioEncoder, default_encoder
from framegraph.models.audio.train import (
    clip_tensors,
    load_clip_targets,
    train_audio_encoder,
)
from framegraph.models.composite import load_background
from framegraph.models.dit import AvatarDiT, generate
from framegraph.models.matte import person_matte
from framegraph.models.sampler import distill_loss, flow_matching_loss
from framegraph.models.synth import clips_portrait
from framegraph.models.vae import VideoVAE, box_to_region, train_vae
from framegraph.stream.files import write_json, written_whole
from framegraph.stream.media import read_video

from ...dit.model import DiTPreset
from ...training import (
    REPORT,
    cpu_threads,
    lr_at,
    recorded_steps,
    resume_or_train,
    timed,
)
from .bundle import SMALL_VAE, TINY_VAE, PortraitAvatar, save_avatar
from .data import ClipData, clip_audio, prepare_clips, sample_windows

PHASES = ("vae", "audio", "data", "flow", "distill", "rollout")
DIT_PHASES = ("flow", "distill", "rollout")
VAEPreset = Literal["tiny", "small"]
VAE_PRESETS: dict[VAEPreset, dict] = {"tiny": TINY_VAE, "small": SMALL_VAE}


@dataclass
class TrainConfig:
    """Settings of :func:`train_avatar`. All are stored in the report."""

    region_size: int = 64
    vae_preset: VAEPreset = "tiny"
    vae_steps: int = 300
    vae_batch: int = 4
    vae_lr: float = 2e-3
    preset: DiTPreset = "tiny"
    dit_overrides: dict = field(default_factory=dict)
    frames_per_block: int = 1
    flow_steps: int = 600
    distill_steps: int = 150
    rollout_steps: int = 150
    batch: int = 8
    window: int = 8
    lr: float = 5e-4
    warmup: int = 30
    shift: float = 1.0
    mouth_weight: float = 3.0
    sample_steps: int = 2
    distill_intervals: int = 16
    ema: float = 0.95
    audio_steps: int = 400
    audio_from: str | None = None
    vae_reference: bool = True
    vae_warp: bool = True
    vae_redraw: bool = True
    vad: bool = True
    fps: float = 25.0
    checkpoint_every: int = 100
    max_clips: int | None = None
    seed: int = 0


@dataclass
class AvatarTrainResult:
    avatar: PortraitAvatar
    report: dict
    history: list[dict]


def mouth_latent_weight(mouth_box, crop_box, region_size: int, latent_hw: tuple[int, int], weight: float,
                        max_jaw_drop: float = 0.32) -> torch.Tensor | None:
    """``float32 [1, 1, 1, h, w]``: ``weight`` on latent pixels overlapping the mouth, 1 elsewhere.

    The mouth is the rest box grown down by the largest jaw drop. Returns None without a mouth box, or for
    weight 1."""
    if mouth_box is None or weight == 1.0:
        return None

    x, y, w, h = (float(v) for v in mouth_box)
    x, y, w, h = box_to_region((x - 2, y - 2, w + 4, h + 4 + max_jaw_drop * w), crop_box, region_size)
    lh, lw = latent_hw
    f = region_size / lh
    m = torch.ones(lh, lw)
    for i in range(lh):
        for j in range(lw):
            if (j + 1) * f > x and j * f < x + w and (i + 1) * f > y and i * f < y + h:
                m[i, j] = weight
    return m[None, None, None]


def _first_portrait_json(clips_dir: Path) -> dict | None:
    """The ``portrait`` block of the first clip's JSON. None when absent."""
    first = sorted(Path(clips_dir).glob("clip_*.json"))
    return json.loads(first[0].read_text()).get("portrait") if first else None


def _portrait_image(portrait_json: dict | None, clips_dir: Path, portrait=None) -> torch.Tensor:
    """The background frame.

    It is ``portrait``, a path or array, if given. Else it is the image synthetic clips were drawn on
    (:func:`framegraph.models.synth.clips_portrait`). Else it is the per-pixel median of the first clip's
    frames."""
    import numpy as np


    if portrait is not None:
        return load_background(portrait)
    drawn_on = clips_portrait(portrait_json, clips_dir)
    if drawn_on is not None:
        return torch.from_numpy(np.array(drawn_on, copy=True))

    videos = sorted(Path(clips_dir).glob("clip_*.mp4"))
    if not videos:
        raise FileNotFoundError(f"no clip_*.mp4 in {os.fspath(clips_dir)!r} to take the portrait from")
    frames = read_video(videos[0])["frames"][:100]
    return torch.from_numpy(np.median(frames, axis=0).round().astype(np.uint8))


def _report_of(folder: Path) -> dict:
    return json.loads((folder / REPORT).read_text())


# ---- the phases ---------------------------------------------------------------------------------------
def _vae_phase(cfg: TrainConfig, clips_dir: Path, work: Path, background: torch.Tensor, *, device: str,
               resume: bool, progress: bool) -> tuple[object, dict]:
    """(1) The VideoVAE of the face region (``work/vae``) on ``device``, frozen, and its training report."""

    folder = work / "vae"

    def load():
        return VideoVAE.from_pretrained(folder, low_cpu_mem_usage=False), _report_of(folder)

    def train():
        model_config = {**VAE_PRESETS[cfg.vae_preset], "reference_skip": bool(cfg.vae_reference),
                        "reference_warp": bool(cfg.vae_reference and cfg.vae_warp)}
        res = train_vae(clips_dir, folder, steps=cfg.vae_steps, batch=cfg.vae_batch, lr=cfg.vae_lr, device=device,
                        seed=cfg.seed, progress=progress, size=cfg.region_size, model_config=model_config,
                        resume=resume, max_clips=cfg.max_clips,
                        reference_image=background if cfg.vae_reference else None,
                        redraw_targets=None if cfg.vae_redraw else False,
                        eval_every=max(50, cfg.vae_steps // 4), checkpoint_every=cfg.checkpoint_every,
                        warmup=min(20, max(1, cfg.vae_steps // 10)))
        return res.model, res.report

    vae, report = resume_or_train(cfg.vae_steps, recorded_steps(folder, resume), load, train)
    return vae.to(device).eval().requires_grad_(False), report


def _audio_phase(cfg: TrainConfig, clips_dir: Path, work: Path, *, resume: bool,
                 progress: bool) -> tuple[object, dict]:
    """(2) The audio encoder for this avatar, and a report of where it came from. See the module docstring."""

    if cfg.audio_from:
        src = Path(cfg.audio_from)
        folder = src / "audio" if (src / "audio" / "config.json").is_file() else src
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"audio_from={cfg.audio_from!r}: no audio encoder there (expected an avatar "
                                    f"folder with audio/ or an encoder folder with config.json)")
        return AudioEncoder.from_pretrained(folder, low_cpu_mem_usage=False).eval(), {"source": str(folder)}
    if cfg.audio_steps <= 0:
        return default_encoder(cfg.seed), {"source": "untrained (seeded)", "seed": cfg.seed}
    folder = work / "audio"

    def load():
        return AudioEncoder.from_pretrained(folder, low_cpu_mem_usage=False).eval(), \
            {"source": "trained", **_report_of(folder)}

    return resume_or_train(cfg.audio_steps, recorded_steps(folder, resume), load,
                           lambda: _train_audio_encoder(cfg, clips_dir, folder, progress))


def _train_audio_encoder(cfg: TrainConfig, clips_dir: Path, folder: Path, progress: bool) -> tuple[object, dict]:
    """The seeded encoder trained on the clips' ground-truth mouth parameters, written to ``folder``.

    Some clips lack them, like a person's own video. They take the encoder the shipped avatar learnt on speech."""


    encoder = default_encoder(cfg.seed)
    clips = []
    for video in sorted(clips_dir.glob("clip_*.mp4"))[:cfg.max_clips]:
        targets = load_clip_targets(json.loads(video.with_suffix(".json").read_text()))
        if targets is None:
            shipped = assets.ROOT / "avatars" / "astronaut" / "audio"
            if (shipped / "config.json").is_file():
                return AudioEncoder.from_pretrained(shipped, low_cpu_mem_usage=False).eval(), \
                    {"source": f"{shipped} (the clips have no ground-truth mouth parameters)"}
            return encoder, {"source": "untrained (seeded): the clips have no ground-truth mouth parameters",
                             "seed": cfg.seed}
        clips.append(clip_tensors(encoder, clip_audio(video), cfg.fps, targets, video.stem))
    report = train_audio_encoder(clips, folder, model=encoder, steps=cfg.audio_steps, seed=cfg.seed,
                                 holdout=1 if len(clips) > 2 else 0, progress=progress)
    return encoder.eval(), {"source": "trained", **report}


def _data_phase(cfg: TrainConfig, clips_dir: Path, work: Path, vae, audio_encoder, *, device: str,
                progress: bool) -> tuple[list[ClipData], tuple[int, int, int, int], dict | None]:
    """(3) Every clip encoded once, with the crop box and the clips' portrait block.

    The latents, audio features and labels are on ``device``. They are cached in ``work/data.pt`` while the
    models and the clips stay the same. The cache is keyed by what it was computed from. So it is reused
    whatever ``resume`` says."""
    clips, crop_box, portrait_json = prepare_clips(clips_dir, vae, audio_encoder, region_size=cfg.region_size,
                                                   fps=cfg.fps, vad=cfg.vad, max_clips=cfg.max_clips,
                                                   cache_path=work / "data.pt", progress=progress)
    clips = [ClipData(c.name, c.latents.to(device), c.audio.to(device), c.labels.to(device), c.jaw) for c in clips]
    return clips, crop_box, portrait_json


def _frozen_copy(model):
    return copy.deepcopy(model).eval().requires_grad_(False)


class _DiTTraining:
    """(4)-(6) The DiT phases, flow, distill and rollout, over one checkpoint.

    The checkpoint is ``work/dit/`` + ``work/trainer_state.pt``. The state holds phase, step, optimizer,
    teacher, EMA, sampler RNG and history. It holds the steps each finished phase ran. It is saved every
    ``checkpoint_every`` steps and at the end of each phase."""

    def __init__(self, cfg: TrainConfig, work: Path, dit_config: dict, clips: list[ClipData], ref: torch.Tensor,
                 weight: torch.Tensor | None, *, device: str, resume: bool):

        self.cfg, self.work, self.clips, self.ref, self.weight, self.device = cfg, work, clips, ref, weight, device
        self.state_path = work / "trainer_state.pt"
        state = torch.load(self.state_path, map_location="cpu", weights_only=False) \
            if resume and self.state_path.is_file() else None
        if state is not None:
            model = AvatarDiT.from_pretrained(work / "dit", low_cpu_mem_usage=False)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed)
                model = AvatarDiT.from_preset(cfg.preset, **dit_config)
            state = {"phase": "flow", "step": 0, "history": [], "done": [], "ema": None, "teacher": None,
                     "optimizer": None, "rng": None}
        self.state = state
        self.model = model.to(device).train()
        self.gen = torch.Generator().manual_seed(cfg.seed + 7)
        if state.get("rng") is not None:
            self.gen.set_state(state["rng"])
        self.history: list[dict] = state["history"]
        self.teacher = self.ema = None
        for name in ("teacher", "ema"):
            if state.get(name) is not None:
                frozen = AvatarDiT.from_config(model.config).to(device)
                frozen.load_state_dict(state[name])
                setattr(self, name, frozen.eval().requires_grad_(False))

    def recorded_steps(self, phase: str) -> int | None:
        """The steps ``phase`` ran when it finished. None: it has not finished."""
        return self.state.setdefault("steps_done", {}).get(phase) if phase in self.state["done"] else None

    def save(self, step: int, opt: torch.optim.Optimizer) -> None:
        self.state.update(step=step, history=self.history, rng=self.gen.get_state(), optimizer=opt.state_dict(),
                          teacher=None if self.teacher is None else self.teacher.state_dict(),
                          ema=None if self.ema is None else self.ema.state_dict())
        self.model.save_pretrained(self.work / "dit")
        with written_whole(self.state_path) as tmp:
            torch.save(self.state, tmp)

    def train(self, phase: str, steps: int, progress: bool) -> None:
        """Run ``phase`` up to ``steps`` steps, from where the checkpoint left it."""
        from tqdm import tqdm

        cfg, state, model = self.cfg, self.state, self.model
        done_steps = state.setdefault("steps_done", {})
        if phase == "distill" and steps > 0 and self.teacher is None:
            self.teacher, self.ema = _frozen_copy(model), _frozen_copy(model)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        step = state["step"] if state["phase"] == phase else done_steps.get(phase, 0)
        if state["phase"] == phase and state.get("optimizer") is not None:
            opt.load_state_dict(state["optimizer"])
        state["phase"] = phase
        peak = cfg.lr if phase == "flow" else cfg.lr * 0.5
        with tqdm(total=steps, initial=step, desc=f"train dit ({phase})", disable=not progress,
                  dynamic_ncols=True) as bar:
            while step < steps:
                for g in opt.param_groups:
                    g["lr"] = lr_at(step, steps, peak, cfg.warmup)
                loss = self._loss(phase)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                if self.ema is not None:
                    with torch.no_grad():
                        for pe, pm in zip(self.ema.parameters(), model.parameters()):
                            pe.lerp_(pm, 1.0 - cfg.ema)
                step += 1
                self.history.append({"phase": phase, "step": step, "loss": round(float(loss.detach()), 5)})
                if step % cfg.checkpoint_every == 0 and step < steps:
                    self.save(step, opt)
                bar.update(1)
                bar.set_postfix(loss=f"{float(loss.detach()):.4f}")
        if phase not in state["done"]:
            state["done"].append(phase)
        done_steps[phase] = step
        self.save(step, opt)

    def _loss(self, phase: str) -> torch.Tensor:
        """One batch of windows of the clips, and the phase's loss on it.

        The flow phase uses flow matching. So does rollout before any distillation. Else the loss is
        consistency distillation from the teacher towards the EMA. Rollout feeds the model's own generation as
        the clean context."""

        cfg, model = self.cfg, self.model
        k, B = cfg.frames_per_block, cfg.batch
        x0, audio, labels = sample_windows(self.clips, B, cfg.window, self.gen)
        Tw = x0.shape[2] - x0.shape[2] % k
        x0, audio, labels = x0[:, :, :Tw], audio[:, :Tw], labels[:, :Tw]
        cond = dict(audio=audio, state_label=labels, ref=self.ref, clean=x0)
        if phase == "rollout":
            model.eval()
            with torch.no_grad():
                cond["clean"] = generate(model, self.ref, audio, labels, steps=cfg.sample_steps, shift=cfg.shift)
            model.train()
        noise = torch.randn(x0.shape, generator=self.gen).to(self.device)
        if phase == "flow" or (phase == "rollout" and self.teacher is None):
            return flow_matching_loss(model, x0, cond, time_shape=(B, Tw // k), time_repeat=k, shift=cfg.shift,
                                      noise=noise, weight=self.weight)
        return distill_loss(model, self.teacher, x0, cond, target=self.ema, intervals=cfg.distill_intervals,
                            shift=cfg.shift, time_shape=(B, Tw // k), time_repeat=k, noise=noise, generator=None)


def _check_config(cfg: TrainConfig) -> None:
    if cfg.window % cfg.frames_per_block:
        raise ValueError(f"train_avatar: window={cfg.window} must be a multiple of frames_per_block="
                         f"{cfg.frames_per_block}")
    if cfg.vae_preset not in VAE_PRESETS:
        raise ValueError(f"train_avatar: vae_preset={cfg.vae_preset!r}; expected one of {sorted(VAE_PRESETS)}")


# ---- the whole training -------------------------------------------------------------------------------
def train_avatar(clips_dir, out_dir, config: TrainConfig | None = None, *, device: str = "cpu",
                 resume: bool = True, progress: bool = True, portrait=None, torch_threads: int | None = None,
                 **overrides) -> AvatarTrainResult:
    """Train an avatar bundle from a folder of clips; see the module docstring.

    Args:
        clips_dir: ``clip_*.mp4`` + ``clip_*.json``, as ``framegraph avatar synth`` writes.
        out_dir: the bundle folder to write. ``train/`` inside it holds checkpoints and caches.
        config: :class:`TrainConfig`. Keyword ``overrides`` replace its fields, e.g. ``flow_steps=50``.
        device: ``"cpu"`` / ``"cuda"``.
        resume: continue from ``out_dir/train`` when present. A phase an earlier run finished with at
            least the steps asked for is loaded. The others are trained
            (:func:`framegraph.models.training.resume_or_train`).
        portrait: background image for the bundle. Default: see :func:`_portrait_image`.
        torch_threads: intra-op threads while training, restored after.
    """
    cfg = TrainConfig(**{**asdict(config or TrainConfig()), **overrides})
    _check_config(cfg)
    with cpu_threads(torch_threads):
        t0 = time.monotonic()
        clips_dir, out = Path(clips_dir), Path(out_dir)
        work = out / "train"
        timings: dict[str, float] = {}
        # the background frame of the bundle, which is also the VAE's identity reference
        background = _portrait_image(_first_portrait_json(clips_dir), clips_dir, portrait)
        work.mkdir(parents=True, exist_ok=True)  # only once the clips folder is known to be good
        run = dict(resume=resume, progress=progress)
        with timed(timings, "vae"):
            vae, vae_report = _vae_phase(cfg, clips_dir, work, background, device=device, **run)
        with timed(timings, "audio"):
            audio_encoder, audio_report = _audio_phase(cfg, clips_dir, work, **run)
        with timed(timings, "data"):
            clips, crop_box, portrait_json = _data_phase(cfg, clips_dir, work, vae, audio_encoder, device=device,
                                                         progress=progress)
        mouth_box = tuple(portrait_json["mouth_box"]) if portrait_json and portrait_json.get("mouth_box") else None
        avatar = PortraitAvatar(vae=vae.cpu(), dit=None, audio=audio_encoder, portrait=background, crop_box=crop_box,
                        region_size=cfg.region_size, mouth_box=mouth_box, fps=cfg.fps,
                        chunk_frames=cfg.frames_per_block, steps=cfg.sample_steps, shift=cfg.shift, vad=cfg.vad,
                        matte=person_matte(background))
        ref = avatar.reference_latent().to(device)
        vae.to(device)
        C, lh, lw = ref.shape
        weight = mouth_latent_weight(mouth_box, crop_box, cfg.region_size, (lh, lw), cfg.mouth_weight)
        dit_config = {"latent_channels": C, "sample_size": [lh, lw], "frames_per_block": cfg.frames_per_block,
                      "audio_dim": audio_encoder.feature_dim, **cfg.dit_overrides}
        dit = _DiTTraining(cfg, work, dit_config, clips, ref, None if weight is None else weight.to(device),
                           device=device, resume=resume)
        for phase, steps in zip(DIT_PHASES, (cfg.flow_steps, cfg.distill_steps, cfg.rollout_steps)):
            with timed(timings, phase):  # a finished phase: its weights are already the checkpoint's
                resume_or_train(steps, dit.recorded_steps(phase), lambda: None,
                                lambda: dit.train(phase, steps, progress))

        model = dit.model.eval().requires_grad_(False)
        if dit.teacher is not None:  # the many-step flow model the student was distilled from (for eval)
            dit.teacher.cpu().save_pretrained(work / "teacher")
        avatar.dit = model.cpu()
        avatar.vae = vae.cpu()
        if cfg.distill_steps == 0 and cfg.sample_steps < 4:
            avatar.steps = 4  # an undistilled model needs more steps
        report = _report(cfg, clips_dir, clips, crop_box, dit.history, vae, vae_report, audio_report, model,
                         timings={**timings, "total_s": round(time.monotonic() - t0, 1)}, device=device)
        avatar.meta = {"training": {k: report[k] for k in ("clips", "frames", "losses", "timings")}}
        save_avatar(out, avatar)
        write_json(out / REPORT, report)
        return AvatarTrainResult(avatar, report, dit.history)


def _report(cfg: TrainConfig, clips_dir: Path, clips: list[ClipData], crop_box, history: list[dict], vae,
            vae_report: dict, audio_report: dict, model, *, timings: dict, device: str) -> dict:
    """``train_report.json``: the settings, the data, the first and last losses of each DiT phase.

    Those losses are means of 10 steps. It also holds the VAE's and the audio encoder's reports, sizes,
    timings and the machine."""
    losses = {p: [h["loss"] for h in history if h["phase"] == p] for p in DIT_PHASES}
    summary = {p: {"first": round(sum(v[:10]) / len(v[:10]), 5), "last": round(sum(v[-10:]) / len(v[-10:]), 5)}
               for p, v in losses.items() if v}
    return {"config": asdict(cfg), "clips_dir": os.fspath(clips_dir), "clips": len(clips),
            "frames": sum(c.frames for c in clips), "crop_box": list(crop_box), "losses": summary,
            "vae": {"heldout_final": vae_report.get("heldout_final"), "steps": vae_report.get("steps"),
                    "reference_skip": bool(vae.uses_reference),
                    "reference_warp": bool(vae.config.reference_warp), "targets": vae_report.get("targets")},
            "audio_encoder": audio_report,
            "dit_parameters": sum(p.numel() for p in model.parameters()),
            "vae_parameters": sum(p.numel() for p in vae.parameters()),
            "timings": timings, "device": str(device),
            "torch": torch.__version__, "machine": platform.machine(), "threads": torch.get_num_threads()}


__all__ = ["PHASES", "TrainConfig", "AvatarTrainResult", "train_avatar", "mouth_latent_weight"]
