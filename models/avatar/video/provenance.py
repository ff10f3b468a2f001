"""A video avatar bundle's ``PROVENANCE.md``: where the avatar came from and what was measured on it.

``avatar train --video`` writes it. It names the source video by name, size and SHA-256. It says how the
avatar was trained, and gives the training report's held-out figure. Each ``avatar eval`` adds a section. It
holds what that eval measured against the person's real frames. A user who shares a bundle shares this page
with it.
"""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

PROVENANCE = "PROVENANCE.md"

# (key in avatar eval's metrics, what it is, the target the figure is held to or "")
EVAL_ROWS = (
    ("landmark_openness_corr", "mouth-openness correlation, generated vs real (face landmarks)", "≥ 0.6"),
    ("landmark_openness_swing", "how wide the mouth swings: std of the generated openness / the real's", "≈ 1"),
    ("outside_mouth_psnr_db", "face outside the mouth region vs the real frames (dB)", "≥ 30"),
    ("mouth_sharpness_ratio", "sharpness (Laplacian variance) of the lower face / the real frames'", ""),
    ("lips_sharpness_ratio", "sharpness of the lips alone / the real lips'", ""),
    ("jaw_edge_ratio", "the jaw line's edge (across the jaw / chin contour) / the real frames'", "≥ 0.8"),
)


