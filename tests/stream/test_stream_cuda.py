"""The runtime on CUDA: one stream per stage, event hand-off, no device-wide synchronize (GPU only)."""
import pytest
import torch
from helpers import AddOne, Collect

from framegraph.stream import CountSource, Graph

pytestmark = pytest.mark.gpu


class CudaAdd(AddOne):
    def __init__(self, name, shape):
        super().__init__(name, shape)
        for ports in (self.inputs, self.outputs):
            for k, spec in ports.items():
                ports[k] = type(spec)(spec.shape, spec.dtype, "cuda")

    def process(self, inputs, out):
        f = out.write("x")
        x = inputs["x"].data
        for _ in range(20):  # enough work that a missing wait would read stale data
            x = x * 1.0001
        torch.add(inputs["x"].data, 1, out=f.data)
        assert torch.cuda.current_stream() == self.ctx.stream


def test_cuda_chain_hands_frames_on_with_events_in_order():
    shape = (1 << 20,)
    g = Graph()
    src = g.add(CountSource(200, shape=shape, device="cuda"))
    a, b = g.add(CudaAdd("a", shape)), g.add(CudaAdd("b", shape))

    class ToHost(Collect):
        """Reads each frame's first and last element on the host into ``host``. It replaces Collect's process,
        so it keeps no records (no host copies of 200 frames of 4 MB), and Collect.got, built from the
        records, stays empty."""

        def __init__(self):
            super().__init__(shape=shape)
            self.inputs = {"x": type(self.inputs["x"])(shape, torch.float32, "cuda")}
            self.host: list[tuple[float, float, int]] = []  # (first, last, seq) per frame, in arrival order

        def process(self, inputs, out):
            d = inputs["x"].data
            self.host.append((float(d[0].item()), float(d[-1].item()), inputs["x"].seq))

    k = g.add(ToHost())
    g.connect(src, a)
    g.connect(a, b)
    g.connect(b, k)
    g.run(timeout=60)
    assert [first for first, _, _ in k.host] == [i + 2.0 for i in range(200)]
    assert all(first == last for first, last, _ in k.host)
    streams = {n.stream for n in g._nodes}
    assert len(streams) == 4 and None not in streams


def test_upload_and_download_stages_order_work_with_events():
    from framegraph.stream import PortSpec, Stage

    shape = (1 << 18,)

    class Move(Stage):
        def __init__(self, name, src, dst):
            super().__init__(name)
            self.inputs = {"x": PortSpec(shape, torch.float32, src)}
            self.outputs = {"x": PortSpec(shape, torch.float32, dst)}

        def process(self, inputs, out):
            out.write("x").data.copy_(inputs["x"].data * 2)

    g = Graph()
    src = g.add(CountSource(50, shape=shape))
    up, down = g.add(Move("up", "cpu", "cuda")), g.add(Move("down", "cuda", "cpu"))
    k = g.add(Collect(shape=shape))
    g.connect(src, up)
    g.connect(up, down)
    g.connect(down, k)
    g.run(timeout=60)
    assert k.values() == [4.0 * i for i in range(50)]
