"""int8 exports (models/avatar/int8.py): calibration recorded from the float32 stages, int8 files that run
through the avatar graph and stay close to float32, refused when quantized from another bundle, and the
keep-or-not decision (also against the recorded measurement)."""

import json
import os
import shutil

import numpy as np
import pytest
import torch
from helpers import psnr_per_frame

pytest.importorskip("onnx")

from framegraph.models.avatar import RunSettings, build_avatar_graph, random_avatar
from framegraph.models.avatar.int8 import (
    DEFAULT_INT8,
    DEFAULT_MODE,
    TOLERANCE,
    check_models,
    choose_int8,
    quantize_export,
    record_inputs,
    set_int8_models,
)
from framegraph.models.avatar.portrait.engines import AvatarExport
from framegraph.models.avatar.portrait.onnx import MODELS, PARTS, export_avatar
from framegraph.models.onnx import ExportError
from framegraph.models.onnx.manifest import BUNDLE_KEY
from framegraph.models.onnx.quantize import FeedReader
from framegraph.stream import PortSpec, Stage
from framegraph.stream.media import PushAudioSource

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULT = os.path.join(ROOT, "benchmarks", "results", "cpu", "avatar_int8.json")


def bursts(seconds: float) -> np.ndarray:
    """Voiced bursts (the mouth must move), 16 kHz int16."""
    t = np.arange(int(seconds * 16000)) / 16000
    return (np.sin(2 * np.pi * 180 * t) * 6000 * (np.sin(2 * np.pi * 2 * t) > 0)).astype(np.int16)


