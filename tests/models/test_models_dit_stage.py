"""The Denoiser stage: in a real graph (chunks, pts, determinism), fallback to fewer steps, reset."""
from __future__ import annotations

import pytest
import torch

from framegraph.models.dit import AvatarDiT, Denoiser, generate
from framegraph.models.dit.stage import step_levels
from framegraph.stream import Clock, EndOfStream, Flag, Frame, Graph, PortSpec, RecordingSink, Stage, StageContext

C, H, W, F, FPS = 4, 4, 4, 8, 25


def tiny(frames_per_block: int = 1) -> AvatarDiT:
    torch.manual_seed(0)
    model = AvatarDiT(latent_channels=C, sample_size=H, width=32, depth=2, heads=2, audio_dim=F, audio_past_frames=2,
                      freq_dim=32, ffn_ratio=2.0, frames_per_block=frames_per_block)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.15)
    return model.eval()


def feature_frames(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(n, F, generator=g)
    state = torch.zeros(n, 4)
    state[:, 1] = 1.0  # speaking
    state[:, 3] = torch.rand(n, generator=g)
    return features, state


class FeatureSource(Stage):
    """What AudioFeatures emits: ``features [F]`` and ``state [4]`` per video frame, pts on the video clock."""

    def __init__(self, features, state):
        super().__init__("features_src")
        self.features, self.state = features, state
        self.outputs = {"features": PortSpec((F,)), "state": PortSpec((4,))}
        self.i = 0

    def process(self, inputs, out):
        if self.i >= len(self.features):
            raise EndOfStream
        pts = self.ctx.clock.ticks_from_frame(self.i, FPS)
        for port, data in (("features", self.features), ("state", self.state)):
            f = out.write(port)
            f.data.copy_(data[self.i])
            f.pts = pts
        self.i += 1


def run_graph(denoiser: Denoiser, n: int):
    features, state = feature_frames(n)
    graph = Graph(Clock("fast"))
    src = graph.add(FeatureSource(features, state), max_in_flight=4)
    den = graph.add(denoiser)
    sink = graph.add(RecordingSink({"latent": PortSpec((C, denoiser.chunk_frames, H, W))}, name="latent_sink"))
    graph.connect(src, den, "features")
    graph.connect(src, den, "state")
    graph.connect(den, sink)
    report = graph.run(timeout=120)
    return [(r.data, r.pts, r.flags) for r in sink.records], report, (features, state)


def test_step_levels_halve_down_to_one():
    assert step_levels(4) == [4, 2, 1]
    assert step_levels(3) == [3, 1]
    assert step_levels(1) == [1]
    with pytest.raises(ValueError, match="steps"):
        step_levels(0)


def test_denoiser_in_a_graph_emits_one_chunk_per_t_chunk_frames(tmp_path):
    model = tiny(frames_per_block=1)
    model.save_pretrained(tmp_path / "dit")
    ref = torch.randn(C, H, W, generator=torch.Generator().manual_seed(5))
    den = Denoiser(str(tmp_path / "dit"), ref, steps=2, chunk_frames=2, seed=7)
    assert den.outputs["latent"].shape == (C, 2, H, W)
    assert den.fallbacks == ("1 step",)
    got, report, (features, state) = run_graph(den, 7)
    assert report["error"] is None
    assert len(got) == 4  # 3 full chunks + the last frame, completed by repetition at end of stream
    clock = Clock("fast")
    assert [pts for _, pts, _ in got] == [clock.ticks_from_frame(i, FPS) for i in (0, 2, 4, 6)]
    assert den.chunks_out == 4 and den.steps_used == {2: 4}
    # the same numbers as offline generation with the same noise seed (one stream, block by block)
    padded_f = torch.cat([features, features[-1:]])
    padded_s = torch.cat([state, state[-1:]])
    with torch.inference_mode():
        offline = generate(model, ref, padded_f[None], padded_s[None], steps=2,
                           generator=torch.Generator().manual_seed(7))
    streamed = torch.cat([data for data, _, _ in got], dim=1)
    assert torch.allclose(streamed, offline[0], atol=1e-5)


def test_over_budget_the_denoiser_steps_down_to_fewer_sampler_steps():
    den = Denoiser(tiny(), torch.zeros(C, H, W), steps=4, budget_ms=1e-6, seed=0)
    assert den.fallbacks == ("2 steps", "1 step")
    got, report, _ = run_graph(den, 6)
    assert len(got) == 6
    # the governor steps down one level after each over-budget frame: 4 steps, then 2, then 1
    assert den.steps_used == {4: 1, 2: 1, 1: 4}
    assert den.last_steps == 1
    den.set_fallback(0)
    assert den.steps == 4
    with pytest.raises(ValueError, match="fallback level"):
        den.set_fallback(3)


class FakeOutputs:
    """Stands in for the graph's Outputs in direct calls: hands out fresh frames and keeps them."""

    def __init__(self, spec: PortSpec):
        self.spec, self.frames = spec, []

    def write(self, port):
        frame = Frame(self.spec, 1)
        self.frames.append(frame)
        return frame


def feed(den: Denoiser, features, state, out: FakeOutputs, start: int = 0):
    for i in range(len(features)):
        inputs = {}
        for port, data in (("features", features), ("state", state)):
            f = Frame(den.inputs[port], 1)
            f.data.copy_(data[i])
            f.pts = (start + i) * 1920
            inputs[port] = f
        den.process(inputs, out)


def test_reset_forgets_the_stream_and_flags_the_next_chunk():
    den = Denoiser(tiny(frames_per_block=2), torch.randn(C, H, W), steps=2, seed=3)
    den.setup(StageContext(Clock("fast"), torch.device("cpu")))
    features, state = feature_frames(6)
    out = FakeOutputs(den.outputs["latent"])
    feed(den, features, state, out)
    feed(den, features[:1], state[:1], out)  # half a chunk, then barge-in
    den.reset()
    feed(den, features, state, out)
    first, second = out.frames[:3], out.frames[3:]
    assert len(first) == len(second) == 3
    for a, b in zip(first, second):
        assert torch.equal(a.data, b.data)  # same noise and an empty past: the stream starts over
    assert second[0].flags & Flag.INTERRUPTED and not second[1].flags & Flag.INTERRUPTED
    assert den.engine.stream.frames == 6


def test_bad_construction_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="reference has shape"):
        Denoiser(tiny(), torch.zeros(C + 1, H, W))
    with pytest.raises(ValueError, match="multiple"):
        Denoiser(tiny(frames_per_block=2), torch.zeros(C, H, W), chunk_frames=3)
    with pytest.raises(ValueError, match="attention='linear'"):
        Denoiser(AvatarDiT(latent_channels=C, width=32, heads=2, depth=1, attention="monarch"), torch.zeros(C, H, W))


