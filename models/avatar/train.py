"""Train an avatar bundle from talking clips: ``train_avatar(clips_dir, out_dir, ...)``.

Phases (each resumable; a finished phase is skipped on ``resume``)::

    vae      VideoVAE on the face region (``models.vae.train_vae``: its own checkpoint / resume); with
             ``vae_reference`` its decoder also reads the portrait's face region (sharp identity), with
             ``vae_warp`` it may also copy the portrait's pixels moved with the head; with ``vae_redraw``
             synthetic clips are learnt as redrawn without the video codec (``models.synth.truth``)
    audio    the audio encoder learns to predict the clips' ground-truth mouth parameters
             (``models.audio.train``), when the clips have them; else it comes from ``audio_from`` (a
             trained encoder or avatar folder) or stays the seeded untrained one
    data     every clip encoded once: latents, offline AudioFeatures, VAD state labels (cached .pt)
    flow     AvatarDiT flow matching, teacher forcing (noisy block b sees the clean blocks < b)
    distill  few-step consistency distillation: student from the teacher, target = EMA of the student
    rollout  against drift: the context is the model's own rollout (generated block by block with the
             streaming state), the target still the data — the model learns to return to the data

Output: ``out_dir`` is an avatar bundle (``load_avatar(out_dir)``) with ``train_report.json``;
``out_dir/train/`` holds the VAE run, the trained audio encoder, the data cache, the DiT checkpoint
(``dit/`` + ``trainer_state.pt``, every ``checkpoint_every`` steps and at the end of each phase) and
``teacher/``: the many-step flow model before distillation (``avatar eval --dit`` compares the two).

Loss of the DiT phases is weighted ``mouth_weight`` on the latent pixels under the mouth (rest box grown
down by the largest jaw drop), 1 elsewhere: the mouth is what the avatar is judged on.
"""
from __future__ import annotations

import copy
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .bundle import SMALL_VAE, TINY_VAE, Avatar, save_avatar
from .data import ClipData, prepare_clips, sample_windows

PHASES = ("vae", "audio", "data", "flow", "distill", "rollout")
VAE_PRESETS = {"tiny": TINY_VAE, "small": SMALL_VAE}


@dataclass
class TrainConfig:
    """Settings of :func:`train_avatar` (all stored in the report)."""

    region_size: int = 64
    vae_preset: str = "tiny"
    vae_steps: int = 300
    vae_batch: int = 4
    vae_lr: float = 2e-3
    preset: str = "tiny"
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
    avatar: Avatar
    report: dict
    history: list[dict]


