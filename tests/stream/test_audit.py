"""The launch audit's counter: what it calls a kernel, a host sync and an allocation."""
import torch

from framegraph.stream.audit import OpCounter, count_stage_calls


def counted(fn) -> dict:
    counter = OpCounter()
    with counter:
        fn()
    return counter.counts()


def test_host_reads_and_data_dependent_shapes_are_syncs_each_named():
    x = torch.randn(16)

    def step():
        x.sum().item()
        x.tolist()
        float(x[0])
        bool(x.max() > 0)
        x[x > 0]  # boolean mask: the output's size depends on the data
        x.nonzero()
        torch.repeat_interleave(torch.arange(3), torch.tensor([1, 2, 3]))
        x.cpu()

    c = counted(step)
    assert c["sync_ops"] == {"Tensor.item": 1, "Tensor.tolist": 1, "Tensor.__float__": 1, "Tensor.__bool__": 1,
                             "aten::index": 1, "aten::nonzero": 1, "aten::repeat_interleave": 1, "Tensor.cpu": 1}
    assert c["syncs"] == 8


def test_integer_indexing_views_and_in_place_ops_are_not_syncs():
    x = torch.randn(8, 8)
    rows, cols = torch.arange(4)[:, None], torch.arange(2, 6)[None, :]

    def step():
        y = x[rows, cols]  # integer index tensors: a fixed shape, no read back
        x.view(64).transpose(0, 0)[None].expand(2, 64)  # views launch nothing
        y.mul_(2)
        torch.repeat_interleave(torch.arange(3), torch.tensor([1, 2, 3]), output_size=6)

    c = counted(step)
    assert c["syncs"] == 0, c
    # index, mul_, arange is not called; repeat_interleave (+ its cumsum etc.) are kernels; no view is
    assert c["kernels"] >= 3
    counter = OpCounter()
    with counter:
        x.view(64)
    assert counter.kernels == 0


def test_allocations_are_outputs_with_new_storage():
    x = torch.randn(100)
    out = torch.empty(100)

    def step():
        torch.mul(x, 2, out=out)  # written in place: no allocation
        x.add_(1)
        x.view(10, 10)
        x * 3  # a new tensor: one allocation of 400 bytes

    c = counted(step)
    assert c["allocations"] == 1 and c["allocated_bytes"] == 400


def test_each_stage_call_is_counted_in_the_stages_own_thread():
    from framegraph.stream import Clock, Graph, PortSpec, Stage
    from framegraph.stream.record import IterableSource, RecordingSink

    class Reads(Stage):
        def __init__(self):
            super().__init__("reads")
            self.inputs = {"x": PortSpec((4,))}
            self.outputs = {"x": PortSpec((4,))}

        def process(self, inputs, out):
            x = inputs["x"].data
            out.write("x").data.copy_(x * 2)
            if int(x[0]) > 100:  # one host sync per call
                pass

    g = Graph(Clock("fast"))
    src = g.add(IterableSource([torch.ones(4)] * 5, PortSpec((4,))))
    reads = g.add(Reads())
    g.connect(src, reads)
    g.connect(reads, g.add(RecordingSink({"x": PortSpec((4,))})))
    calls = count_stage_calls([reads])
    g.run()
    assert [c["syncs"] for c in calls["reads"].calls] == [1] * 5
    assert calls["reads"].steady(2) == calls["reads"].calls[2:]
