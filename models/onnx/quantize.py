"""int8 versions of an export's ONNX files (``onnxruntime.quantization``), kept only where quality holds.

:func:`quantize_export` writes ``<part>.int8.onnx`` beside each float32 file of an export (:mod:`.export`)
and records them in its manifest (section ``int8``): the mode, each file, and ``models`` — the models
(``audio``, ``dit``, ``vae``; :data:`~.manifest.MODELS`) that ``--backend onnx-int8`` runs in int8 (the
others stay float32). Every int8 file carries the hash of the bundle it was quantized from in its ONNX
metadata (:data:`~.manifest.BUNDLE_KEY`), so a file of another bundle copied into the folder is refused.

Modes (only the weight-heavy ops are quantized — ``Conv``, ``MatMul``, ``Gemm``; the elementwise maths,
the norms and the decoder's registration / warp stay float32):

- ``dynamic`` (:func:`onnxruntime.quantization.quantize_dynamic`): int8 weights, activations quantized per
  call from their own range (``ConvInteger`` / ``MatMulInteger``); needs no data.
- ``static`` (:func:`onnxruntime.quantization.quantize_static`, QDQ, per-channel weights): activation
  ranges calibrated (min / max) on real stream inputs — :func:`record_inputs` runs the float32 stages on a
  clip's audio and copies what every session reads at each call (:attr:`~.runtime.OrtGraph.record`).

Which models keep int8 by default (:data:`DEFAULT_INT8`) is a measurement, not a guess: ``framegraph
bench avatar_int8`` (``apps/bench/avatar_int8.py``) quantizes each model alone and runs ``avatar eval``'s
openness correlation and identity SSIM on held-out clips against float32 ORT; :func:`choose_int8` keeps a
model when both stay within :data:`TOLERANCE` and it is faster. The recorded result is
``benchmarks/results/cpu/avatar_int8.json``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile

import numpy as np

from .manifest import BUNDLE_KEY, MODELS, PARTS, load_manifest, write_manifest

MODES = ("dynamic", "static")
OPS = ["Conv", "MatMul", "Gemm"]  # what is quantized; everything else stays float32
TOLERANCE = 0.01  # largest drop of openness correlation / identity SSIM (vs float32 ORT) that keeps a model int8
# The measured decision (benchmarks/results/cpu/avatar_int8.json, choose_int8 over it): mode and models kept.
# Shipped astronaut, 3 held-out clips: static int8 holds quality only for the audio encoder (openness corr.
# -0.0098, identity SSIM -0.0003; 0.23 -> 0.16 ms per frame), and is slower for the DiT (2.86 -> 3.36 ms) and
# the VAE decoder (15.6 -> 17.4 ms); dynamic int8 is slower for all three (0.24 -> 0.49, 2.8 -> 4.5, 16 -> 33 ms).
DEFAULT_MODE = "static"
DEFAULT_INT8: tuple[str, ...] = ("audio",)
CALIBRATION_FEEDS = 48  # calls per part used for the static calibration (evenly spread over the recording)


def int8_file(part_file: str) -> str:
    """``dit_velocity.onnx`` → ``dit_velocity.int8.onnx``."""
    root, ext = os.path.splitext(part_file)
    return f"{root}.int8{ext}"


def check_models(models) -> list[str]:
    """``models`` (names of :data:`~.manifest.MODELS`) as a list in canonical order; a clear error otherwise."""
    models = list(models)
    bad = [m for m in models if m not in MODELS]
    if bad:
        raise ValueError(f"int8 models {bad}: expected some of {', '.join(MODELS)} (e.g. --int8-models dit,vae)")
    return [m for m in MODELS if m in models]


# ---- calibration data ----------------------------------------------------------------------------------


def record_inputs(avatar, export_dir: str, audio, *, seconds: float | None = None) -> dict[str, list[dict]]:
    """Run ``avatar``'s float32 ORT stages (the real graph, :func:`~framegraph.models.avatar.build_avatar_graph`
    with ``backend="onnx"``) on ``audio`` (a file with audio, or 16 kHz int16 samples; the first ``seconds``)
    and return, per part (:data:`~.manifest.PARTS`), the inputs of every session call in order:
    ``{part: [{input name: float32 array}, ...]}``."""
    from framegraph.models.avatar import build_avatar_graph
    from framegraph.stream.media import PushAudioSource, decode_audio

    pcm = decode_audio(audio) if isinstance(audio, (str, os.PathLike)) else np.asarray(audio, np.int16)
    if seconds is not None:
        pcm = pcm[: int(seconds * 16000)]
    if len(pcm) == 0:
        raise ValueError(
            f"record_inputs: {audio if isinstance(audio, str) else 'the samples'} hold no audio to calibrate on"
        )
    src = PushAudioSource(max_buffer_ms=int(1000 * len(pcm) / 16000) + 100, name="calibration")
    ag = build_avatar_graph(
        avatar,
        src,
        sink=None,
        audio_sink=None,
        clock="fast",
        backend="onnx",
        onnx_dir=export_dir,
        budget_ms=None,
        video_policy="block",
    )
    graphs = {
        "audio": ag.features.encode.graph,
        "dit_velocity": ag.denoiser._graphs[0],
        "dit_commit": ag.denoiser._graphs[1],
        "vae_first": ag.decode.ort.first,
        "vae_next": ag.decode.ort.next,
    }
    for g in graphs.values():
        g.record = []
    from framegraph.stream import Stage

    class Drain(Stage):  # the composited frames are not needed, only the sessions' inputs
        def __init__(self, spec):
            super().__init__("drain")
            self.inputs = {"video": spec}

        def process(self, inputs, out):
            pass

    drain = ag.graph.add(Drain(ag.composite.outputs["video"]))
    ag.graph.connect(ag.composite, drain, "video", "video", capacity=4)
    src.push(pcm)
    src.close()
    ag.graph.run()
    out = {part: g.record for part, g in graphs.items()}
    for g in graphs.values():
        g.record = None
    return out


class FeedReader:
    """A calibration data reader (``get_next`` / ``rewind``, what ``quantize_static`` asks for) over recorded
    feeds, at most ``limit`` of them taken evenly over the recording."""

    def __init__(self, feeds: list[dict], limit: int = CALIBRATION_FEEDS):
        if not feeds:
            raise ValueError("FeedReader: no recorded calls to calibrate on (was the clip long enough?)")
        idx = np.unique(np.linspace(0, len(feeds) - 1, min(limit, len(feeds))).round().astype(int))
        self.feeds = [feeds[i] for i in idx]
        self.i = 0

    def get_next(self):
        if self.i >= len(self.feeds):
            return None
        self.i += 1
        return self.feeds[self.i - 1]

    def rewind(self):
        self.i = 0


# ---- quantization --------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_preprocess_hint():
    """Drop onnxruntime.quantization's root-logger hint to run its pre-processing (shape inference and
    fusions; these graphs are traced with fixed shapes and optimised when the session loads)."""

    class Hint(logging.Filter):
        def filter(self, record):
            return "pre-processing before quantization" not in record.getMessage()

    root, hint = logging.getLogger(), Hint()
    root.addFilter(hint)
    try:
        yield
    finally:
        root.removeFilter(hint)


def quantize_file(src: str, dst: str, mode: str, bundle_hash: str, feeds: list[dict] | None = None) -> None:
    """Write the int8 version of ``src`` to ``dst`` (``mode``: see the module docstring; ``static`` needs
    ``feeds``, the part's recorded inputs) with ``bundle_hash`` in its metadata."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    if mode not in MODES:
        raise ValueError(f"int8 mode {mode!r}; expected one of {MODES}")
    with tempfile.TemporaryDirectory(prefix="fg-int8-") as tmp, _quiet_preprocess_hint():
        out = os.path.join(tmp, "q.onnx")
        if mode == "dynamic":
            quantize_dynamic(src, out, op_types_to_quantize=OPS, weight_type=QuantType.QInt8, per_channel=False)
        else:

            class Reader(FeedReader, CalibrationDataReader):
                pass

            quantize_static(
                src,
                out,
                Reader(feeds or []),
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=OPS,
                per_channel=True,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                extra_options={"CalibTensorRangeSymmetric": False},
            )
        model = onnx.load(out)
        meta = {p.key: p.value for p in model.metadata_props}
        meta.update({BUNDLE_KEY: bundle_hash, "framegraph.int8": mode, "framegraph.source": os.path.basename(src)})
        del model.metadata_props[:]
        for k, v in meta.items():
            model.metadata_props.add(key=k, value=v)
        onnx.save(model, dst)


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
    """Quantize every part of the float32 export in ``export_dir`` (checked against ``avatar``) into
    ``<part>.int8.onnx`` and record them in the manifest; ``models`` (names of :data:`~.manifest.MODELS`)
    are the ones ``--backend onnx-int8`` runs in int8. ``static`` calibrates on ``calibration_audio`` (a file
    with audio; default :func:`calibration_speech`). Returns the manifest."""
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
    """A copy of the int8 export ``export_dir`` in ``out_dir`` running ``models`` in int8 (for measuring one
    model at a time)."""
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    shutil.copytree(export_dir, out_dir)
    set_int8_models(out_dir, avatar, models)
    return out_dir


def calibration_speech(seconds: float = 6.0, seed: int = 0) -> np.ndarray:
    """16 kHz int16 speech for the static calibration: the audio of synthetic clip 0 of ``avatar synth --seed
    SEED`` (espeak-ng, :mod:`framegraph.models.synth`; seed 0 is the training clips' — the held-out clips the
    quality is measured on use another seed)."""
    from framegraph.models.synth import clip_seed, plan_clip

    return plan_clip(seconds, 25, clip_seed(seed, 0)).audio


# ---- the decision --------------------------------------------------------------------------------------


def choose_int8(fp32: dict, per_model: dict, tolerance: float = TOLERANCE) -> dict:
    """Which models keep int8. ``fp32``: ``{"openness_corr", "identity_ssim"}`` of float32 ORT; ``per_model``:
    for each model run alone in int8 (``{"audio": {...}, ...}``) the same two figures and ``"ms_per_frame":
    {"fp32": ms, "int8": ms}`` (the model's session time per video frame, both measured side by side). A model
    is kept when its openness correlation and identity SSIM each drop by at most ``tolerance`` and int8 takes
    less time. Returns ``{"models": [kept], "why": {model: reason}}``."""
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
