"""One runtime choice: the registry names what each model runs on, stages compute with the engine they are given."""
import pytest
import torch

from framegraph.models import runtime
from framegraph.models.avatar import RunSettings, build_avatar_graph, random_avatar, random_video_avatar
from framegraph.models.dit import Denoiser, TorchDiT
from framegraph.stream import Clock, Graph, IterableSource, PortSpec, RecordingSink
from framegraph.stream.media import PushAudioSource


def test_the_registry_lists_each_models_runtimes():
    assert runtime.runtimes("avatar-portrait") == ("torch", "compiled", "onnx", "onnx-int8")
    assert runtime.runtimes("avatar-video") == ("torch", "compiled", "onnx")
    assert runtime.runtimes("generate-vae") == ("torch", "compiled", "onnx")
    assert runtime.runtimes("generate-denoiser") == ("torch", "compiled")
    with pytest.raises(ValueError, match="runtime 'tensorrt' is not one of torch, compiled, onnx, onnx-int8"):
        runtime.check("avatar-portrait", "tensorrt")
    with pytest.raises(ValueError, match="generate-vae runs on torch, compiled or onnx, not 'onnx-int8'"):
        runtime.check("generate-vae", "onnx-int8")
    assert runtime.default_runtime("cpu") == "torch" and runtime.default_runtime("cuda") == "compiled"


def test_batched_engines_run_where_their_runtime_runs():
    """The server batches a session where its model's batched engine runs: torch, eager or compiled, on the CPU or
    CUDA, ONNX Runtime on the CPU; a runtime with no batched engine (int8) never."""
    where = {(r, d): runtime.batches("avatar-video-batch", r, d) for r in ("torch", "compiled", "onnx", "onnx-int8")
             for d in ("cpu", "cuda", "cuda:1", "mps")}
    assert {k for k, v in where.items() if v} == {(r, d) for r in ("torch", "compiled") for d in ("cpu", "cuda",
                                                                                                "cuda:1")} | {
        ("onnx", "cpu")}
    assert runtime.check_batched("avatar-video-batch", "torch", "cuda") == "torch"
    with pytest.raises(ValueError, match="batching on onnx runs on the CPU; got device 'cuda'"):
        runtime.check_batched("avatar-video-batch", "onnx", "cuda")


def test_every_factory_the_registry_names_is_a_function_of_its_module():
    import importlib
    import inspect

    for model, factories in runtime.FACTORIES.items():
        assert set(factories) <= set(runtime.RUNTIMES), model
        for name, where in factories.items():
            module, function = where.split(":")
            assert inspect.isfunction(getattr(importlib.import_module(module), function)), (model, name)


@pytest.mark.parametrize("gpu", [False, True])
def test_the_default_device_follows_the_runtime(monkeypatch, gpu):
    """With a GPU, torch and compiled runs go to it and the ONNX runtimes stay on the CPU (ONNX Runtime's CPU
    provider); `render --avatar --runtime compiled` used to default to the CPU there. Without one, all on the CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    expected = {"torch": "cuda", "compiled": "cuda", "onnx": "cpu", "onnx-int8": "cpu"} if gpu else \
        dict.fromkeys(runtime.RUNTIMES, "cpu")
    assert {r: runtime.default_device(r) for r in runtime.RUNTIMES} == expected
    assert runtime.default_device() == ("cuda" if gpu else "cpu")


def test_a_video_avatar_refuses_a_runtime_it_lacks():
    with pytest.raises(ValueError, match="avatar-video runs on torch, compiled or onnx, not 'onnx-int8'"):
        build_avatar_graph(random_video_avatar(), PushAudioSource(), settings=RunSettings(runtime="onnx-int8"))


def test_an_onnx_runtime_without_an_export_names_the_export_command(tmp_path):
    from framegraph.models.onnx import ExportError

    with pytest.raises(ExportError, match="framegraph export --avatar"):
        build_avatar_graph(random_avatar(), PushAudioSource(),
                           settings=RunSettings(runtime="onnx", onnx_dir=str(tmp_path)))


class CountingDiT(TorchDiT):
    """The torch engine, counting its calls: the stage must compute through the engine it was given."""

    def __init__(self, model):
        super().__init__(model)
        self.calls = {"start": 0, "reset": 0, "generate": 0}

    def start(self, reference):
        self.calls["start"] += 1
        super().start(reference)

    def reset(self):
        self.calls["reset"] += 1
        super().reset()

    def generate(self, *args):
        self.calls["generate"] += 1
        return super().generate(*args)


def test_a_stage_computes_with_the_injected_engine():
    a = random_avatar()
    c = a.dit.config
    feats = [torch.randn(c.audio_dim) for _ in range(3)]
    out = {}
    for name, engine in (("default", TorchDiT), ("counted", CountingDiT)):
        g = Graph(Clock("fast"))
        src = g.add(IterableSource(feats, PortSpec((c.audio_dim,)), port="features", name="features"))
        state = g.add(IterableSource([torch.tensor([0.0, 1.0, 0.0, 1.0])] * 3, PortSpec((4,)), port="state",
                                     name="state"))
        den = g.add(Denoiser(a.dit, a.reference_latent(), steps=1, engine=engine))
        sink = g.add(RecordingSink({"latent": den.outputs["latent"]}))
        g.connect(src, den, "features")
        g.connect(state, den, "state")
        g.connect(den, sink)
        g.run(timeout=60)
        out[name] = torch.stack(sink.data())
        if name == "counted":
            assert den.engine.calls == {"start": 1, "reset": 0, "generate": 3}
    assert torch.equal(out["default"], out["counted"])
