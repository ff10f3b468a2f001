"""The compiled runtime on CUDA (GPU only): every graphed step replays what its eager twin computes, a captured
stream leaves its state where it was, the timing harness replays capturable ops from CUDA graphs, and a CUDA stage's
output reaches a host stage through pinned download slots. Run by ``benchmarks/gpu_run.sh`` (step ``tests``)."""
import copy

import pytest
import torch
from helpers import dit_block_inputs, random_portrait_avatar, rel, started_dit_engines

from framegraph.models.graphs import GraphedStep

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compile_cache")]


def test_a_graphed_step_replays_the_step_and_restores_its_state():
    state = torch.zeros(4, device="cuda")

    def step(x):
        state.add_(x)  # a stream's state, advanced in place
        return state * 2

    g = GraphedStep(step, state=[state])
    x = torch.ones(4, device="cuda")
    out = g(x)  # warm-up calls, capture, state restored, then one replay
    assert g.captured and torch.equal(state, x) and torch.equal(out, 2 * x)
    out = g(torch.full((4,), 3.0, device="cuda"))
    assert torch.equal(state, torch.full((4,), 4.0, device="cuda")) and out.data_ptr() == g.output.data_ptr()


def test_graphed_portrait_engines_equal_torch_on_cuda():
    from framegraph.models.avatar.portrait.compiled import CompiledVAE
    from framegraph.models.vae import TorchVAE, uint8_to_frames

    avatar = random_portrait_avatar()
    dit, vae = avatar.dit.cuda(), avatar.vae.cuda()
    ref = avatar.reference_latent().cuda()
    c, g = dit.config, torch.Generator(device="cuda").manual_seed(0)
    with torch.inference_mode():
        eager, fast = started_dit_engines(dit, ref)
        for block in range(4):
            noise, audio, labels = dit_block_inputs(c, ref, g, device="cuda")
            fast_out = fast.generate(noise, audio, labels, 2, 1.0)
            assert rel(fast_out, eager.generate(noise, audio, labels, 2, 1.0)) <= 1e-3
        assert fast.steps[(2, 1.0)].captured
        reference = uint8_to_frames(avatar.region()[0])[None].cuda()
        ev, fv = TorchVAE(vae, reference), CompiledVAE(vae, reference)
        for chunk in range(3):
            z = torch.randn(1, *vae.latent_shape(1, 64, 64), generator=g, device="cuda")
            assert rel(fv.decode(z), ev.decode(z)) <= 1e-3, chunk
        assert fv.step.captured


@pytest.mark.parametrize("family, open_kw", [("wan", {"chunk_frames": 1, "cache_frames": 3, "sink_frames": 1}),
                                             ("sana", {"chunk_frames": 2})])
def test_graphed_denoising_steps_equal_eager_on_cuda(family, open_kw, monkeypatch):
    """Compiled and graphed against eager, and compiled alone against eager, so that a miss says which part differs.
    On an H200 (2026-12-04) the graphed steps were 0.0085 (Wan) and 0.028 (SANA) off at the first chunk: the graphs
    likely read rotary buffers a later pin had replaced (tests/kernels/test_kernels_processors.py holds that now)."""
    from framegraph.apps.bench.generate import build_model
    from framegraph.models.compile import CompileSettings
    from framegraph.models.generate.compiled import GraphedVelocity, compile_stream

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # float32 convolutions in float32
    gm = build_model(family, "tiny", "cuda", torch.float32)
    twin, plain = copy.deepcopy(gm.transformer), copy.deepcopy(gm.transformer)
    eager = gm.family.open(gm.transformer, latent_size=(8, 12), **open_kw)
    fast = compile_stream(gm.family.open(twin, latent_size=(8, 12), **open_kw))
    compiled = compile_stream(gm.family.open(plain, latent_size=(8, 12), **open_kw), CompileSettings(cuda_graphs=False))
    assert isinstance(fast.streamer.velocity, GraphedVelocity) and fast.streamer.velocity.enabled
    g = torch.Generator(device="cuda").manual_seed(0)
    embeds = torch.randn(1, 6, gm.family.text_dim(gm.transformer), generator=g, device="cuda")
    mask = torch.ones(1, 6, device="cuda")
    with torch.no_grad():
        for chunk in range(5):
            noise = torch.randn(1, gm.transformer.config.in_channels, open_kw["chunk_frames"], 8, 12, generator=g,
                                device="cuda")
            want = eager.generate(noise, embeds, mask, timesteps=[1000, 750, 500], renoise=False)
            got = fast.generate(noise, embeds, mask, timesteps=[1000, 750, 500], renoise=False)
            alone = compiled.generate(noise, embeds, mask, timesteps=[1000, 750, 500], renoise=False)
            misses = {"graphed": rel(got, want), "compiled alone": rel(alone, want),
                      "graphed vs compiled": rel(got, alone)}
            assert max(misses.values()) <= 1e-3, (chunk, misses)
    assert len(fast.streamer.velocity.graphs) >= 2  # one per state of the past met