def sha256_of(path, chunk: int = 1 << 20) -> str:
    """The SHA-256 (hex) of the file at ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def write_training_provenance(root, report: dict) -> Path:
    """``root/PROVENANCE.md`` for a bundle just trained by ``train_video_avatar``, from its ``report``."""
    src, cfg, held = report["source"], report["config"], report.get("heldout")
    video = src["video"]
    critic = report.get("critic") or {}
    if not critic.get("weight"):
        critic_line = "no texture critic"
    elif critic.get("dropped_at") is None:
        critic_line = f"the lips' texture critic at weight {critic['weight']:g} from step {critic['start']}"
    else:
        critic_line = (f"the lips' texture critic from step {critic['start']}, dropped at step "
                       f"{critic['dropped_at']} (the L1 loss climbed; the generator went back to its last healthy "
                       "weights)")
    lines = [
        "# Video avatar — provenance", "",
        f"Made by framegraph's `avatar train --video` on {_now()}.", "",
        "## Source", "",
        f"- video: `{os.path.basename(video)}` ({src['seconds']:g} s, {src['frames']} frames at {src['fps']:g} fps, "
        f"{src['width']}×{src['height']}; {os.path.getsize(video):,} bytes, SHA-256 `{sha256_of(video)}`)",
        f"- this bundle holds {report['loop_frames']} of its frames (`loop.mp4`), one lower-face picture "
        "(`regions.npz`: the reference) and models trained on the video: the person in it and its licence "
        "decide who may receive the bundle.", "",
        "## Training", "",
        f"- {report['frames']} frames; trained on the first {report['train_frames']}"
        + (f", the rest (from {held['start_s']:g} s) kept out of training for evaluation" if held else "")
        + f"; face {report['face_width_px']:g} px wide: {report['region_choice']}",
        f"- mouth generator: {cfg['steps']} steps, batch {cfg['batch']}, {critic_line}; "
        f"seed {cfg['seed']}; {report['timings']['total_s']:.0f} s in all on {report['threads']} CPU threads "
        f"(torch {report['torch']})",
    ]
    sync = report.get("av_offset")
    if sync is not None and sync["frames"]:
        lines.append(f"- the video's sound came {sync['frames']} frames ({sync['seconds']:g} s) after its picture "
                     "(measured from the mouth on the training frames); the shape head learnt on it so aligned")
    elif sync is not None:
        why = f": {sync['reason']}" if sync.get("reason") else ""
        lines.append("- the video's sound was left in step with its picture (from the mouth on the training "
                     f"frames{why})")
    feats = report.get("shape_head", {}).get("features")
    if feats:
        scores = ", ".join(f"{k} {v:.3f}" for k, v in feats["cv_openness_corr"].items())
        heard = {"encoder": "the audio encoder's features alone",
                 "encoder+whisper16": "the audio encoder's features and the first 16 principal components of "
                                      "Whisper's encoder's",
                 "encoder+whisper": "the audio encoder's features and all of Whisper's encoder's"}[feats["chosen"]]
        lines.append(f"- the shape head hears {heard} (the best cross-validated openness fit on the training frames: "
                     f"{scores})" + (f"; Whisper was not used: {feats['whisper']}" if feats.get("whisper") else ""))
    if held and held.get("shape_openness_corr") is not None:
        lines.append(f"- held out: the shape head's openness from the audio vs the measured openness, correlation "
                     f"{held['shape_openness_corr']:.3f} ({held['frames']} frames whose sound it never heard)")
    typed = report.get("shape_head", {}).get("typed", {})
    if typed.get("sentences"):
        check, person = typed.get("check") or {}, typed["person_speaking_openness"]
        lines.append(f"- typed text: the shape head also learnt {typed['sentences']} eSpeak NG sentences, their "
                     "shapes set from their phonemes on the person's scale"
                     + (f"; on {check['sentences']} others its openness follows their phonemes' jaw at "
                        f"{check['openness_vs_phoneme_jaw_corr']:.3f} and averages "
                        f"{check['speaking_openness']['mean']:+.2f} std while speaking (the person: "
                        f"{person['mean']:+.2f})" if check else ""))
    elif typed.get("skipped"):
        lines.append(f"- typed text: no eSpeak NG sentences learnt ({typed['skipped']})")
    calib = report.get("shape_head", {}).get("openness_calibration") or {}
    if calib.get("used"):
        lines.append(f"- openness calibrated: on {calib['frames']} loop frames redrawn for what the shape head asks "
                     f"from training frames' sound, the mouth opened {calib['drawn_mean']:.3f} on average where the "
                     f"person's did {calib['real_mean']:.3f} in those frames (landmark openness); the head now asks "
                     f"for {calib['offset']:+.2f} std of openness more")
    elif calib.get("why"):
        lines.append(f"- openness not calibrated ({calib['why']})")
    lines += ["", "## Measured (`framegraph avatar eval`)", "",
              "Each evaluation of this bundle adds a section here.", ""]
    path = Path(root) / PROVENANCE
    path.write_text("\n".join(lines))
    return path


def add_evaluation(root, metrics: dict) -> Path:
    """Add a section with ``avatar eval``'s ``metrics`` of a video avatar to ``root/PROVENANCE.md``.

    It starts the page if the bundle has none."""
    path = Path(root) / PROVENANCE
    if not path.exists():
        path.write_text("# Video avatar — provenance\n\n## Measured (`framegraph avatar eval`)\n\n")
    silence = metrics.get("silence") or {}
    rows = [f"| {what} | {metrics[key]:g} | {target} |" for key, what, target in EVAL_ROWS
            if metrics.get(key) is not None]
    jaw = metrics.get("jaw") or {}
    if jaw.get("frames"):
        rows.append(f"| the jaw line's worst frame (at {jaw['worst_frame_s']:g} s) / frames where it breaks "
                    f"(a quarter of it under {jaw['break_below']:g} of the real edge) | {jaw['worst_frame_ratio']:g} / "
                    f"{jaw['breaks']} of {jaw['frames']} | no break |")
    if silence.get("frames"):
        rows.append(f"| lips closed in silent frames: the avatar / the real person "
                    f"({silence['frames']} frames) | {silence['lips_closed_fraction_generated']:.0%} / "
                    f"{silence['lips_closed_fraction_real']:.0%} | closed in silence |")
    typed, speaking = metrics.get("typed_text") or {}, metrics.get("real_speaking_openness")
    if typed.get("frames"):
        rows.append(f"| typed text: the drawn mouth vs the phonemes' jaw ({typed['sentences']} eSpeak NG sentences it "
                    f"never learnt, on its loop) | {typed['drawn_vs_phoneme_jaw_corr']:g} | follows the words |")
        if typed.get("drawn_speaking_openness") and speaking:
            rows.append(f"| typed text: openness while the voice speaks / the real person's while speaking | "
                        f"{typed['drawn_speaking_openness']['mean']:g} / {speaking['mean']:g} | ≈ the person's |")
    offset = metrics.get("av_offset_frames")
    section = [f"### {_now()}: `{os.path.basename(metrics['clip'])}` from {metrics['start_s']:g} s to "
               f"{metrics['end_s']:g} s ({metrics['frames']} frames"
               + (f"; its sound moved {offset} frames earlier, as measured in training" if offset else "") + ")", "",
               "| measure | value | target |", "|---|---|---|", *rows, ""]
    with open(path, "a") as f:
        f.write("\n".join(section) + "\n")
    return path


__all__ = ["PROVENANCE", "sha256_of", "write_training_provenance", "add_evaluation"]