def test_live_frames_whose_audio_is_too_old_or_already_superseded_are_skipped_not_queued():
    """Realtime clock + max_lag_ms: a frame whose audio arrived 1 s ago is skipped (counted), so is a fresh
    one with a newer frame already waiting behind it (the chunk starts from the newest audio), a fresh one
    with nothing behind it is generated; with the fast clock (offline) nothing is ever skipped."""
    import time

    den = Denoiser(tiny(), torch.randn(C, H, W), steps=1, seed=0, max_lag_ms=200)
    queued = {"features": 0}
    den.setup(StageContext(Clock("realtime"), torch.device("cpu"), waiting=lambda port: queued.get(port, 0)))
    features, state = feature_frames(2)
    out = FakeOutputs(den.outputs["latent"])

    def frame(i, age_s):
        inputs = {}
        for port, data in (("features", features), ("state", state)):
            f = Frame(den.inputs[port], 1)
            f.data.copy_(data[i])
            f.pts = i * 1920
            f.capture_ns = time.monotonic_ns() - int(age_s * 1e9)
            inputs[port] = f
        return inputs

    den.process(frame(0, 1.0), out)
    assert den.frames_skipped == 1 and out.frames == []
    queued["features"] = 1
    den.process(frame(1, 0.0), out)
    assert den.frames_skipped == 2 and out.frames == []
    queued["features"] = 0
    den.process(frame(1, 0.0), out)
    assert den.frames_skipped == 2 and len(out.frames) == 1 and out.frames[0].pts == 1920
    offline = Denoiser(tiny(), torch.randn(C, H, W), steps=1, max_lag_ms=200)
    offline.setup(StageContext(Clock("fast"), torch.device("cpu")))
    offline.process(frame(0, 1.0), FakeOutputs(offline.outputs["latent"]))
    assert offline.frames_skipped == 0 and offline.chunks_out == 1
    with pytest.raises(ValueError, match="max_lag_ms"):
        Denoiser(tiny(), torch.randn(C, H, W), max_lag_ms=0)
