"""Train the video VAE on face-region clips: ``train_vae(clips_dir_or_frames, out_dir, steps=...)``.

Each step sees ``batch`` windows of ``clip_frames`` consecutive frames, ``float [B, 3, T, S, S]``. The loss
is::

    weighted L1  +  ssim_weight · (1 − weighted SSIM)  +  kl_weight · KL(posterior ‖ N(0, 1))

The pixel weight is ``mouth_weight`` inside the frame's mouth box and 1 elsewhere. The avatar is judged on the
mouth, so the mouth must reconstruct sharply. The encoder reads the clip as decoded from its MP4. The
reconstruction target is the same frame. Synthetic clips can be redrawn from their JSON instead
(``redraw_targets``). Their target is then the frame without the codec's loss. So the decoder learns the clean
picture. The optimizer is AdamW. The rate warms up linearly, then decays by cosine to ``lr_min_fraction · lr``.
The gradient norm is clipped to 1.

Output folder::

    out_dir/config.json, diffusion_pytorch_model.safetensors   the final model (VideoVAE.from_pretrained)
    out_dir/train_report.json                                    settings, data, timings, PSNR / SSIM
    out_dir/checkpoint/                                          model + trainer_state.pt, for resuming

Evaluation streams the held-out clips through the model chunk by chunk. It uses encoder and decoder caches, as
the avatar pipeline does. It reports PSNR over all pixels and over the mouth boxes, and SSIM. After training,
the latent's per-channel mean and std on training frames go in the model's config. They are ``latent_mean``
and ``latent_std``. So ``encode`` hands the denoiser ~unit-variance latents.

**Decoder only**, with ``train_encoder=False``. The encoder and the latent statistics are frozen. Only the
decoder and a reference encoder learn. So the latent space does not move. A denoiser already trained on it
stays valid. This is how an existing avatar's decoder is sharpened without retraining anything else. It is
also how it gets the reference warp of :func:`~.model.with_reference_warp`.
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from framegraph.stream.files import write_json, written_whole

from ..training import REPORT, cpu_threads, lr_at
from .data import FaceClips, crop_frames, face_clips_from_frames, load_face_clips, redrawable
from .losses import box_mask, kl_divergence, reconstruction_loss, ssim
from .model import VideoVAE, uint8_to_frames

CHECKPOINT = "checkpoint"
TRAINER_STATE = "trainer_state.pt"


@dataclass
class VAETrainResult:
    """What :func:`train_vae` returns. ``report`` is also written to ``out_dir/train_report.json``."""

    model: VideoVAE
    report: dict
    history: list[dict] = field(default_factory=list)


def _window_batch(clips: FaceClips, batch: int, frames: int, gen: torch.Generator, mouth_weight: float):
    """``batch`` random windows → (x, target, weight).

    ``x`` is the input, float [B, 3, T, S, S] in [-1, 1]. ``target`` is ``x`` itself, unless the clips have
    :attr:`~.data.FaceClips.targets`. ``weight`` is [B·T, 1, S, S] or None."""
    lengths = torch.tensor([int(c.shape[0]) for c in clips.frames], dtype=torch.float64)
    t = int(min(frames, lengths.min().item()))
    picks = torch.multinomial(lengths, batch, replacement=True, generator=gen).tolist()
    xs, ys, boxes = [], [], []
    for i in picks:
        start = int(torch.randint(0, int(lengths[i]) - t + 1, (1,), generator=gen))
        xs.append(clips.frames[i][start:start + t])
        ys.append(clips.target(i)[start:start + t])
        if clips.mouth_boxes is not None:
            boxes.append(clips.mouth_boxes[i][start:start + t])
    x = uint8_to_frames(torch.stack(xs)).transpose(1, 2)  # [B, T, S, S, 3] → [B, 3, T, S, S]
    y = x if clips.targets is None else uint8_to_frames(torch.stack(ys)).transpose(1, 2)
    weight = None
    if boxes and mouth_weight != 1.0:
        weight = 1.0 + (mouth_weight - 1.0) * box_mask(torch.cat(boxes), clips.size, clips.size)
    return x, y, weight


@torch.no_grad()
def evaluate_vae(model: VideoVAE, clips: FaceClips, *, max_frames: int = 64, chunk: int = 4,
                 device="cpu", reference: Tensor | None = None) -> dict:
    """Stream the first ``max_frames`` frames of ``clips`` through encode → decode.

    The frames are spread over the clips. They go ``chunk`` frames at a time, with caches. Returns PSNR in dB
    over all pixels. Returns mouth PSNR in dB, inside the mouth boxes; it is None without boxes. Returns SSIM
    and the frame count. The scores compare with the clips' targets when they have them, the redrawn frames.
    Else they compare with the frames. ``reference float [1, 3, S, S]`` is the identity reference of a
    ``reference_skip`` model."""
    model.eval()
    per_clip = max(1, max_frames // len(clips.frames))
    se = n = mouth_se = mouth_n = 0.0
    ssims, count = [], 0
    for ci, frames in enumerate(clips.frames):
        frames, targets = frames[:per_clip], clips.target(ci)[:per_clip]
        enc = dec = None
        for s in range(0, frames.shape[0], chunk):
            x = uint8_to_frames(frames[s:s + chunk]).transpose(0, 1)[None].to(device)  # [1, 3, T, S, S]
            z, enc = model.encode(x, enc)
            y, dec = model.decode(z, dec, reference=None if dec is not None or reference is None
                                  else reference.to(device))
            y = y.clamp(-1, 1)
            x = uint8_to_frames(targets[s:s + chunk]).transpose(0, 1)[None].to(device)  # what y should be
            err = (y - x).pow(2).sum(dim=1)[0]  # [T, S, S]
            se += float(err.sum())
            n += err.numel() * 3
            if clips.mouth_boxes is not None:
                m = box_mask(clips.mouth_boxes[ci][s:s + x.shape[2]].to(device), clips.size, clips.size)[:, 0]
                mouth_se += float((err * m).sum())
                mouth_n += float(m.sum()) * 3
            ssims.append(float(ssim(y, x)) * x.shape[2])
            count += x.shape[2]
    to_db = lambda mse: math.inf if mse == 0 else 10 * math.log10(4.0 / mse)  # noqa: E731 (range [-1, 1])
    return {"psnr_db": round(to_db(se / n), 3),
            "mouth_psnr_db": round(to_db(mouth_se / mouth_n), 3) if mouth_n else None,
            "ssim": round(sum(ssims) / count, 4), "frames": count}


@torch.no_grad()
def measure_latent_stats(model: VideoVAE, clips: FaceClips, *, max_frames: int = 256, chunk: int = 8,
                         device="cpu") -> tuple[list[float], list[float]]:
    """Per-channel mean and std of the raw posterior mean over up to ``max_frames`` frames."""
    model.eval()
    per_clip = max(1, max_frames // len(clips.frames))
    zs = []
    for frames in clips.frames:
        cache = None
        for s in range(0, min(per_clip, frames.shape[0]), chunk):
            x = uint8_to_frames(frames[s:min(s + chunk, per_clip)]).transpose(0, 1)[None].to(device)
            mean, _, cache = model.encode_moments(x, cache)
            zs.append(mean.transpose(0, 1).reshape(mean.shape[1], -1))
    z = torch.cat(zs, dim=1).double()
    return z.mean(dim=1).tolist(), z.std(dim=1).clamp_min(1e-6).tolist()


def reference_region(reference_image: Tensor | None, clips: FaceClips) -> Tensor:
    """The identity reference of a ``reference_skip`` VAE as ``float32 [1, 3, S, S]`` in [-1, 1].

    ``reference_image`` is ``uint8 [S, S, 3]``, already the region. Or it is ``[H, W, 3]``, a full frame. A full
    frame is cut with the clips' crop box."""

    if reference_image is None:
        raise ValueError("train_vae: this VAE (reference_skip) decodes with an identity reference; pass "
                         "reference_image= (the portrait, uint8 [H, W, 3])")
    ref = torch.as_tensor(reference_image)
    if ref.dtype != torch.uint8 or ref.dim() != 3 or ref.shape[-1] != 3:
        raise ValueError(f"train_vae: reference_image must be uint8 [H, W, 3], got {ref.dtype} {list(ref.shape)}")
    if tuple(ref.shape[:2]) != (clips.size, clips.size):
        if clips.crop_box is None:
            raise ValueError(f"train_vae: reference_image is {ref.shape[1]}x{ref.shape[0]} but the clips are "
                             f"{clips.size}² regions with no known crop box; pass the region itself")
        ref = crop_frames(ref[None], clips.crop_box, clips.size)[0]
    return uint8_to_frames(ref)[None].contiguous()


