"""``framegraph avatar``'s implementation. Its options and usage are in ``apps/commands/avatar.py``.

It covers the talking avatar's tools. They are synthetic clips (``synth``) and training (``train``, ``refine``). They
are the person matte (``matte``) and evaluation (``eval``). It also prepares a person for MuseTalk (``prepare``)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from framegraph.models.avatar import AvatarError, RunSettings, load_avatar
from framegraph.models.avatar.clips.prepare import prepare_video
from framegraph.models.avatar.eval.real import track_clip
from framegraph.models.avatar.eval.synthetic import evaluate_avatar
from framegraph.models.avatar.eval.video import evaluate_typed_text, evaluate_video_avatar
from framegraph.models.avatar.portrait.train import train_avatar
from framegraph.models.avatar.refine import refine_decoder
from framegraph.models.avatar.video.openness import OPENNESS_FRAMES
from framegraph.models.avatar.video.provenance import PROVENANCE, add_evaluation
from framegraph.models.avatar.video.train import train_video_avatar
from framegraph.models.dit import AvatarDiT
from framegraph.models.synth import (
    EspeakError,
    EspeakNotFound,
    PortraitError,
    PortraitRenderer,
    espeak_available,
    load_portrait,
    parse_box,
    prepare_clip,
)
from framegraph.models.synth.espeak import INSTALL_HINT
from framegraph.models.vae import region_size
from framegraph.stream.files import write_json
from framegraph.stream.media import SAMPLE_RATE, MediaError
from framegraph.stream.progress import run_with_progress


def run(args: argparse.Namespace) -> int:
    if getattr(args, "mouth_box", None) is not None:  # X,Y,W,H: PortraitError (a ValueError) when it is not one
        args.mouth_box = parse_box(args.mouth_box)
    if getattr(args, "face_box", None) is not None:
        args.face_box = parse_box(args.face_box)
    return {"synth": run_synth, "train": run_train, "refine": run_refine, "eval": run_eval,
            "matte": run_matte, "prepare": run_prepare}[args.avatar_command](args)


def run_prepare(args: argparse.Namespace) -> int:
    """``avatar prepare --musetalk``: a person prepared for MuseTalk 1.5. See models/avatar/musetalk/prepare.py."""
    from framegraph.models.avatar.musetalk.bundle import describe
    from framegraph.models.avatar.musetalk.files import MuseTalkError, MuseTalkFiles
    from framegraph.models.avatar.musetalk.prepare import prepare_musetalk
    from framegraph.models.face import FaceError

    def error(message) -> int:
        print(f"framegraph avatar prepare: error: {message}", file=sys.stderr)
        return 2

    try:
        files = MuseTalkFiles.find(args.musetalk, unet_config=args.unet_config, unet_weights=args.unet_weights,
                                   vae=args.vae, whisper=args.whisper)
        avatar = prepare_musetalk(files, args.video, args.out, loop_seconds=args.loop_seconds,
                                  idle_seconds=args.idle_seconds, max_side=args.max_side, device=args.device,
                                  log=lambda m: print(m, file=sys.stderr))
    except (MuseTalkError, MediaError, FaceError, ValueError) as exc:
        return error(exc)
    print(describe(avatar), file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0


def run_matte(args: argparse.Namespace) -> int:
    """``avatar matte``: the bundle's person matte computed and written into it."""
    avatar = load_avatar(args.avatar)  # AvatarError (a ValueError): the CLI says what is wrong
    path = avatar.add_matte()
    print(f"wrote the person matte of the {avatar.kind} avatar {args.avatar!r}", file=sys.stderr)
    print(os.path.abspath(path))
    return 0


