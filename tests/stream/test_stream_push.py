"""PushSource: values handed in from another thread reach the graph; the newest wins, nothing queues."""
import threading
import time

import pytest
import torch
from helpers import framegraph_threads

from framegraph.stream import Clock, Graph, PortSpec, PushSource, RecordingSink


def test_pushed_values_arrive_in_order_and_the_newest_replaces_a_pending_one():
    g = Graph(Clock("realtime"))
    src = g.add(PushSource(PortSpec((2, 2), torch.float32), name="pose"))
    k = g.add(RecordingSink({"value": PortSpec((2, 2))}))
    g.connect(src, k, "value")
    src.push(torch.full((2, 2), -2.0))  # pushed before the graph runs: still pending when the next comes
    src.push(torch.full((2, 2), -1.0))
    g.start()
    for i in range(5):
        time.sleep(0.05)  # each one is taken before the next
        src.push(torch.full((2, 2), float(i)))
    time.sleep(0.05)
    src.close()
    g.join(10)
    assert [float(v[0, 0]) for v in k.data()] == [-1.0, 0.0, 1.0, 2.0, 3.0, 4.0]
    assert src.received == 7 and src.superseded == 1
    assert k.pts() == sorted(k.pts())  # stamped at arrival
    assert not framegraph_threads()


def test_bad_values_are_refused_with_the_reason():
    src = PushSource(PortSpec((4, 4), torch.float32), name="pose")
    with pytest.raises(ValueError, match=r"pose: expected a value of shape \[4, 4\], got \[3, 3\]"):
        src.push(torch.eye(3))
    with pytest.raises(ValueError, match="NaN or infinite"):
        src.push(torch.full((4, 4), float("nan")))
    src.close()
    with pytest.raises(ValueError, match="push after close"):
        src.push(torch.eye(4))


def test_a_push_from_another_thread_wakes_the_source_and_cancel_ends_it():
    g = Graph(Clock("realtime"))
    src = g.add(PushSource(PortSpec((1,), torch.float32)))
    k = g.add(RecordingSink({"value": PortSpec((1,))}))
    g.connect(src, k, "value")
    g.start()
    threading.Thread(target=lambda: (time.sleep(0.1), src.push([7.0]))).start()
    deadline = time.monotonic() + 5
    while not k.records and time.monotonic() < deadline:
        time.sleep(0.01)
    assert k.records and float(k.records[0].data[0]) == 7.0
    g.cancel()
    g.join(5)
    assert not framegraph_threads()