def _as_clips(data, size: int, max_clips: int | None, redraw: bool | None) -> tuple[FaceClips, str]:
    if isinstance(data, FaceClips):
        return data, "FaceClips"
    if isinstance(data, Tensor):
        return face_clips_from_frames(data), f"tensor {list(data.shape)}"
    if isinstance(data, (str, os.PathLike)):
        if redraw is None:
            redraw = Path(data).is_dir() and redrawable(data, max_clips)
        return load_face_clips(data, size=size, max_clips=max_clips, redraw_targets=redraw), os.fspath(data)
    raise TypeError(f"train_vae: data must be a clips folder, a uint8 frames tensor or FaceClips, "
                    f"got {type(data).__name__}")


def _start_model(ckpt: Path, *, resume: bool, model: VideoVAE | None, model_config: dict | None, seed: int,
                 size: int, device, train_encoder: bool) -> tuple[VideoVAE, dict | None]:
    """The model to train, and the trainer state to continue from.

    The model is on ``device``, in train mode. The state is None for a fresh start. When resuming, both come from
    the checkpoint. Else the model is ``model``, or a new ``VideoVAE(sample_size=size, **model_config)`` drawn
    from ``seed``. With ``train_encoder=False`` its encoder is frozen."""
    state = None
    if resume and (ckpt / TRAINER_STATE).exists():
        model = VideoVAE.from_pretrained(ckpt, low_cpu_mem_usage=False)
        state = torch.load(ckpt / TRAINER_STATE, map_location="cpu", weights_only=True)
    elif model is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = VideoVAE(**{"sample_size": size, **(model_config or {})})
    model = model.to(device).train()
    if not train_encoder:
        if model.config.latent_mean is None:
            raise ValueError("train_vae: train_encoder=False keeps a trained encoder's latent space; pass the "
                             "trained model (its config has no latent_mean / latent_std yet)")
        model.encoder.requires_grad_(False)
    return model, state