def _lr(step: int, steps: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def mouth_latent_weight(mouth_box, crop_box, region_size: int, latent_hw: tuple[int, int], weight: float,
                        max_jaw_drop: float = 0.32) -> torch.Tensor | None:
    """``float32 [1, 1, 1, h, w]``: ``weight`` on latent pixels overlapping the mouth (the rest box grown
    down by the largest jaw drop), 1 elsewhere; None without a mouth box or for weight 1."""
    if mouth_box is None or weight == 1.0:
        return None
    from framegraph.models.vae import box_to_region

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


class _Checkpoint:
    """``train/dit/`` + ``train/trainer_state.pt``: phase, step, optimizer, EMA, RNG, history."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.state_path = folder / "trainer_state.pt"

    def load(self):
        if not self.state_path.is_file():
            return None
        return torch.load(self.state_path, map_location="cpu", weights_only=False)

    def save(self, model, state: dict) -> None:
        model.save_pretrained(self.folder / "dit")
        tmp = self.folder / "trainer_state.pt.partial"
        torch.save(state, tmp)
        os.replace(tmp, self.state_path)


def _first_portrait_json(clips_dir: Path) -> dict | None:
    """The ``portrait`` block of the first clip's JSON (None when absent)."""
    first = sorted(Path(clips_dir).glob("clip_*.json"))
    return json.loads(first[0].read_text()).get("portrait") if first else None


def _portrait_image(portrait_json: dict | None, clips_dir: Path, portrait=None) -> torch.Tensor:
    """The background frame: ``portrait`` (path / array) if given; the image synthetic clips were drawn on
    (:func:`framegraph.models.synth.clips_portrait`); else the per-pixel median of the first clip's frames."""
    import numpy as np

    from framegraph.models.synth import clips_portrait

    if portrait is not None:
        from framegraph.models.composite import load_background

        return load_background(portrait)
    drawn_on = clips_portrait(portrait_json, clips_dir)
    if drawn_on is not None:
        return torch.from_numpy(np.array(drawn_on, copy=True))
    from framegraph.stream.media import read_video

    videos = sorted(Path(clips_dir).glob("clip_*.mp4"))
    if not videos:
        raise FileNotFoundError(f"no clip_*.mp4 in {os.fspath(clips_dir)!r} to take the portrait from")
    frames = read_video(videos[0])["frames"][:100]
    return torch.from_numpy(np.median(frames, axis=0).round().astype(np.uint8))


def _audio_encoder(cfg: "TrainConfig", clips_dir: Path, work: Path, resume: bool,
                   progress: bool) -> tuple[object, dict]:
    """The audio encoder for this avatar and a report of where it came from (see the module docstring)."""
    from framegraph.models.audio import AudioEncoder, default_encoder
    from framegraph.models.audio.train import clip_tensors, load_clip_targets, train_audio_encoder

    from .data import clip_audio

    if cfg.audio_from:
        src = Path(cfg.audio_from)
        folder = src / "audio" if (src / "audio" / "config.json").is_file() else src
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"audio_from={cfg.audio_from!r}: no audio encoder there (expected an avatar "
                                    f"folder with audio/ or an encoder folder with config.json)")
        return AudioEncoder.from_pretrained(folder, low_cpu_mem_usage=False).eval(), {"source": str(folder)}
    encoder = default_encoder(cfg.seed)
    out = work / "audio"
    if cfg.audio_steps <= 0:
        return encoder, {"source": "untrained (seeded)", "seed": cfg.seed}
    if resume and (out / "train_report.json").is_file() and \
            json.loads((out / "train_report.json").read_text()).get("steps", 0) >= cfg.audio_steps:
        return AudioEncoder.from_pretrained(out, low_cpu_mem_usage=False).eval(), \
            {"source": "trained", **json.loads((out / "train_report.json").read_text())}
    videos = sorted(clips_dir.glob("clip_*.mp4"))[:cfg.max_clips]
    clips = []
    for video in videos:
        targets = load_clip_targets(json.loads(video.with_suffix(".json").read_text()))
        if targets is None:  # a person's own video: take the encoder the shipped avatar learned on speech
            shipped = Path(__file__).resolve().parents[2] / "assets" / "avatars" / "astronaut" / "audio"
            if (shipped / "config.json").is_file():
                return AudioEncoder.from_pretrained(shipped, low_cpu_mem_usage=False).eval(), \
                    {"source": f"{shipped} (the clips have no ground-truth mouth parameters)"}
            return encoder, {"source": "untrained (seeded): the clips have no ground-truth mouth parameters",
                             "seed": cfg.seed}
        clips.append(clip_tensors(encoder, clip_audio(video), cfg.fps, targets, video.stem))
    report = train_audio_encoder(clips, out, model=encoder, steps=cfg.audio_steps, seed=cfg.seed,
                                 holdout=1 if len(clips) > 2 else 0, progress=progress)
    return encoder.eval(), {"source": "trained", **report}