def avatar(seed: int = 0):
    return random_avatar(region_size=64, chunk_frames=2, seed=seed, dit_config={"frames_per_block": 2})


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A random bundle's export with static int8 files (calibrated on its own float32 stages), every model
    running int8."""
    a = avatar()
    out = str(tmp_path_factory.mktemp("int8"))
    export_avatar(a, out)
    quantize_export(a, out, "static", models=list(MODELS), calibration_audio=None, calibration_seconds=1.0)
    return a, out


class Frames(Stage):
    def __init__(self, spec):
        super().__init__("frames")
        self.inputs = {"video": spec}
        self.got = []

    def process(self, inputs, out):
        self.got.append(inputs["video"].data.clone())


def render(a, onnx_dir: str, backend: str, audio: np.ndarray) -> np.ndarray:
    """The avatar graph on ``backend``: composited frames ``uint8 [T, H, W, 3]``."""
    src = PushAudioSource(max_buffer_ms=int(1000 * len(audio) / 16000) + 100)
    ag = build_avatar_graph(
        a,
        src,
        sink=None,
        audio_sink=None,
        clock="fast",
        settings=RunSettings(runtime=backend, onnx_dir=onnx_dir, budget_ms=None),
        video_policy="block",
    )
    sink = ag.graph.add(Frames(PortSpec((a.height, a.width, 3), torch.uint8, "cpu")))
    ag.graph.connect(ag.video, sink, "video", "video", capacity=4)
    src.push(audio)
    src.close()
    ag.graph.run()
    return torch.stack(sink.got).numpy()


def test_calibration_records_each_sessions_inputs_per_call(exported):
    a, out = exported
    feeds = record_inputs(a, out, bursts(0.8))
    frames = 20  # 0.8 s at 25 fps
    blocks = frames // a.chunk_frames
    assert len(feeds["audio"]) >= 20  # one call per 20 ms chunk that completes a frame's context
    assert len(feeds["dit_velocity"]) == blocks * a.steps and len(feeds["dit_commit"]) == blocks
    assert len(feeds["vae_first"]) == 1 and len(feeds["vae_next"]) == blocks - 1
    ex = AvatarExport(out, a)
    for part in PARTS:
        names = set(ex.graph(part).inputs)
        assert set(feeds[part][0]) == names, part  # every input the session reads, nothing else
    # the stream state moves between calls: the recorded copies are of each call's values, not one buffer
    kv = [f["kv_0"] for f in feeds["dit_commit"]]
    assert not np.array_equal(kv[0], kv[-1]) and np.abs(kv[-1]).max() > 0
    reader = FeedReader(feeds["dit_velocity"], limit=5)
    got = [reader.get_next() for _ in range(6)]
    assert got[-1] is None and len(reader.feeds) == 5
    reader.rewind()
    assert reader.get_next() is reader.feeds[0]


def test_int8_export_runs_through_the_graph_close_to_float32(exported):
    a, out = exported
    m = json.load(open(os.path.join(out, "manifest.json")))["int8"]
    assert m["mode"] == "static" and m["models"] == list(MODELS) and set(m["files"]) == set(PARTS)
    assert m["calibration"]["calls_recorded"]["dit_commit"] > 0
    ex = AvatarExport(out, a, int8=True)
    import onnx

    for part in PARTS:
        g = ex.graph(part)
        assert g.path.endswith(".int8.onnx")
        ops = {n.op_type for n in onnx.load(g.path).graph.node}
        assert "QuantizeLinear" in ops and "DequantizeLinear" in ops, part  # really quantized
    audio = bursts(1.2)
    f32 = render(a, out, "onnx", audio)
    i8 = render(a, out, "onnx-int8", audio)
    assert f32.shape == i8.shape and len(f32) == 30
    p = psnr_per_frame(f32, i8)
    # measured: min 37.7 dB, mean 41.8 dB on this random bundle (seed 2: 36.7 / 39.4) — bound with margin
    assert p.min() >= 32.0, p
    assert not np.array_equal(i8, f32)  # the int8 files were what ran
    assert np.abs(np.diff(i8.astype(np.float64), axis=0)).mean() > 0.01  # the picture moves


def test_onnx_int8_runs_only_the_kept_models_in_int8(exported, tmp_path):
    a, out = exported
    d = str(tmp_path / "dit_only")
    shutil.copytree(out, d)
    set_int8_models(d, a, ["dit"])
    ex = AvatarExport(d, a, int8=True)
    assert sorted(ex.int8) == ["dit_commit", "dit_velocity"]
    assert ex.graph("vae_next").path.endswith("vae_next.onnx") and ex.graph("dit_commit").path.endswith(".int8.onnx")
    set_int8_models(d, a, [])
    audio = bursts(0.6)
    assert np.array_equal(render(a, d, "onnx-int8", audio), render(a, d, "onnx", audio))  # none kept: float32
    with pytest.raises(ValueError, match="int8 models \\['unet'\\]: expected some of audio, dit, vae"):
        check_models(["unet"])


def test_int8_files_of_another_bundle_or_missing_are_refused(exported, tmp_path):
    a, out = exported
    other = avatar(seed=1)
    od = str(tmp_path / "other")
    export_avatar(other, od)
    quantize_export(other, od, "dynamic", models=["dit"])
    mine = str(tmp_path / "mine")
    shutil.copytree(out, mine)
    shutil.copy(os.path.join(od, "dit_velocity.int8.onnx"), os.path.join(mine, "dit_velocity.int8.onnx"))
    ex = AvatarExport(mine, a, int8=True)
    ex.graph("dit_commit")  # still this bundle's
    with pytest.raises(ExportError, match="dit_velocity.int8.onnx was quantized from another bundle"):
        ex.graph("dit_velocity")
    import onnxruntime as ort

    meta = ort.InferenceSession(os.path.join(od, "vae_next.int8.onnx")).get_modelmeta().custom_metadata_map
    assert meta[BUNDLE_KEY] == json.load(open(os.path.join(od, "manifest.json")))["bundle_hash"]
    os.remove(os.path.join(mine, "vae_first.int8.onnx"))
    with pytest.raises(ExportError, match="lacks the int8 file of vae_first"):
        AvatarExport(mine, a, int8=True)
    plain = str(tmp_path / "plain")
    export_avatar(a, plain)
    AvatarExport(plain, a)  # float32 use needs no int8 files
    with pytest.raises(ExportError, match="no int8 files; run `framegraph export --avatar BUNDLE .* --int8`"):
        AvatarExport(plain, a, int8=True)
    with pytest.raises(ExportError, match="no int8 files"):
        render(a, plain, "onnx-int8", bursts(0.2))


FP32 = {"openness_corr": 0.85, "identity_ssim": 0.99}


def model(d_open=0.0, d_ssim=0.0, fp32_ms=10.0, int8_ms=8.0) -> dict:
    return {
        "openness_corr": FP32["openness_corr"] - d_open,
        "identity_ssim": FP32["identity_ssim"] - d_ssim,
        "ms_per_frame": {"fp32": fp32_ms, "int8": int8_ms},
    }


def test_choice_keeps_a_model_only_when_both_figures_hold_and_it_is_faster():
    d = choose_int8(
        FP32, {"audio": model(d_open=0.01, d_ssim=-0.002), "dit": model(d_open=0.0102), "vae": model(d_ssim=0.02)}
    )
    assert d["models"] == ["audio"]  # a drop of exactly the tolerance holds; a better figure is no drop
    assert "openness corr. drops 0.0102 > 0.01" in d["why"]["dit"] and "identity SSIM drops 0.0200" in d["why"]["vae"]
    d = choose_int8(FP32, {"dit": model(int8_ms=10.5), "vae": model(d_open=-0.03)})
    assert d["models"] == ["vae"] and "10.50 ms per frame is not below float32's 10.00 ms" in d["why"]["dit"]
    assert d["why"]["audio"] == "not measured"
    assert choose_int8(FP32, {"dit": model(d_open=0.005)}, tolerance=0.001)["models"] == []
    assert choose_int8(FP32, {"dit": model(int8_ms=10.0)})["models"] == []  # as fast is not faster


def test_the_default_is_the_recorded_measurements_decision():
    r = json.load(open(RESULT))
    assert r["settings"]["tolerance"] == TOLERANCE and r["device"] and r["command"] and r["load_average_1_5_15min"]
    for mode, d in r["decisions"].items():
        per = {
            m: {**r["variants"][f"{mode}:{m}"]["quality"], "ms_per_frame": r["side_by_side"][mode]["ms_per_frame"][m]}
            for m in MODELS
        }
        assert choose_int8(r["variants"]["fp32"]["quality"], per)["models"] == d["models"]  # follows from its numbers
    assert list(DEFAULT_INT8) == r["decision"]["models"]
    if DEFAULT_INT8:
        assert DEFAULT_MODE == r["decision"]["mode"]