def run_synth(args: argparse.Namespace) -> int:
    if SAMPLE_RATE % args.fps:
        print(f"framegraph avatar synth: error: --fps {args.fps} must divide {SAMPLE_RATE} (25, 32, 40, 50...)",
              file=sys.stderr)
        return 2
    try:
        portrait = load_portrait(args.portrait, mouth_box=args.mouth_box, max_side=args.max_side)
    except (FileNotFoundError, PortraitError) as exc:
        print(f"framegraph avatar synth: error: {exc}", file=sys.stderr)
        return 2
    if portrait.face_box is not None:  # the region a photo avatar generates: the face's own resolution

        portrait.region_size = region_size(portrait.image.shape[:2], portrait.face_box)
    if not espeak_available():
        print(f"framegraph avatar synth: error: eSpeak NG is not installed; {INSTALL_HINT}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    renderer = PortraitRenderer(portrait)
    written = []
    for i in range(args.clips):
        try:
            job = prepare_clip(args.out, i, seconds=args.seconds, fps=args.fps, portrait=portrait, seed=args.seed,
                               renderer=renderer, preset=args.quality)
        except (EspeakNotFound, EspeakError) as exc:
            print(f"framegraph avatar synth: error: {exc}", file=sys.stderr)
            return 2
        report = run_with_progress(job.graph, job.sink, job.plan.n_frames, desc=f"clip {i + 1}/{args.clips}")
        if report["interrupted"]:
            print(f"interrupted: {job.video_path} is shorter than planned and has no ground truth; "
                  f"{len(written)} complete clips in {args.out}", file=sys.stderr)
            break
        job.write_ground_truth()
        written.append({"video": os.path.basename(job.video_path), "json": os.path.basename(job.json_path),
                        "frames": job.plan.n_frames, "clip": i})
    index = {"seed": args.seed, "fps": args.fps, "seconds": args.seconds, "portrait": portrait.to_json(),
             "clips": written}
    write_json(os.path.join(args.out, "index.json"), index, indent=1)
    print(f"wrote {len(written)} clips of {args.seconds:g} s ({portrait.width}x{portrait.height} @ {args.fps} fps) "
          f"to {args.out}; face region {portrait.region_size or '?'} px", file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0 if len(written) == args.clips else 130


def _train_error(message) -> int:
    print(f"framegraph avatar train: error: {message}", file=sys.stderr)
    return 2


def _prepare_video(args: argparse.Namespace):
    """``--video``: the clips folder, OUT/train/video_clips, or an exit code after a clear error."""
    if args.portrait:
        return _train_error("--portrait is for --synth; with --video the bundle's background is the median of "
                            "the video's first 2 s")
    if not os.path.exists(args.video):
        return _train_error(f"--video {args.video!r} does not exist")
    folder = os.path.join(args.out, "train", "video_clips")
    try:
        prep = prepare_video(args.video, folder, face_box=args.face_box, mouth_box=args.mouth_box,
                             segment_seconds=args.segment_seconds, region_size=args.region or 64,
                             max_side=args.max_side or 512, progress=True)
    except (FileNotFoundError, ValueError) as exc:  # MediaError / PortraitError are ValueErrors
        return _train_error(exc)
    d, p = prep.detection, prep.portrait
    how = ("given" if d["face_box_given"] else f"found in {d['kept']} of {d['sampled']} sampled frames"
           if d["sampled"] else "not searched")
    print(f"{'reusing' if prep.reused else 'prepared'} {len(prep.clips)} clips, {prep.seconds:g} s at {prep.fps} fps "
          f"({p['width']}x{p['height']}) in {prep.clips_dir}; face {p['face_box']} ({how}), mouth {p['mouth_box']}",
          file=sys.stderr)
    return prep


def run_train_video(args: argparse.Namespace) -> int:
    """``--video`` with ``--kind video``: the person's frames looped, the lower face generated."""
    if args.portrait:
        return _train_error("--portrait is for --synth; a video avatar is made of the video's own frames")
    if not os.path.exists(args.video):
        return _train_error(f"--video {args.video!r} does not exist")
    if args.max_region % 16 or args.max_region < 64:
        return _train_error(f"--max-region {args.max_region} must be a multiple of 16, at least 64")
    try:
        _, r = train_video_avatar(args.video, args.out, face_box=args.face_box, mouth_box=args.mouth_box,
                                  audio_from=args.audio_from, torch_threads=args.threads, resume=args.resume,
                                  log=lambda m: print(m, file=sys.stderr), steps=args.steps or 3000,
                                  batch=args.batch, lr=args.lr or 2e-3, holdout=args.holdout,
                                  max_region=args.max_region, loop_seconds=args.loop_seconds,
                                  max_side=args.max_side or 1280, vad=not args.no_vad, seed=args.seed,
                                  critic_weight=args.critic_weight, av_sync=args.av_sync, whisper=args.whisper,
                                  typed_sentences=args.typed_sentences,
                                  openness_frames=OPENNESS_FRAMES if args.openness_calibration else 0)
    except (FileNotFoundError, ValueError) as exc:  # MediaError / FaceError are ValueErrors
        return _train_error(exc)
    print(f"video avatar from {r['frames']} frames ({r['seconds']:g} s): {r['region_choice']}; trained in "
          f"{r['timings']['total_s']:.0f} s", file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0


def clips_region_size(clips: str) -> int | None:
    """The face region side in px that the clips' portrait block names. It is read from the first clip JSON.

    ``avatar synth`` writes the photo's face size there. None when it names none."""
    for f in sorted(Path(clips).glob("clip_*.json")):
        try:
            size = json.loads(f.read_text())["portrait"].get("region_size")
        except (OSError, ValueError, KeyError, AttributeError):
            return None
        return int(size) if size else None
    return None


def run_train(args: argparse.Namespace) -> int:
    if args.kind and not args.video:
        return _train_error("--kind goes with --video (--clips / --synth train a portrait avatar)")
    if args.video and (args.kind or "video") == "video":
        return run_train_video(args)
    if args.region is not None and args.region % 16:
        return _train_error(f"--region {args.region} must be a multiple of 16")
    if not args.video and (args.face_box or args.mouth_box):
        return _train_error("--face-box / --mouth-box go with --video (for --synth portraits use "
                            "`framegraph avatar synth --mouth-box`)")
    clips, portrait, extra = args.clips, None, {}
    if clips and not (os.path.isdir(clips) and any(Path(clips).glob("clip_*.mp4"))):
        return _train_error(f"--clips {clips!r}: " + ("no clip_*.mp4 in it" if os.path.isdir(clips) else
                                                      "no such folder") +
                            f"; make clips with `framegraph avatar synth --out {clips}` or train on a video "
                            f"with --video FILE")
    if args.video:
        prep = _prepare_video(args)
        if isinstance(prep, int):
            return prep
        clips, portrait, extra = prep.clips_dir, prep.portrait_path, {"fps": prep.fps}
    if args.synth:
        clips = os.path.join(args.out, "train", "clips")
        have = len([f for f in os.listdir(clips) if f.endswith(".json") and f.startswith("clip_")]) \
            if os.path.isdir(clips) else 0
        if have < args.synth:
            ns = argparse.Namespace(out=clips, clips=args.synth, seconds=args.synth_seconds, fps=25,
                                    portrait=args.portrait, mouth_box=None, max_side=512, seed=args.synth_seed,
                                    quality="offline")
            rc = run_synth(ns)
            if rc:
                return rc
    region = args.region or clips_region_size(clips) or 64
    if args.region is None:
        print(f"face region {region} px ({'the size the clips name for the face' if region != 64 else 'default'}; "
              f"--region sets it)", file=sys.stderr)
    dit = {k: v for k, v in (("width", args.dit_width), ("depth", args.dit_depth), ("heads", args.dit_heads),
                                           ("patch_size", args.dit_patch))
           if v is not None}
    try:
        res = train_avatar(clips, args.out, device=args.device, resume=args.resume, torch_threads=args.threads,
                           vae_steps=args.vae_steps, flow_steps=args.steps or 1000, distill_steps=args.distill_steps,
                           rollout_steps=args.rollout_steps, batch=args.batch, window=args.window, lr=args.lr or 1e-3,
                           region_size=region, vae_preset=args.vae_preset, preset=args.preset,
                           dit_overrides=dit, sample_steps=args.sample_steps, vad=not args.no_vad,
                           max_clips=args.max_clips, seed=args.seed, portrait=portrait,
                           vae_reference=args.vae_reference, vae_warp=args.vae_warp,
                           vae_redraw=args.vae_redraw, audio_steps=args.audio_steps,
                           audio_from=args.audio_from, **extra)
    except (FileNotFoundError, ValueError) as exc:
        return _train_error(exc)
    r = res.report
    print(f"trained on {r['clips']} clips ({r['frames']} frames) in {r['timings']['total_s']:.0f} s; "
          f"losses {json.dumps(r['losses'])}", file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0


def run_refine(args: argparse.Namespace) -> int:
    if args.latent_noise < 0:
        print(f"framegraph avatar refine: error: --latent-noise {args.latent_noise} must be >= 0 (a noise std)",
              file=sys.stderr)
        return 2
    try:
        report = refine_decoder(args.avatar, args.clips, args.out, steps=args.steps, batch=args.batch,
                                clip_frames=args.window, lr=args.lr, warp=args.warp,
                                latent_noise=args.latent_noise, device=args.device,
                                torch_threads=args.threads, max_clips=args.max_clips, resume=args.resume)
    except (AvatarError, FileNotFoundError, MediaError, ValueError) as exc:
        print(f"framegraph avatar refine: error: {exc}", file=sys.stderr)
        return 2
    before, after = report["heldout_initial"], report["heldout_final"]
    if before and after:
        print(f"held-out clips: PSNR {before['psnr_db']:.2f} -> {after['psnr_db']:.2f} dB, SSIM {before['ssim']:.3f} "
              f"-> {after['ssim']:.3f} ({report['steps']} steps, {report['train_seconds']:.0f} s)", file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0


def run_eval(args: argparse.Namespace) -> int:
    for what, path in (("--clip", args.clip), ("--truth", args.truth)):
        if path is not None and not os.path.isfile(path):
            print(f"framegraph avatar eval: error: {what} {path!r} does not exist", file=sys.stderr)
            return 2
    try:
        if args.avatar is None:
            return _write_metrics(args.out, track_clip(args.clip), ("faces_found", "openness_vs_loudness_corr"))
        avatar = load_avatar(args.avatar)
        if avatar.kind == "video":
            return _eval_video_avatar(avatar, args)
        if avatar.kind == "musetalk":
            return _eval_musetalk(avatar, args)
        if args.start_s is not None or args.end_s is not None or args.av_offset is not None:
            raise ValueError("--start-s / --end-s / --av-offset go with a video avatar (avatar train --video); "
                             f"{args.avatar!r} is a portrait avatar")
        if args.dit:
            if not os.path.isfile(os.path.join(args.dit, "config.json")):
                raise ValueError(f"--dit {args.dit!r} holds no denoiser (config.json)")
            avatar.dit = AvatarDiT.from_pretrained(args.dit, low_cpu_mem_usage=False).eval()
        settings = RunSettings(runtime=args.runtime, steps=args.steps, onnx_dir=args.onnx)
        metrics = evaluate_avatar(avatar, args.clip, args.truth, settings, out_video=args.video, progress=True)
    except (AvatarError, MediaError, ValueError, json.JSONDecodeError) as exc:
        print(f"framegraph avatar eval: error: {exc}", file=sys.stderr)
        return 2
    metrics["avatar"] = os.path.abspath(args.avatar)
    if args.dit:
        metrics["dit"] = os.path.abspath(args.dit)
    metrics["landmark_openness_corr"] = metrics["real"]["landmark_openness_corr"]
    return _write_metrics(args.out, metrics, ("openness_corr", "estimator_corr", "identity_ssim",
                                              "landmark_openness_corr"))


def _eval_video_avatar(avatar, args: argparse.Namespace) -> int:
    """``avatar eval`` of a video avatar.

    The base is the clip's real frames from ``--start-s``. The default start is where its source video's held-out part
    begins. That part was kept out of training. The lower face is redrawn from the clip's audio. It is measured with the
    face landmarks against the real frames, by :func:`evaluate_video_avatar`."""
    portrait_only = [name for name, given in (("--truth", args.truth), ("--steps", args.steps), ("--dit", args.dit),
                                              ("--runtime", args.runtime != "torch"), ("--onnx", args.onnx)) if given]
    if portrait_only:
        raise ValueError(f"{', '.join(portrait_only)}: for portrait avatars; {args.avatar!r} is a video avatar "
                         f"(give --clip, and --start-s / --end-s to choose the stretch measured)")
    start = args.start_s if args.start_s is not None else avatar.heldout_start_s
    metrics = evaluate_video_avatar(avatar, args.clip, start_s=start, end_s=args.end_s, out_video=args.video,
                                    av_offset_frames=args.av_offset)
    metrics["avatar"] = os.path.abspath(args.avatar)
    if args.video:
        metrics["video"] = os.path.abspath(args.video)
    try:  # typed text, as a user who types meets the avatar
        metrics["typed_text"] = evaluate_typed_text(avatar)
    except EspeakNotFound as exc:
        metrics["typed_text"] = {"skipped": str(exc)}
    try:
        add_evaluation(args.avatar, metrics)
    except OSError as exc:  # a read-only bundle: the JSON still gets written
        print(f"framegraph avatar eval: warning: could not add the figures to the bundle's "
              f"{PROVENANCE} ({exc})", file=sys.stderr)
    return _write_metrics(args.out, metrics, ("landmark_openness_corr", "landmark_openness_swing",
                                              "outside_mouth_psnr_db", "mouth_sharpness_ratio", "lips_sharpness_ratio",
                                              "jaw_edge_ratio"))


def _eval_musetalk(avatar, args: argparse.Namespace) -> int:
    """``avatar eval`` of a MuseTalk avatar: the clip's real frames redrawn from its sound, measured with the face
    landmarks against themselves (:func:`evaluate_musetalk`). The figures go into the bundle's provenance."""
    from framegraph.models.avatar.eval.musetalk import evaluate_musetalk

    other = [name for name, given in (("--truth", args.truth), ("--steps", args.steps), ("--dit", args.dit),
                                      ("--runtime", args.runtime != "torch"), ("--onnx", args.onnx)) if given]
    if other:
        raise ValueError(f"{', '.join(other)}: not for a MuseTalk avatar; {args.avatar!r} is one (give --clip, and "
                         f"--start-s / --end-s to choose the stretch measured)")
    metrics = evaluate_musetalk(avatar, args.clip, start_s=args.start_s or 0.0, end_s=args.end_s,
                                out_video=args.video, av_offset_frames=args.av_offset or 0)
    metrics["avatar"] = os.path.abspath(args.avatar)
    if args.video:
        metrics["video"] = os.path.abspath(args.video)
    try:
        add_evaluation(args.avatar, metrics)
    except OSError as exc:  # a read-only bundle: the JSON still gets written
        print(f"framegraph avatar eval: warning: could not add the figures to the bundle's {PROVENANCE} ({exc})",
              file=sys.stderr)
    return _write_metrics(args.out, metrics, ("landmark_openness_corr", "landmark_openness_swing",
                                              "outside_mouth_psnr_db", "mouth_sharpness_ratio",
                                              "lips_sharpness_ratio"))


def _write_metrics(out: str, metrics: dict, headline: tuple[str, ...]) -> int:
    """Write ``metrics`` as JSON to ``out``, whole or not at all. Print the headline numbers and the path."""
    write_json(out, metrics, indent=1)
    print(json.dumps({k: metrics[k] for k in headline}), file=sys.stderr)
    print(os.path.abspath(out))
    return 0
