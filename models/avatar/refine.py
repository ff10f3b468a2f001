"""Sharpen a trained portrait avatar's decoder: ``refine_decoder(avatar_dir, clips_dir, out_dir, steps=...)``.

It trains the VAE's decoder side only, with ``train_vae(..., train_encoder=False)``. The encoder and the
latent statistics stay as they are. So the avatar's denoiser, audio encoder and settings carry over
untouched. The new bundle talks exactly as the old one did. Only the pixels it draws change.

By default the decoder first gets the reference warp (:func:`framegraph.models.vae.with_reference_warp`). It
learns to hand back the portrait's own pixels, moved with the head, wherever the face did not change.
Identity is judged on that: SSIM against the portrait outside the mouth. Synthetic clips are learnt without
the video codec's loss. Their frames are redrawn from the JSON by :mod:`framegraph.models.synth.truth`.

The output is a complete bundle at ``out_dir``. The source bundle's other folders are copied, e.g.
``teacher/``. The decoder training's report goes under ``avatar.json`` → ``decoder_refine``. Its checkpoint
goes in ``out_dir/train/vae``. A second call with more ``steps`` resumes there.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from framegraph.models.vae import load_face_clips, redrawable, train_vae, with_reference_warp

from .base import AvatarError
from .bundle import load_avatar
from .portrait.bundle import PARTS, save_avatar

WORK = "train"


def refine_decoder(avatar_dir, clips_dir, out_dir, *, steps: int = 400, batch: int = 4, clip_frames: int = 3,
                   lr: float = 1e-3, warp: bool = True, latent_noise: float = 0.5, device: str = "cpu",
                   progress: bool = True, torch_threads: int | None = None, max_clips: int | None = None,
                   resume: bool = True, seed: int = 0) -> dict:
    """Train the decoder of the bundle at ``avatar_dir`` and write the new bundle to ``out_dir``.

    It trains on the talking clips in ``clips_dir``, of the same portrait. ``framegraph avatar synth`` or
    ``avatar train --video`` prepares that folder. Returns the VAE training report; see
    :func:`framegraph.models.vae.train_vae`.

    ``warp``: first add the reference-warp head, when the VAE has none yet. It needs a ``reference_skip`` VAE.
    ``latent_noise``: noise on the latents while training; see :func:`~framegraph.models.vae.train_vae`. 0.5
    covers the denoiser's error. So the decoder copies the portrait from the denoiser's latents as it does
    from the encoder's. ``steps`` / ``batch`` / ``clip_frames`` / ``lr``: the VAE trainer's settings.

    Raises :class:`AvatarError` for a bad bundle. It raises it for a bundle whose VAE cannot take the warp. It
    raises it when ``out_dir`` is the source bundle, which is never overwritten."""

    src, out = Path(avatar_dir), Path(out_dir)
    if out.resolve() == src.resolve():
        raise AvatarError(f"refine_decoder: the output folder {str(out)!r} is the source bundle; write the refined "
                          "avatar to another folder (the source is kept as it is)")
    t0 = time.monotonic()
    avatar = load_avatar(src)
    vae = avatar.vae
    if warp and not vae.config.reference_warp:
        if not vae.uses_reference:
            raise AvatarError(f"refine_decoder: the VAE of {str(src)!r} was trained without the identity reference "
                              "(reference_skip), which the warp reads; refine without the warp or retrain the avatar")
        vae = with_reference_warp(vae)
    clips = load_face_clips(clips_dir, size=avatar.region_size, crop_box=avatar.crop_box, max_clips=max_clips,
                            redraw_targets=redrawable(clips_dir, max_clips))
    res = train_vae(clips, out / WORK / "vae", steps=steps, batch=batch, clip_frames=clip_frames, lr=lr,
                    device=device, seed=seed, progress=progress, model=vae, resume=resume,
                    reference_image=avatar.portrait if vae.uses_reference else None, train_encoder=False,
                    torch_threads=torch_threads, eval_every=max(50, steps // 4), latent_noise=latent_noise,
                    warmup=min(20, max(1, steps // 10)))
    report = dict(res.report, source=str(src), clips=str(clips_dir), seconds=round(time.monotonic() - t0, 1))
    avatar.vae = res.model.cpu().eval()
    avatar.meta = {**avatar.meta, "decoder_refine": {
        "source": str(src), "steps": report["steps"], "reference_warp": bool(avatar.vae.config.reference_warp),
        "targets": "redrawn" if clips.targets is not None else "video",
        "heldout_initial": report["heldout_initial"], "heldout_final": report["heldout_final"],
        "train_seconds": report["train_seconds"]}}
    save_avatar(out, avatar)
    for extra in sorted(src.iterdir()):  # e.g. teacher/: same latent space, still valid
        if extra.is_dir() and extra.name not in PARTS and extra.name != WORK and not (out / extra.name).exists():
            shutil.copytree(extra, out / extra.name)
    return report


__all__ = ["refine_decoder"]