def train_avatar(clips_dir, out_dir, config: TrainConfig | None = None, *, device: str = "cpu",
                 resume: bool = True, progress: bool = True, portrait=None, torch_threads: int | None = None,
                 **overrides) -> AvatarTrainResult:
    """Train an avatar bundle from a folder of clips (see the module docstring).

    Args:
        clips_dir: ``clip_*.mp4`` + ``clip_*.json`` (``framegraph avatar synth`` output).
        out_dir: the bundle folder to write (``train/`` inside it holds checkpoints and caches).
        config: :class:`TrainConfig`; keyword ``overrides`` replace its fields (``flow_steps=50``...).
        device: ``"cpu"`` / ``"cuda"``. resume: continue from ``out_dir/train`` when present.
        portrait: background image for the bundle (default: see :func:`_portrait_image`).
        torch_threads: intra-op threads while training (restored after).
    """
    from tqdm import tqdm

    from framegraph.models.dit import AvatarDiT, generate
    from framegraph.models.sampler import distill_loss, flow_matching_loss
    from framegraph.models.vae import VideoVAE, train_vae

    cfg = TrainConfig(**{**asdict(config or TrainConfig()), **overrides})
    if cfg.window % cfg.frames_per_block:
        raise ValueError(f"train_avatar: window={cfg.window} must be a multiple of frames_per_block="
                         f"{cfg.frames_per_block}")
    if cfg.vae_preset not in VAE_PRESETS:
        raise ValueError(f"train_avatar: vae_preset={cfg.vae_preset!r}; expected one of {sorted(VAE_PRESETS)}")
    threads_before = torch.get_num_threads()
    if torch_threads:
        torch.set_num_threads(int(torch_threads))
    try:
        t0 = time.monotonic()
        clips_dir, out = Path(clips_dir), Path(out_dir)
        work = out / "train"
        timings: dict[str, float] = {}
        # the background frame of the bundle, which is also the VAE's identity reference
        background = _portrait_image(_first_portrait_json(clips_dir), clips_dir, portrait)
        work.mkdir(parents=True, exist_ok=True)  # only once the clips folder is known to be good

        # ---- (1) the VAE ------------------------------------------------------------------------
        t = time.monotonic()
        vae_dir = work / "vae"
        if resume and (vae_dir / "config.json").is_file() and (vae_dir / "train_report.json").is_file() and \
                json.loads((vae_dir / "train_report.json").read_text()).get("steps", 0) >= cfg.vae_steps:
            vae = VideoVAE.from_pretrained(vae_dir, low_cpu_mem_usage=False)
            vae_report = json.loads((vae_dir / "train_report.json").read_text())
        else:
            vae_config = {**VAE_PRESETS[cfg.vae_preset], "reference_skip": bool(cfg.vae_reference),
                          "reference_warp": bool(cfg.vae_reference and cfg.vae_warp)}
            res = train_vae(clips_dir, vae_dir, steps=cfg.vae_steps, batch=cfg.vae_batch, lr=cfg.vae_lr,
                            device=device, seed=cfg.seed, progress=progress, size=cfg.region_size,
                            model_config=vae_config, resume=resume, max_clips=cfg.max_clips,
                            reference_image=background if cfg.vae_reference else None,
                            redraw_targets=None if cfg.vae_redraw else False,
                            eval_every=max(50, cfg.vae_steps // 4), checkpoint_every=cfg.checkpoint_every,
                            warmup=min(20, max(1, cfg.vae_steps // 10)))
            vae, vae_report = res.model, res.report
        vae = vae.to(device).eval().requires_grad_(False)
        timings["vae_s"] = round(time.monotonic() - t, 1)

        # ---- (2) the audio encoder; latents, audio features, labels (once) ------------------------
        t = time.monotonic()
        audio_encoder, audio_report = _audio_encoder(cfg, clips_dir, work, resume, progress)
        timings["audio_s"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        clips, crop_box, portrait_json = prepare_clips(clips_dir, vae, audio_encoder, region_size=cfg.region_size,
                                                       fps=cfg.fps, vad=cfg.vad, max_clips=cfg.max_clips,
                                                       cache_path=work / "data.pt", progress=progress)
        clips = [ClipData(c.name, c.latents.to(device), c.audio.to(device), c.labels.to(device), c.jaw)
                 for c in clips]
        timings["data_s"] = round(time.monotonic() - t, 1)
        mouth_box = tuple(portrait_json["mouth_box"]) if portrait_json and portrait_json.get("mouth_box") else None
        avatar = Avatar(vae=vae.cpu(), dit=None, audio=audio_encoder, portrait=background, crop_box=crop_box,
                        region_size=cfg.region_size, mouth_box=mouth_box, fps=cfg.fps,
                        chunk_frames=cfg.frames_per_block, steps=cfg.sample_steps, shift=cfg.shift, vad=cfg.vad)
        ref = avatar.reference_latent().to(device)
        vae.to(device)
        C, lh, lw = ref.shape
        weight = mouth_latent_weight(mouth_box, crop_box, cfg.region_size, (lh, lw), cfg.mouth_weight)
        weight = None if weight is None else weight.to(device)

        # ---- (3)-(5) the DiT --------------------------------------------------------------------
        ckpt = _Checkpoint(work)
        state = ckpt.load() if resume else None
        dit_cfg = {"latent_channels": C, "sample_size": [lh, lw], "frames_per_block": cfg.frames_per_block,
                   "audio_dim": audio_encoder.feature_dim, **cfg.dit_overrides}
        if state is not None:
            model = AvatarDiT.from_pretrained(work / "dit", low_cpu_mem_usage=False)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed)
                model = AvatarDiT.from_preset(cfg.preset, **dit_cfg)
            state = {"phase": "flow", "step": 0, "history": [], "done": [], "ema": None, "teacher": None,
                     "optimizer": None, "rng": None}
        model = model.to(device).train()
        gen = torch.Generator().manual_seed(cfg.seed + 7)
        if state.get("rng") is not None:
            gen.set_state(state["rng"])
        history: list[dict] = state["history"]
        k, B, T = cfg.frames_per_block, cfg.batch, cfg.window
        phase_steps = {"flow": cfg.flow_steps, "distill": cfg.distill_steps, "rollout": cfg.rollout_steps}
        teacher = ema = None
        if state.get("teacher") is not None:
            teacher = AvatarDiT.from_config(model.config).to(device)
            teacher.load_state_dict(state["teacher"])
            teacher.eval().requires_grad_(False)
        if state.get("ema") is not None:
            ema = AvatarDiT.from_config(model.config).to(device)
            ema.load_state_dict(state["ema"])
            ema.eval().requires_grad_(False)

        for phase in ("flow", "distill", "rollout"):
            steps = phase_steps[phase]
            done_steps = state.setdefault("steps_done", {})
            if phase in state["done"] and done_steps.get(phase, 0) >= steps:
                continue
            t = time.monotonic()
            if phase == "distill" and steps > 0 and teacher is None:
                teacher = copy.deepcopy(model).eval().requires_grad_(False)
                ema = copy.deepcopy(model).eval().requires_grad_(False)
            opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
            start = state["step"] if state["phase"] == phase else done_steps.get(phase, 0)
            if state["phase"] == phase and state.get("optimizer") is not None:
                opt.load_state_dict(state["optimizer"])
            state["phase"] = phase

            def save(step):
                state.update(step=step, history=history, rng=gen.get_state(), optimizer=opt.state_dict(),
                             teacher=None if teacher is None else teacher.state_dict(),
                             ema=None if ema is None else ema.state_dict())
                ckpt.save(model, state)

            bar = tqdm(total=steps, initial=start, desc=f"train dit ({phase})", disable=not progress,
                       dynamic_ncols=True)
            step = start
            try:
                while step < steps:
                    for g in opt.param_groups:
                        g["lr"] = _lr(step, steps, cfg.lr if phase == "flow" else cfg.lr * 0.5, cfg.warmup)
                    x0, audio, labels = sample_windows(clips, B, T, gen)
                    Tw = x0.shape[2] - x0.shape[2] % k
                    x0, audio, labels = x0[:, :, :Tw], audio[:, :Tw], labels[:, :Tw]
                    cond = dict(audio=audio, state_label=labels, ref=ref, clean=x0)
                    if phase == "rollout":
                        model.eval()
                        with torch.no_grad():
                            rollout = generate(model, ref, audio, labels, steps=cfg.sample_steps, shift=cfg.shift)
                        model.train()
                        cond["clean"] = rollout
                    noise = torch.randn(x0.shape, generator=gen).to(device)
                    if phase == "flow" or (phase == "rollout" and teacher is None):
                        loss = flow_matching_loss(model, x0, cond, time_shape=(B, Tw // k), time_repeat=k,
                                                  shift=cfg.shift, noise=noise, weight=weight)
                    else:
                        loss = distill_loss(model, teacher, x0, cond, target=ema, intervals=cfg.distill_intervals,
                                            shift=cfg.shift, time_shape=(B, Tw // k), time_repeat=k, noise=noise,
                                            generator=None)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
                    if ema is not None:
                        with torch.no_grad():
                            for pe, pm in zip(ema.parameters(), model.parameters()):
                                pe.lerp_(pm, 1.0 - cfg.ema)
                    step += 1
                    history.append({"phase": phase, "step": step, "loss": round(float(loss.detach()), 5)})
                    if step % cfg.checkpoint_every == 0 and step < steps:
                        save(step)
                    bar.update(1)
                    bar.set_postfix(loss=f"{float(loss.detach()):.4f}")
            finally:
                bar.close()
            if phase not in state["done"]:
                state["done"].append(phase)
            done_steps[phase] = step
            save(step)
            timings[f"{phase}_s"] = round(time.monotonic() - t, 1)

        model.eval().requires_grad_(False)
        if teacher is not None:  # the many-step flow model the student was distilled from (for eval)
            teacher.cpu().save_pretrained(work / "teacher")
        avatar.dit = model.cpu()
        avatar.vae = vae.cpu()
        if cfg.distill_steps == 0 and cfg.sample_steps < 4:
            avatar.steps = 4  # an undistilled model needs more steps
        losses = {p: [h["loss"] for h in history if h["phase"] == p] for p in ("flow", "distill", "rollout")}
        summary = {p: {"first": round(sum(v[:10]) / len(v[:10]), 5), "last": round(sum(v[-10:]) / len(v[-10:]), 5)}
                   for p, v in losses.items() if v}
        report = {"config": asdict(cfg), "clips_dir": os.fspath(clips_dir), "clips": len(clips),
                  "frames": sum(c.frames for c in clips), "crop_box": list(crop_box), "losses": summary,
                  "vae": {"heldout_final": vae_report.get("heldout_final"), "steps": vae_report.get("steps"),
                          "reference_skip": bool(vae.uses_reference),
                          "reference_warp": bool(vae.config.reference_warp), "targets": vae_report.get("targets")},
                  "audio_encoder": audio_report,
                  "dit_parameters": sum(p.numel() for p in model.parameters()),
                  "vae_parameters": sum(p.numel() for p in vae.parameters()),
                  "timings": {**timings, "total_s": round(time.monotonic() - t0, 1)}, "device": str(device),
                  "torch": torch.__version__, "machine": platform.machine(), "threads": torch.get_num_threads()}
        avatar.meta = {"training": {k: report[k] for k in ("clips", "frames", "losses", "timings")}}
        save_avatar(out, avatar)
        tmp = out / "train_report.json.partial"
        tmp.write_text(json.dumps(report, indent=1, default=str))
        os.replace(tmp, out / "train_report.json")
        return AvatarTrainResult(avatar, report, history)
    finally:
        torch.set_num_threads(threads_before)


__all__ = ["PHASES", "TrainConfig", "AvatarTrainResult", "train_avatar", "mouth_latent_weight"]
