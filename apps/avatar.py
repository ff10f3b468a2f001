"""``framegraph avatar``: the talking avatar's tools.

    framegraph avatar synth --out data/synth --clips 100 --seconds 8 [--portrait me.jpg] [--seed 0]

``synth`` writes synthetic talking clips of a portrait (MP4: H.264 + AAC 16 kHz) with a JSON of
ground truth per frame (jaw open, lip width / round, teeth, blink, head pose offsets, state) and the
eSpeak NG phoneme events, plus ``index.json`` listing the clips. Needs the system package
``espeak-ng``.

    framegraph avatar train --clips DIR --out AVATAR_DIR [--steps N] [--device cpu] [--resume/--no-resume]
    framegraph avatar train --synth 24 --out AVATAR_DIR      # first makes 24 clips into AVATAR_DIR/train/clips
    framegraph avatar train --video me.mp4 --out AVATAR_DIR [--holdout 0.2] [--steps 3000] [--critic-weight 0.1]
                            [--kind portrait]

``train`` trains an avatar bundle. With ``--video`` (kind ``video``, the default) it is made of the person's
own video: the video is checked (one face big enough, speech, at least 10 s), cut into 25 fps clips with
16 kHz audio in ``AVATAR_DIR/train/video_clips``, the face landmarks are found on every frame (MediaPipe's
face mesh), a small UNet learns to redraw the lower face of those frames for a mouth shape, and a head on
the audio encoder learns the shape from the speech; the avatar plays the first ``--loop-seconds`` of the
video back and forth and redraws only the mouth region (see ``models/avatar/video_train.py``).
``--kind portrait`` (and ``--clips`` / ``--synth``) trains the still-portrait bundle (VAE, latents + audio
features, flow matching, few-step distillation, rollout training; checkpoints and resume in
``AVATAR_DIR/train``); see ``models/avatar/train.py`` and ``models/avatar/video.py``.

    framegraph avatar refine --avatar DIR --clips DIR --out NEW_DIR [--steps 400] [--warp/--no-warp]

``refine`` trains a bundle's VAE decoder further (encoder, denoiser and audio encoder unchanged, so the
avatar talks as before) and, by default, gives it the reference warp: the decoder hands back the
portrait's own pixels, moved with the head, wherever the face did not change. Writes a new bundle; the
source is never overwritten. See ``models/avatar/refine.py``.

    framegraph avatar eval --avatar DIR --clip FILE.mp4 [--truth FILE.json] --out FILE.json [--video OUT.mp4]
    framegraph avatar eval --clip FILE.mp4 --out FILE.json

``eval`` of a video avatar redraws the lower face of the clip's real frames from its audio (from where the part
of the source video kept out of training begins, or ``--start-s``) and measures it against those frames with the
face landmarks (``models/avatar/video_eval.py``), and adds the figures to the bundle's PROVENANCE.md (which
``train --video`` starts: the source video and its SHA-256, how it was trained). ``eval`` of a portrait avatar
generates from the clip's audio and measures mouth-openness correlation with the ground truth,
closed lips in silence and identity SSIM outside the mouth (see ``models/avatar/evaluate.py``), and with
face landmarks against the clip's real frames (openness correlation, the face outside the mouth, lips
closed in silence: ``models/avatar/evaluate_real.py``). Without ``--avatar`` it measures the clip alone:
how well the landmarks track the face and whether its mouth follows its sound.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .argtypes import non_negative_float, positive_float, positive_int


def _box(text: str):
    from framegraph.models.synth.portrait import PortraitError, parse_box

    try:
        return parse_box(text)
    except PortraitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="avatar_command", required=True, metavar="WHAT")
    s = sub.add_parser("synth", help="write synthetic talking clips (MP4 + JSON ground truth) of a portrait",
                       description="Animate a portrait with eSpeak NG speech in several voices, rates and "
                                   "pitches: visemes from the phoneme events, blinks, head motion, idle and "
                                   "listening stretches. Writes clip_NNNNN.mp4 + clip_NNNNN.json per clip and "
                                   "index.json. Deterministic for a given --seed.")
    s.add_argument("--out", required=True, help="output folder")
    s.add_argument("--clips", type=positive_int, default=10, help="number of clips (default 10)")
    s.add_argument("--seconds", type=positive_float, default=8.0, help="length of each clip (default 8)")
    s.add_argument("--fps", type=positive_int, default=25, help="frames per second; must divide 16000 (default 25)")
    s.add_argument("--portrait", help="image file of a frontal face (default: the shipped astronaut portrait)")
    s.add_argument("--mouth-box", type=_box, metavar="X,Y,W,H",
                   help="mouth box in the portrait's pixels (default: the lips found by the face landmarks)")
    s.add_argument("--max-side", type=positive_int, default=512,
                   help="scale larger portraits down to this longer side (default 512)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0); clip i uses (seed, i)")
    s.add_argument("--quality", choices=["offline", "master"], default="offline",
                   help="H.264 setting of the clips: offline (crf 20, default) or master (crf 10: ~2.5x the bytes, "
                        "closer to the portrait)")
    s.set_defaults(avatar_func=run_synth)

    t = sub.add_parser("train", help="train an avatar bundle from talking clips, synthetic ones (--synth) or a "
                                     "person's own video (--video)",
                       description="Train the VAE on the face region, encode the clips once, train the DiT with "
                                   "flow matching, distil it to few steps and train it on its own rollouts. "
                                   "Writes an avatar bundle folder (load with `framegraph render --avatar`). "
                                   "With --video (at least 10 s of one person talking to the camera, with sound; "
                                   "30 s or more is better): a video avatar that plays the person's own frames "
                                   "and redraws only the lower face for the speech (--kind portrait: the still "
                                   "portrait model trained on the video's clips instead).")
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--clips", help="folder of clip_*.mp4 + clip_*.json (framegraph avatar synth output)")
    src.add_argument("--synth", type=positive_int, metavar="N",
                     help="first make N synthetic clips (into OUT/train/clips) and train on them")
    src.add_argument("--video", metavar="FILE",
                     help="a talking video of the person (MP4, MOV, MKV, WebM... with its audio track, at least "
                          "10 s; a few minutes is better): cut into clips in OUT/train/video_clips and trained on")
    t.add_argument("--kind", choices=["video", "portrait"],
                   help="with --video: 'video' (default) keeps the person's own frames, looped back and forth, and "
                        "redraws only the lower face for the speech (sharp, real head motion and blinks); "
                        "'portrait' trains the still-portrait DiT avatar on the video's clips")
    t.add_argument("--holdout", type=float, default=0.0,
                   help="with --kind video: share of the video's end used for no training, kept for `avatar eval` "
                        "(0; e.g. 0.2)")
    t.add_argument("--max-region", type=positive_int, default=256,
                   help="with --kind video: the generated region's side cap in px (256: real time on a 2-core CPU; "
                        "the region is the face's width, rounded up to a multiple of 16, drawn at most this size)")
    t.add_argument("--critic-weight", type=non_negative_float, default=0.1,
                   help="with --kind video: weight of the texture critic that sharpens the lips (0.1; 0: none — "
                        "up to a quarter less training time (a 300-px face: 35 -> 27 min), softer lips); dropped by "
                        "itself if it makes the training's L1 loss climb")
    t.add_argument("--av-sync", action=argparse.BooleanOptionalAction, default=True,
                   help="with --kind video: measure how late the video's sound is against the mouth (up to 400 ms) "
                        "and train on it aligned (default on)")
    t.add_argument("--loop-seconds", type=positive_float, default=10.0,
                   help="with --kind video: seconds of the video kept as the loop the avatar plays (10)")
    t.add_argument("--synth-seconds", type=positive_float, default=6.0, help="with --synth: seconds per clip (6)")
    t.add_argument("--synth-seed", type=int, default=0, help="with --synth: seed (0)")
    t.add_argument("--portrait", help="with --synth: portrait image (default: the astronaut)")
    t.add_argument("--face-box", type=_box, metavar="X,Y,W,H",
                   help="with --video: the face box in px of the video as it plays (default: found with the face "
                        "landmarks on frames sampled over the video)")
    t.add_argument("--mouth-box", type=_box, metavar="X,Y,W,H",
                   help="with --video: the mouth box (lips at rest) in px of the video (default: placed from the "
                        "face box)")
    t.add_argument("--segment-seconds", type=positive_float, default=10.0,
                   help="with --video: length of each training clip cut from it (10)")
    t.add_argument("--max-side", type=positive_int,
                   help="with --video: scale the video down to this longer side (kind video: 1280, the avatar plays "
                        "at the video's own resolution up to that; kind portrait: 512, kept larger when the face "
                        "would be smaller than --region)")
    t.add_argument("--out", required=True, help="the avatar bundle folder to write")
    t.add_argument("--steps", type=positive_int,
                   help="training steps: of the mouth generator (kind video, 3000) or the DiT's flow matching (1000)")
    t.add_argument("--vae-steps", type=positive_int, default=300, help="VAE training steps (300)")
    t.add_argument("--distill-steps", type=int, default=150, help="few-step distillation steps (150; 0: none)")
    t.add_argument("--rollout-steps", type=int, default=150, help="rollout (anti-drift) steps (150; 0: none)")
    t.add_argument("--batch", type=positive_int, default=8, help="windows per DiT step / regions per generator step (8)")
    t.add_argument("--window", type=positive_int, default=8, help="frames per training window (8)")
    t.add_argument("--lr", type=positive_float, help="peak learning rate (DiT 1e-3, kind video 2e-3)")
    t.add_argument("--region", type=positive_int, default=None,
                   help="face region side in px, multiple of 16 (default: the size the clips' portrait names — "
                        "`avatar synth` sizes it to the photo's face — else 64)")
    t.add_argument("--vae-preset", choices=["tiny", "small"], default="tiny", help="VAE size (tiny)")
    t.add_argument("--preset", choices=["tiny", "small", "base"], default="tiny", help="DiT size (tiny)")
    t.add_argument("--dit-width", type=positive_int, help="override the preset's DiT width")
    t.add_argument("--dit-depth", type=positive_int, help="override the preset's DiT depth")
    t.add_argument("--dit-heads", type=positive_int, help="override the preset's DiT heads")
    t.add_argument("--dit-patch", type=int, choices=[1, 2, 4], help="DiT patch size on the latent (default 1)")
    t.add_argument("--sample-steps", type=positive_int, default=2, help="sampler steps of the bundle (2)")
    t.add_argument("--vae-reference", action=argparse.BooleanOptionalAction, default=True,
                   help="the VAE decoder also reads the portrait's face region, for sharp identity (default on)")
    t.add_argument("--vae-warp", action=argparse.BooleanOptionalAction, default=True,
                   help="with --vae-reference: the decoder may also copy the portrait's pixels, moved with the head, "
                        "where the face did not change (default on)")
    t.add_argument("--vae-redraw", action=argparse.BooleanOptionalAction, default=True,
                   help="the VAE learns synthetic clips as redrawn from their ground truth, without the video "
                        "codec's loss (default on; clips that cannot be redrawn, e.g. --video, use the video)")
    t.add_argument("--audio-steps", type=int, default=400,
                   help="steps teaching the audio encoder the clips' ground-truth mouth movement (400; 0: none)")
    t.add_argument("--audio-from", metavar="DIR",
                   help="take a trained audio encoder from this avatar (or encoder) folder instead; default for "
                        "clips without mouth ground truth (--video): the shipped astronaut's")
    t.add_argument("--no-vad", action="store_true", help="no Silero VAD (state idle / listening only)")
    t.add_argument("--max-clips", type=positive_int, help="use at most this many clips")
    t.add_argument("--device", default="cpu", help="cpu or cuda (cpu)")
    t.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads while training")
    t.add_argument("--seed", type=int, default=0, help="seed (0)")
    t.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue from OUT/train checkpoints (default on)")
    t.set_defaults(avatar_func=run_train)

    r = sub.add_parser("refine", help="train a bundle's VAE decoder further (sharper identity), keeping everything "
                                      "else", description="Train only the decoder of the avatar's VAE on talking "
                       "clips of the same portrait: the encoder, the latent statistics, the denoiser and the audio "
                       "encoder stay as they are, so the new bundle moves its mouth exactly as the old one. With "
                       "--warp (default) the decoder first gets the reference warp: the portrait is registered onto "
                       "the face the decoder drew and blended in per pixel, so it can copy the portrait's own pixels "
                       "(moved with the head) where the face did not change. Writes a new bundle to --out "
                       "(checkpoints in OUT/train/vae; run again with more --steps to continue); the source bundle "
                       "is not modified.")
    r.add_argument("--avatar", required=True, help="the avatar bundle to refine (read only)")
    r.add_argument("--clips", required=True,
                   help="folder of clip_*.mp4 + clip_*.json of the same portrait (framegraph avatar synth output, "
                        "or OUT/train/video_clips of an `avatar train --video` run)")
    r.add_argument("--out", required=True, help="the new bundle folder to write")
    r.add_argument("--steps", type=positive_int, default=400, help="decoder training steps (400)")
    r.add_argument("--batch", type=positive_int, default=4, help="windows per step (4)")
    r.add_argument("--window", type=positive_int, default=3, help="frames per window (3)")
    r.add_argument("--lr", type=positive_float, default=1e-3, help="peak learning rate (1e-3)")
    r.add_argument("--warp", action=argparse.BooleanOptionalAction, default=True,
                   help="add the reference warp to the decoder first (default on; needs a VAE trained with "
                        "--vae-reference)")
    r.add_argument("--latent-noise", type=float, default=0.5,
                   help="largest std of the noise put on the latents while training (0.5; 0: none), so the decoder "
                        "decodes the denoiser's imperfect latents as cleanly as the encoder's")
    r.add_argument("--max-clips", type=positive_int, help="use at most this many clips")
    r.add_argument("--device", default="cpu", help="cpu or cuda (cpu)")
    r.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads while training")
    r.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue from OUT/train/vae's checkpoint (default on)")
    r.set_defaults(avatar_func=run_refine)

    e = sub.add_parser("eval", help="generate from a clip's audio and measure it against the clip (and its ground "
                                    "truth); without --avatar, how well the face landmarks track the clip",
                       description="With a synthetic clip's JSON (--truth): mouth-openness correlation with the "
                                   "ground truth (inner-mouth dark pixels per mouth width), closed lips in silence, "
                                   "identity SSIM outside the mouth. On every clip (block 'real'): face landmarks "
                                   "(MediaPipe face mesh) on the generated and the real frames — mouth-openness "
                                   "correlation, PSNR / SSIM of the face outside the mouth, mouth sharpness, lips "
                                   "closed where the audio is silent. Without --avatar: the landmarks on the clip "
                                   "alone (faces found, openness vs the clip's loudness, blinks). A video avatar's "
                                   "figures are also added to its bundle's PROVENANCE.md.")
    e.add_argument("--avatar", help="avatar bundle folder (leave out to measure the clip alone)")
    e.add_argument("--clip", required=True, help="a talking clip (MP4 with audio) not used in training")
    e.add_argument("--truth", help="its ground-truth JSON (synthetic clips; a person's own clip has none)")
    e.add_argument("--out", required=True, help="where to write the metrics (JSON)")
    e.add_argument("--video", help="also keep the generated MP4 here")
    e.add_argument("--steps", type=positive_int, help="sampler steps (default: the bundle's)")
    e.add_argument("--dit", metavar="DIR",
                   help="evaluate this denoiser instead of the bundle's (e.g. AVATAR/train/teacher, the many-step "
                        "model before distillation, with --steps 16)")
    e.add_argument("--backend", choices=["torch", "onnx", "onnx-int8"], default="torch",
                   help="where the models compute: torch, or onnx / onnx-int8 (ONNX Runtime on the CPU, from "
                        "`framegraph export [--int8]`)")
    e.add_argument("--onnx", default=None, help="(with --backend onnx / onnx-int8) the export folder (default: "
                                                "AVATAR/onnx)")
    e.add_argument("--start-s", type=float, help="(video avatar) where the measured stretch of the clip starts, "
                                                 "in s (default: where the part kept out of training begins)")
    e.add_argument("--end-s", type=float, help="(video avatar) where it ends (default: the clip's end)")
    e.add_argument("--av-offset", type=int, metavar="FRAMES",
                   help="(video avatar) frames by which the clip's sound comes after its picture, moved earlier "
                        "before measuring (default: what `avatar train --video` measured on the bundle's source "
                        "video; 0 for a clip recorded otherwise)")
    e.set_defaults(avatar_func=run_eval)


def run(args: argparse.Namespace) -> int:
    return args.avatar_func(args)


def run_synth(args: argparse.Namespace) -> int:
    from framegraph.models.synth import (
        EspeakError,
        EspeakNotFound,
        PortraitError,
        PortraitRenderer,
        espeak_available,
        load_portrait,
        prepare_clip,
    )
    from framegraph.models.synth.espeak import INSTALL_HINT
    from framegraph.stream.progress import run_with_progress

    if 16_000 % args.fps:
        print(f"framegraph avatar synth: error: --fps {args.fps} must divide 16000 (25, 32, 40, 50...)",
              file=sys.stderr)
        return 2
    try:
        portrait = load_portrait(args.portrait, mouth_box=args.mouth_box, max_side=args.max_side)
    except (FileNotFoundError, PortraitError) as exc:
        print(f"framegraph avatar synth: error: {exc}", file=sys.stderr)
        return 2
    if portrait.face_box is not None:  # the region a photo avatar generates: the face's own resolution
        from framegraph.models.vae import region_size

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
    with open(os.path.join(args.out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    print(f"wrote {len(written)} clips of {args.seconds:g} s ({portrait.width}x{portrait.height} @ {args.fps} fps) "
          f"to {args.out}; face region {portrait.region_size or '?'} px", file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0 if len(written) == args.clips else 130


def _train_error(message) -> int:
    print(f"framegraph avatar train: error: {message}", file=sys.stderr)
    return 2


def _prepare_video(args: argparse.Namespace):
    """``--video``: the clips folder (OUT/train/video_clips), or an exit code after a clear error."""
    from framegraph.models.avatar.clips.prepare import prepare_video

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
    from framegraph.models.avatar.video.train import train_video_avatar

    if args.portrait:
        return _train_error("--portrait is for --synth; a video avatar is made of the video's own frames")
    if not os.path.exists(args.video):
        return _train_error(f"--video {args.video!r} does not exist")
    if args.max_region % 16 or args.max_region < 64:
        return _train_error(f"--max-region {args.max_region} must be a multiple of 16, at least 64")
    try:
        _, r = train_video_avatar(args.video, args.out, face_box=args.face_box, mouth_box=args.mouth_box,
                                  audio_from=args.audio_from, torch_threads=args.threads,
                                  log=lambda m: print(m, file=sys.stderr), steps=args.steps or 3000,
                                  batch=args.batch, lr=args.lr or 2e-3, holdout=args.holdout,
                                  max_region=args.max_region, loop_seconds=args.loop_seconds,
                                  max_side=args.max_side or 1280, vad=not args.no_vad, seed=args.seed,
                                  critic_weight=args.critic_weight, av_sync=args.av_sync)
    except (FileNotFoundError, ValueError) as exc:  # MediaError / FaceError are ValueErrors
        return _train_error(exc)
    print(f"video avatar from {r['frames']} frames ({r['seconds']:g} s): {r['region_choice']}; trained in "
          f"{r['timings']['total_s']:.0f} s", file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0


def clips_region_size(clips: str) -> int | None:
    """The face region side (px) the clips' portrait block names (``avatar synth`` writes the photo's face
    size there), from the first clip JSON; None when it names none."""
    for f in sorted(Path(clips).glob("clip_*.json")):
        try:
            size = json.loads(f.read_text())["portrait"].get("region_size")
        except (OSError, ValueError, KeyError, AttributeError):
            return None
        return int(size) if size else None
    return None


def run_train(args: argparse.Namespace) -> int:
    from framegraph.models.avatar.portrait.train import train_avatar

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
    from framegraph.models.avatar import AvatarError
    from framegraph.models.avatar.portrait.refine import refine_decoder
    from framegraph.stream.media import MediaError

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
    from framegraph.models.avatar import AvatarError, load_avatar
    from framegraph.models.avatar.eval.synthetic import evaluate_avatar
    from framegraph.stream.media import MediaError

    for what, path in (("--clip", args.clip), ("--truth", args.truth)):
        if path is not None and not os.path.isfile(path):
            print(f"framegraph avatar eval: error: {what} {path!r} does not exist", file=sys.stderr)
            return 2
    try:
        if args.avatar is None:
            from framegraph.models.avatar.eval.real import track_clip

            return _write_metrics(args.out, track_clip(args.clip), ("faces_found", "openness_vs_loudness_corr"))
        avatar = load_avatar(args.avatar)
        if avatar.kind == "video":
            return _eval_video_avatar(avatar, args)
        if args.start_s is not None or args.end_s is not None or args.av_offset is not None:
            raise ValueError("--start-s / --end-s / --av-offset go with a video avatar (avatar train --video); "
                             f"{args.avatar!r} is a portrait avatar")
        if args.dit:
            from framegraph.models.dit import AvatarDiT

            if not os.path.isfile(os.path.join(args.dit, "config.json")):
                raise ValueError(f"--dit {args.dit!r} holds no denoiser (config.json)")
            avatar.dit = AvatarDiT.from_pretrained(args.dit, low_cpu_mem_usage=False).eval()
        metrics = evaluate_avatar(avatar, args.clip, args.truth, out_video=args.video, steps=args.steps,
                                  progress=True, runtime=args.backend, onnx_dir=args.onnx)
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
    """``avatar eval`` of a video avatar: the real frames of the clip from ``--start-s`` (default: the part of its
    source video kept out of training) as the base, the lower face redrawn from the clip's audio, measured with
    the face landmarks against the real frames (:func:`evaluate_video_avatar`)."""
    from framegraph.models.avatar.eval.video import evaluate_video_avatar
    from framegraph.models.avatar.video.provenance import PROVENANCE, add_evaluation

    portrait_only = [name for name, given in (("--truth", args.truth), ("--steps", args.steps), ("--dit", args.dit),
                                              ("--backend", args.backend != "torch"), ("--onnx", args.onnx)) if given]
    if portrait_only:
        raise ValueError(f"{', '.join(portrait_only)}: for portrait avatars; {args.avatar!r} is a video avatar "
                         f"(give --clip, and --start-s / --end-s to choose the stretch measured)")
    start = args.start_s if args.start_s is not None else avatar.heldout_start_s
    metrics = evaluate_video_avatar(avatar, args.clip, start_s=start, end_s=args.end_s, out_video=args.video,
                                    av_offset_frames=args.av_offset)
    metrics["avatar"] = os.path.abspath(args.avatar)
    if args.video:
        metrics["video"] = os.path.abspath(args.video)
    try:
        add_evaluation(args.avatar, metrics)
    except OSError as exc:  # a read-only bundle: the JSON still gets written
        print(f"framegraph avatar eval: warning: could not add the figures to the bundle's "
              f"{PROVENANCE} ({exc})", file=sys.stderr)
    return _write_metrics(args.out, metrics, ("landmark_openness_corr", "landmark_openness_swing",
                                              "outside_mouth_psnr_db", "mouth_sharpness_ratio", "lips_sharpness_ratio",
                                              "jaw_edge_ratio"))


def _write_metrics(out: str, metrics: dict, headline: tuple[str, ...]) -> int:
    """Write ``metrics`` as JSON to ``out`` (whole or not at all), print the headline numbers and the path."""
    tmp = out + ".partial"
    with open(tmp, "w") as f:
        json.dump(metrics, f, indent=1)
    os.replace(tmp, out)
    print(json.dumps({k: metrics[k] for k in headline}), file=sys.stderr)
    print(os.path.abspath(out))
    return 0
