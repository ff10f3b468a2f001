"""The portrait bundle's int8 export: which of its models run int8, calibrated on its own stream.

:func:`quantize_export` writes ``<part>.int8.onnx`` beside each float32 file of an export. The export is
:mod:`.portrait.onnx`'s. It uses :func:`~framegraph.models.onnx.quantize.quantize_file`. It records the files in
the manifest's ``int8`` section: the mode, each file, and ``models``. Those are the models that
``runtime="onnx-int8"`` runs in int8, among ``audio``, ``dit`` and ``vae`` (:data:`~.portrait.onnx.MODELS`).
The others stay float32. ``static`` calibration runs the float32 stages on a clip's audio
(:func:`record_inputs`). It keeps what every session read at each call.

Which models keep int8 by default is a measurement, not a guess. That default is :data:`DEFAULT_INT8`.
``framegraph bench avatar_int8`` quantizes each model alone. It runs ``avatar eval``'s openness correlation
and identity SSIM on held-out clips, against float32 ORT. :func:`choose_int8` keeps a model when both stay
within :data:`TOLERANCE` and it is faster. The recorded result is ``benchmarks/results/cpu/avatar_int8.json``.
"""
from __future__ import annotations

import os
import shutil

import numpy as np

from framegraph.models.onnx import write_manifest
from framegraph.models.onnx.quantize import MODES, OPS, FeedReader, int8_file, quantize_file
from framegraph.models.synth import clip_seed, plan_clip
from framegraph.stream import Stage
from framegraph.stream.media import SAMPLE_RATE, PushAudioSource, decode_audio

from .base import RunSettings
from .graph import build_avatar_graph
from .portrait.onnx import MODELS, PARTS, load_manifest

TOLERANCE = 0.01  # largest drop of openness correlation / identity SSIM (vs float32 ORT) that keeps a model int8
# The decision recorded in benchmarks/results/cpu/avatar_int8.json (docs/runtimes.md): mode and models kept.
DEFAULT_MODE = "static"
DEFAULT_INT8: tuple[str, ...] = ("audio",)


def check_models(models) -> list[str]:
    """``models``, names of :data:`~.portrait.onnx.MODELS`, as a list in canonical order; else a clear error."""
    models = list(models)
    bad = [m for m in models if m not in MODELS]
    if bad:
        raise ValueError(f"int8 models {bad}: expected some of {', '.join(MODELS)} (e.g. --int8-models dit,vae)")
    return [m for m in MODELS if m in models]


def record_inputs(avatar, export_dir: str, audio, *, seconds: float | None = None) -> dict[str, list[dict]]:
    """Record the inputs of ``avatar``'s float32 ORT stages on ``audio``.

    The stages are the real graph: :func:`~framegraph.models.avatar.build_avatar_graph` with ``runtime="onnx"``.
    ``audio`` is a file with audio, or 16 kHz int16 samples. Only the first ``seconds`` run. Returns the inputs
    of every session call in order, per part of :data:`~.onnx.PARTS`. The form is
    ``{part: [{input name: float32 array}, ...]}``."""
    pcm = decode_audio(audio) if isinstance(audio, (str, os.PathLike)) else np.asarray(audio, np.int16)
    if seconds is not None:
        pcm = pcm[: int(seconds * SAMPLE_RATE)]
    if len(pcm) == 0:
        raise ValueError(
            f"record_inputs: {audio if isinstance(audio, str) else 'the samples'} hold no audio to calibrate on"
        )
    src = PushAudioSource(max_buffer_ms=int(1000 * len(pcm) / SAMPLE_RATE) + 100, name="calibration")
    ag = build_avatar_graph(
        avatar,
        src,
        sink=None,
        audio_sink=None,
        clock="fast",
        settings=RunSettings(runtime="onnx", onnx_dir=export_dir, budget_ms=None),
        video_policy="block",
    )
    graphs = {**ag.features.encode.graphs, **ag.stages["denoiser"].engine.graphs, **ag.stages["decode"].engine.graphs}
    for g in graphs.values():
        g.record = []
    class Drain(Stage):  # the composited frames are not needed, only the sessions' inputs
        def __init__(self, spec):
            super().__init__("drain")
            self.inputs = {"video": spec}

        def process(self, inputs, out):
            pass

    drain = ag.graph.add(Drain(ag.video.outputs["video"]))
    ag.graph.connect(ag.video, drain, "video", "video", capacity=4)
    src.push(pcm)
    src.close()
    ag.graph.run()
    out = {part: g.record for part, g in graphs.items()}
    for g in graphs.values():
        g.record = None
    return out