def _save_checkpoint(ckpt: Path, model: VideoVAE, opt, gen: torch.Generator, step: int, history: list[dict],
                     initial: dict | None, seconds: float) -> None:
    """Write ``ckpt/`` with the model, and ``ckpt/trainer_state.pt``.

    The state holds the optimizer, sampler RNG, step and history. It holds the held-out scores before training.
    It holds the seconds trained over all runs."""
    model.save_pretrained(ckpt)
    with written_whole(ckpt / TRAINER_STATE) as tmp:
        torch.save({"optimizer": opt.state_dict(), "sampler_rng": gen.get_state(), "step": torch.tensor(step),
                    "history_json": json.dumps(history), "initial_json": json.dumps(initial),
                    "train_seconds": torch.tensor(seconds, dtype=torch.float64)}, tmp)


def _step_loss(model: VideoVAE, x: Tensor, target: Tensor, weight: Tensor | None, ref: Tensor | None, *,
               latent_noise: float, noise_gen: torch.Generator, ssim_weight: float,
               kl_weight: float) -> tuple[Tensor, Tensor, dict]:
    """The loss of one batch ``x``, ``target`` ``[B, 3, T, S, S]``; see the module docstring.

    Returns the loss, its KL term and the reconstruction's parts."""
    sigma = None
    if latent_noise > 0:
        sigma = latent_noise * torch.rand(x.shape[0], generator=noise_gen, device=x.device)
    recon, mean, logvar = model(x, sample=True, generator=noise_gen, latent_noise=sigma,
                                reference=None if ref is None else ref.expand(x.shape[0], -1, -1, -1))
    rec, parts = reconstruction_loss(recon, target, weight, ssim_weight=ssim_weight)
    kl = kl_divergence(mean, logvar)
    return rec + kl_weight * kl, kl, parts