def test_graphed_video_avatar_picture_equals_eager_on_cuda():
    from framegraph.models.avatar.video.bundle import random_video_avatar
    from framegraph.models.avatar.video.jaw import kept_share
    from framegraph.models.avatar.video.stages import MouthRegion

    avatar = random_video_avatar(n_frames=4, region_size=64)
    kw = dict(frame_size=(avatar.height, avatar.width), box_side=avatar.box_side, device="cuda", kept_share=True)
    eager = MouthRegion(avatar.generator, avatar.mask, avatar.paste, avatar.reference, **kw)
    fast = MouthRegion(avatar.generator, avatar.mask, avatar.paste, avatar.reference, graphs=True, **kw)
    for box, jaw in zip(avatar.boxes[:3], avatar.jaws):
        frame = torch.randint(0, 256, (avatar.height, avatar.width, 3), dtype=torch.uint8, device="cuda")
        ints = [int(round(float(v))) for v in box]
        b = torch.tensor(ints, dtype=torch.int32, device="cuda")
        shape, kept = torch.randn(3, device="cuda"), kept_share(jaw, ints).cuda()
        assert torch.equal(fast._step(frame, b, shape, kept), eager.picture_at(frame, b, shape, kept))
    assert fast._step.captured


def test_do_bench_replays_a_capturable_op_from_a_cuda_graph_and_measures_peaks():
    from framegraph.apps.bench.timing import do_bench, measure_peaks

    x = torch.randn(1 << 20, device="cuda")
    t = do_bench(lambda: x * 2, "cuda", rep_ms=20)
    assert t["median_ms"] > 0 and t["graph_ms"] is not None and t["reps"] >= 3
    synced = do_bench(lambda: x.sum().item(), "cuda", rep_ms=20)
    assert synced["graph_ms"] is None and "not capturable" in synced["graph_note"]
    peaks = measure_peaks("cuda", copy_mib=256, matmul_n=4096)
    assert peaks["copy_tb_s"] > 0.1 and peaks["matmul_tflop_s"] > 1


def test_a_cuda_stage_downloads_to_a_host_stage_through_pinned_slots():
    from framegraph.stream import Clock, Graph, PortSpec, Stage
    from framegraph.stream.record import IterableSource, RecordingSink

    class Copy(Stage):
        """``fn`` of its input, from a ``src`` port to a ``dst`` port (their devices), copied without blocking."""

        def __init__(self, name, src, dst, fn=lambda x: x):
            super().__init__(name)
            self.inputs = {"x": PortSpec((1 << 16,), torch.float32, src)}
            self.outputs = {"x": PortSpec((1 << 16,), torch.float32, dst)}
            self.fn = fn

        def process(self, inputs, out):
            out.write("x").data.copy_(self.fn(inputs["x"].data), non_blocking=True)

    def square(y):
        for _ in range(20):  # enough GPU work that a missing wait would read stale bytes
            y = y * 1.0
        return y * y

    values = [torch.full((1 << 16,), float(i)) for i in range(30)]
    g = Graph(Clock("fast"))
    src = g.add(IterableSource(values, PortSpec((1 << 16,), torch.float32)))
    up, sq = g.add(Copy("upload", "cpu", "cuda")), g.add(Copy("square", "cuda", "cpu", square))
    sink = g.add(RecordingSink({"x": PortSpec((1 << 16,), torch.float32, "cpu")}))
    g.connect(src, up)
    g.connect(up, sq)
    g.connect(sq, sink)
    g.run()
    got = sink.data()
    assert [float(t[0]) for t in got] == [float(i * i) for i in range(30)]
    assert all(torch.equal(t, torch.full_like(t, float(i * i))) for i, t in enumerate(got))


def test_a_bucketed_batch_replays_one_graph_per_bucket_and_each_row_is_its_own():
    """The compiled runtime's batched video generator on CUDA: 3 rows run as bucket 4's graph, 1 as bucket 1's;
    each row is the eager generator's alone (TF32 and Inductor's rounding apart)."""
    from framegraph.models.avatar.video.lipsync import MouthGenerator
    from framegraph.models.buckets import BucketedStep

    torch.manual_seed(0)
    gen = MouthGenerator(channels=(8, 16, 16, 16), shape_dim=3, sample_size=64).cuda().eval()
    step = BucketedStep(gen, device="cuda", buckets=(1, 2, 4))
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.inference_mode():
        for n in (3, 1, 3):
            inputs = (torch.rand(n, 3, 64, 64, generator=g, device="cuda"), torch.ones(n, 1, 64, 64, device="cuda"),
                      torch.rand(n, 3, 64, 64, generator=g, device="cuda"),
                      torch.randn(n, 3, generator=g, device="cuda"))
            got = step(*inputs)
            for i in range(n):
                assert rel(got[i:i + 1], gen(*(t[i:i + 1] for t in inputs))) <= 1e-3, (n, i)
    assert sorted(step.steps) == [1, 4] and all(s.captured for s in step.steps.values())
    assert step.steps[4].replays == 2