def quantize_export(
    avatar,
    export_dir: str,
    mode: str = DEFAULT_MODE,
    *,
    models=DEFAULT_INT8,
    calibration_audio: str | None = None,
    calibration_seconds: float | None = 6.0,
    log=None,
) -> dict:
    """Quantize every part of the float32 export in ``export_dir`` into ``<part>.int8.onnx``.

    The export is checked against ``avatar``. The files are recorded in the manifest. ``models`` are names of
    :data:`~.portrait.onnx.MODELS`. They are the ones ``runtime="onnx-int8"`` runs in int8. ``static``
    calibrates on ``calibration_audio``, a file with audio. Its default is :func:`calibration_speech`.
    Returns the manifest."""
    import onnxruntime

    models = check_models(models)
    manifest = load_manifest(export_dir, avatar)
    files = manifest["files"]
    feeds: dict[str, list[dict]] = {}
    calib = None
    if mode == "static":
        audio = calibration_audio or calibration_speech(calibration_seconds or 6.0)
        feeds = record_inputs(avatar, export_dir, audio, seconds=calibration_seconds)
        calib = {
            "audio": calibration_audio or "espeak-ng speech of synthetic clip 0, seed 0 (training seed)",
            "seconds": calibration_seconds,
            "calls_recorded": {p: len(f) for p, f in feeds.items()},
            "calls_used": {p: len(FeedReader(f).feeds) for p, f in feeds.items() if f},
        }
    section = {
        "mode": mode,
        "ops": OPS,
        "onnxruntime": onnxruntime.__version__,
        "calibration": calib,
        "files": {},
        "models": models,
    }
    for part in PARTS:
        name = int8_file(files[part]["file"])
        if log:
            log(f"int8 ({mode}): {files[part]['file']} -> {name}")
        quantize_file(
            os.path.join(export_dir, files[part]["file"]),
            os.path.join(export_dir, name),
            mode,
            manifest["bundle_hash"],
            feeds.get(part),
        )
        section["files"][part] = {"file": name}
    manifest["int8"] = section
    return write_manifest(export_dir, manifest)


def set_int8_models(export_dir: str, avatar, models) -> dict:
    """Change which models of an int8 export run in int8 (``models``), leaving the files as they are."""
    manifest = load_manifest(export_dir, avatar)
    if "int8" not in manifest:
        raise ValueError(f"{export_dir} has no int8 files; run `framegraph export --int8` first")
    manifest["int8"]["models"] = check_models(models)
    return write_manifest(export_dir, manifest)


def variant_dir(export_dir: str, out_dir: str, avatar, models) -> str:
    """A copy of the int8 export ``export_dir`` in ``out_dir``, running ``models`` in int8.

    It serves to measure one model at a time."""
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    shutil.copytree(export_dir, out_dir)
    set_int8_models(out_dir, avatar, models)
    return out_dir


def calibration_speech(seconds: float = 6.0, seed: int = 0) -> np.ndarray:
    """16 kHz int16 speech for the static calibration.

    It is the audio of synthetic clip 0 of ``avatar synth --seed SEED``, spoken by espeak-ng through
    :mod:`framegraph.models.synth`. Seed 0 is the training clips' seed. The held-out clips that quality is
    measured on use another seed."""
    return plan_clip(seconds, 25, clip_seed(seed, 0)).audio


# ---- the decision --------------------------------------------------------------------------------------


def choose_int8(fp32: dict, per_model: dict, tolerance: float = TOLERANCE) -> dict:
    """Which models keep int8.

    ``fp32`` holds ``{"openness_corr", "identity_ssim"}`` of float32 ORT. ``per_model`` holds, for each model
    run alone in int8, the same two figures, as ``{"audio": {...}, ...}``. Each also holds ``"ms_per_frame":
    {"fp32": ms, "int8": ms}``. That is the model's session time per video frame, both timed side by side. A
    model is kept when int8 takes less time. Its openness correlation and identity SSIM must each drop by at
    most ``tolerance``. Returns ``{"models": [kept], "why": {model: reason}}``."""
    kept, why = [], {}
    for model in MODELS:
        m = per_model.get(model)
        if m is None:
            why[model] = "not measured"
            continue
        # the figures have 4 decimals (avatar eval rounds them): a drop of exactly the tolerance holds
        d_open = round(fp32["openness_corr"] - m["openness_corr"], 6)
        d_ssim = round(fp32["identity_ssim"] - m["identity_ssim"], 6)
        t32, t8 = m["ms_per_frame"]["fp32"], m["ms_per_frame"]["int8"]
        fails = []
        if d_open > tolerance:
            fails.append(f"openness corr. drops {d_open:.4f} > {tolerance}")
        if d_ssim > tolerance:
            fails.append(f"identity SSIM drops {d_ssim:.4f} > {tolerance}")
        if not t8 < t32:
            fails.append(f"{t8:.2f} ms per frame is not below float32's {t32:.2f} ms")
        if fails:
            why[model] = "float32: " + "; ".join(fails)
        else:
            kept.append(model)
            why[model] = (
                f"int8: openness corr. {-d_open:+.4f}, identity SSIM {-d_ssim:+.4f}, {t32:.2f} → {t8:.2f} ms per frame"
            )
    return {"models": kept, "why": why}


__all__ = ["MODES", "DEFAULT_MODE", "DEFAULT_INT8", "TOLERANCE", "check_models", "record_inputs", "quantize_export",
           "set_int8_models", "variant_dir", "calibration_speech", "choose_int8"]