def _finish(model: VideoVAE, out: Path, train: FaceClips, evaluate, *, train_encoder: bool, device) -> dict | None:
    """Finish training: the model in eval mode, saved to ``out``.

    Its latent statistics are measured on ``train``. They are kept when the encoder was frozen. Returns its
    held-out scores from ``evaluate(model)``, or None without them."""
    model.eval()
    if train_encoder:
        mean_c, std_c = measure_latent_stats(model, train, device=device)
        model.set_latent_stats(mean_c, std_c)
    model.requires_grad_(True)
    final = evaluate(model) if evaluate is not None else None
    model.save_pretrained(out)
    return final


def _data_report(source: str, clips: FaceClips, train: FaceClips, held: FaceClips) -> dict:
    return {"source": source, "train_clips": len(train.frames), "train_frames": train.n_frames,
            "heldout_clips": len(held.frames), "heldout_frames": held.n_frames,
            "crop_box": list(clips.crop_box) if clips.crop_box else None}


def _model_report(model: VideoVAE) -> dict:
    return {"parameters": sum(p.numel() for p in model.parameters()),
            "spatial_compression": model.spatial_compression, "config": dict(model.config)}


@dataclass
class _Run:
    """Where a training run stands.

    It holds the steps done, the loss history and the held-out figures before training. It holds the training
    seconds of earlier, resumed runs."""

    step: int = 0
    history: list[dict] = field(default_factory=list)
    initial: dict | None = None
    seconds_before: float = 0.0
    t_start: float = field(default_factory=time.monotonic)

    @classmethod
    def begin(cls, state: dict | None, opt, gen: torch.Generator, evaluate, model: VideoVAE) -> _Run:
        """Start from a checkpoint's ``state``, or fresh.

        From a checkpoint, the optimizer and sampler are restored too. With a held-out set, a fresh run first
        measures the untrained model on it."""
        if state is not None:
            opt.load_state_dict(state["optimizer"])
            gen.set_state(state["sampler_rng"])
            return cls(int(state["step"]), list(json.loads(state["history_json"])),
                       json.loads(state["initial_json"]), float(state.get("train_seconds", 0.0)))
        run = cls()
        if evaluate is not None:
            run.initial = evaluate(model)
            model.train()
            run.t_start = time.monotonic()  # the untrained model's evaluation is not training time
        return run

    def seconds(self) -> float:
        """Training seconds over all runs."""
        return self.seconds_before + time.monotonic() - self.t_start


def _optimise(run: _Run, model: VideoVAE, params, opt, gen: torch.Generator, train: FaceClips, ref: Tensor | None,
              *, device, seed: int, ckpt: Path, evaluate, eval_every: int, checkpoint_every: int, progress: bool,
              steps: int, batch: int, clip_frames: int, lr: float, warmup: int, lr_min_fraction: float,
              mouth_weight: float, ssim_weight: float, kl_weight: float, latent_noise: float) -> None:
    """The optimisation loop, from ``run.step`` up to ``steps``.

    It evaluates on the held-out set every ``eval_every`` steps. It writes a checkpoint every
    ``checkpoint_every`` steps, and one at the end."""
    from tqdm import tqdm

    noise_gen = torch.Generator(device=device).manual_seed(seed + 1)
    last_eval = None
    with tqdm(total=steps, initial=run.step, desc="train vae", disable=not progress, dynamic_ncols=True) as bar:
        while run.step < steps:
            for g in opt.param_groups:
                g["lr"] = lr_at(run.step, steps, lr, warmup, lr_min_fraction)
            x, target, weight = _window_batch(train, batch, clip_frames, gen, mouth_weight)
            loss, kl, parts = _step_loss(model, x.to(device), target.to(device),
                                         None if weight is None else weight.to(device), ref,
                                         latent_noise=latent_noise, noise_gen=noise_gen,
                                         ssim_weight=ssim_weight, kl_weight=kl_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            run.step += 1
            loss_value = float(loss.detach())
            run.history.append({"step": run.step, "loss": round(loss_value, 5), "kl": round(float(kl.detach()), 4),
                                **{k: round(v, 5) for k, v in parts.items()}})
            if evaluate is not None and (run.step % eval_every == 0 or run.step == steps):
                last_eval = evaluate(model)
                run.history[-1]["heldout"] = last_eval
                model.train()
            if run.step % checkpoint_every == 0 and run.step < steps:
                _save_checkpoint(ckpt, model, opt, gen, run.step, run.history, run.initial, run.seconds())
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.4f}", psnr=f"{last_eval['psnr_db']:.2f}" if last_eval else "-")
    _save_checkpoint(ckpt, model, opt, gen, run.step, run.history, run.initial, run.seconds())


