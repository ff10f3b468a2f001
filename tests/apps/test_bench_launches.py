"""The launch audit (``framegraph bench launches``) on the CPU: no steady-state frame of a GPU path reads a value
back to the host. A stage that gains a ``.item()``, a ``.tolist()``, a ``bool(tensor)``, a ``nonzero`` or a
boolean mask in its steady state fails here, naming the stage and the op."""
import argparse
import json

import pytest

from framegraph.apps.bench import launches
from framegraph.apps.cli import main

# Every pipeline, the renderers on their sync-free path (fixed-capacity tile lists, a fixed-shape march).
SYNC_FREE = ["avatar", "video_avatar", "generate", "3dgs", "4dgs", "nerf"]


def _args(**kw) -> argparse.Namespace:
    base = dict(frames=8, warmup=3, device="cpu", video_region=64, gaussians=300, render_size=(48, 32))
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize("pipeline", SYNC_FREE)
def test_steady_state_frames_make_no_host_sync(pipeline):
    result = launches.audit(pipeline, _args())
    assert result["steady_units"] >= 4
    bad = {n: s["sync_ops"] for n, s in result["stages"].items() if s["device_stage"] and s["sync_ops"]}
    assert bad == {}, f"{pipeline}: host syncs in a steady-state step: {bad}"
    assert result["meets_target"]
    assert result["per_unit"]["kernels"] > 0 and result["per_unit"]["allocations"] > 0
    overflows = {n: s["capacity_overflows"] for n, s in result["stages"].items() if "capacity_overflows" in s}
    assert all(v == 0 for v in overflows.values()), overflows  # no frame of the orbit lost work to a capacity
    assert bool(overflows) == (pipeline in ("3dgs", "4dgs", "nerf"))


def test_a_sync_added_to_a_steady_state_step_is_caught(monkeypatch):
    from framegraph.models.composite import Composite

    inner = Composite.process

    def process(self, inputs, out):
        inner(self, inputs, out)
        if inputs["face"].data.float().mean().item() > 1e9:  # reads a value back: a host sync
            raise AssertionError

    monkeypatch.setattr(Composite, "process", process)
    result = launches.audit("avatar", _args())
    assert not result["meets_target"]
    assert result["stages"]["composite"]["sync_ops"] == {"Tensor.item": result["stages"]["composite"]["calls"]}


def test_command_writes_json_and_table(tmp_path, capsys):
    out = tmp_path / "launches.json"
    assert main(["bench", "launches", "--pipelines", "video_avatar", "--frames", "6", "--warmup", "2",
                 "--video-region", "64", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["benchmark"] == "launches" and data["pipelines"][0]["pipeline"] == "video_avatar"
    assert "load_average_1_5_15min" in data and (tmp_path / "launches.png").exists()
    assert "target 0 syncs: met" in capsys.readouterr().out