@dataclass
class VAETrainConfig:
    """Settings of :func:`train_vae`.

    Attributes:
        steps: total optimisation steps. When resuming, training continues up to this number.
        batch: windows per step.
        clip_frames: consecutive frames per window. The temporal convs learn from these.
        lr: AdamW peak rate.
        warmup: warm-up steps.
        lr_min_fraction: final fraction of the peak rate.
        device: ``"cpu"``, ``"cuda"``...
        seed: seeds model init, window sampling and posterior noise.
        size: the face region's side in px. A folder's clips are cut to it.
        model_config: ``VideoVAE(sample_size=size, **model_config)`` when no model is given.
        mouth_weight: loss weight; see the module docstring.
        ssim_weight: loss weight; see the module docstring.
        kl_weight: loss weight; see the module docstring.
        eval_every: held-out evaluation period, in steps.
        eval_frames: frames per held-out evaluation.
        checkpoint_every: steps between checkpoints. One is also written at the end.
        resume: continue from ``out_dir/checkpoint`` when it exists. That restores its model, optimizer,
            sampler state and history. The given model and ``model_config`` are then ignored.
        max_clips: read at most this many clips from a folder.
        holdout_fraction: the share held out; see :meth:`FaceClips.split`.
        train_encoder: False trains the decoder side only. The encoder and latent statistics are frozen.
            It needs a trained model, or a checkpoint, with latent statistics.
        redraw_targets: for a clips folder, learn to give back each synthetic frame redrawn. The redrawn frames
            skip the video codec (:attr:`~.data.FaceClips.targets`). None: whenever the folder's clips can be
            redrawn.
        latent_noise: each window's latent gets Gaussian noise before decoding. Its std is drawn from
            ``[0, latent_noise]``, in normalised-latent units. So the decoder learns to clean a denoiser's
            latents.
    """

    steps: int = 300
    batch: int = 4
    lr: float = 1e-3
    device: str = "cpu"
    seed: int = 0
    size: int = 128
    clip_frames: int = 3
    model_config: dict | None = None
    mouth_weight: float = 4.0
    ssim_weight: float = 0.2
    kl_weight: float = 1e-4
    warmup: int = 20
    lr_min_fraction: float = 0.1
    eval_every: int = 100
    eval_frames: int = 64
    checkpoint_every: int = 100
    resume: bool = True
    max_clips: int | None = None
    holdout_fraction: float = 0.15
    train_encoder: bool = True
    redraw_targets: bool | None = None
    latent_noise: float = 0.0


def train_vae(data, out_dir, *, model: VideoVAE | None = None, reference_image: Tensor | None = None,
              progress: bool = True, torch_threads: int | None = None, **settings) -> VAETrainResult:
    """Train a :class:`VideoVAE` on face-region clips, or resume training it.

    Args:
        data: the clips. It may be a folder of ``framegraph avatar synth`` clips. They are cut to the face
            with :func:`load_face_clips` at ``size`` px. It may be a ``uint8 [T, S, S, 3]`` or
            ``[N, T, S, S, 3]`` tensor of regions. It may be :class:`FaceClips`.
        out_dir: where the model, the report and the checkpoint go. It is created.
        model: start from this model. Else one is built from ``model_config``. Ignored when resuming.
        reference_image: the identity reference portrait for a ``reference_skip`` model. It is a ``uint8
            [H, W, 3]`` full frame, cut with the clips' crop box. Or it is the ``[S, S, 3]`` region.
        progress: show a tqdm bar with the loss and held-out PSNR.
        torch_threads: intra-op CPU threads while training, restored after. None leaves torch's setting.
        settings: :class:`VAETrainConfig` fields.

    Returns :class:`VAETrainResult`. It holds the trained model on ``device`` in eval mode, the report and the
    loss history. Raises ``ValueError`` for bad settings. Raises ``FileNotFoundError`` for a missing folder.
    """
    cfg = VAETrainConfig(**settings)
    if cfg.latent_noise < 0:
        raise ValueError(f"train_vae: latent_noise={cfg.latent_noise} must be >= 0 (a noise std)")
    if cfg.steps < 1 or cfg.batch < 1 or cfg.clip_frames < 1 or cfg.lr <= 0:
        raise ValueError(f"train_vae: steps={cfg.steps}, batch={cfg.batch}, clip_frames={cfg.clip_frames} must be "
                         f">= 1 and lr={cfg.lr} > 0")
    with cpu_threads(torch_threads):
        t_start = time.monotonic()
        out = Path(out_dir)
        ckpt = out / CHECKPOINT
        clips, source = _as_clips(data, cfg.size, cfg.max_clips, cfg.redraw_targets)
        train, held = clips.split(cfg.holdout_fraction)
        device = torch.device(cfg.device)
        data_seconds = time.monotonic() - t_start

        model, state = _start_model(ckpt, resume=cfg.resume, model=model, model_config=cfg.model_config,
                                    seed=cfg.seed, size=clips.size, device=device, train_encoder=cfg.train_encoder)
        params = [p for p in model.parameters() if p.requires_grad]
        f = model.spatial_compression
        if clips.size % f:
            raise ValueError(f"train_vae: region size {clips.size} px is not a multiple of the model's spatial "
                             f"compression {f}")
        ref = reference_region(reference_image, clips).to(device) if model.uses_reference else None
        out.mkdir(parents=True, exist_ok=True)  # only once every argument is known to be good
        evaluate = None  # held-out evaluation, when something is held out
        if held.n_frames:
            evaluate = lambda m: evaluate_vae(m, held, max_frames=cfg.eval_frames, device=device,  # noqa: E731
                                              reference=ref)
        opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
        gen = torch.Generator().manual_seed(cfg.seed)
        run = _Run.begin(state, opt, gen, evaluate, model)
        losses = {k: getattr(cfg, k) for k in ("steps", "batch", "clip_frames", "lr", "warmup", "lr_min_fraction",
                                               "mouth_weight", "ssim_weight", "kl_weight", "latent_noise")}
        _optimise(run, model, params, opt, gen, train, ref, device=device, seed=cfg.seed, ckpt=ckpt,
                  evaluate=evaluate, eval_every=cfg.eval_every, checkpoint_every=cfg.checkpoint_every,
                  progress=progress, **losses)
        train_seconds = run.seconds()
        final = _finish(model, out, train, evaluate, train_encoder=cfg.train_encoder, device=device)
        report = {
            **{k: v for k, v in losses.items() if k not in ("warmup", "lr_min_fraction")},
            "steps": run.step, "seed": cfg.seed, "size": clips.size, "train_encoder": cfg.train_encoder,
            "targets": "redrawn" if clips.targets is not None else "video",
            "data": _data_report(source, clips, train, held), "model": _model_report(model),
            "heldout_initial": run.initial, "heldout_final": final,
            "data_seconds": round(data_seconds, 1), "train_seconds": round(train_seconds, 1),
            "final_loss": run.history[-1]["loss"] if run.history else None,
            "device": str(device), "torch": torch.__version__, "machine": platform.machine(),
            "threads": torch.get_num_threads(),
        }
        write_json(out / REPORT, report)
        return VAETrainResult(model, report, run.history)


__all__ = ["VAETrainConfig", "VAETrainResult", "evaluate_vae", "measure_latent_stats", "reference_region", "train_vae"]
