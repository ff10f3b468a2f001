"""Ring policies, one producer and one consumer, without a graph."""
import threading
import time

import pytest
import torch

from framegraph.stream import PortSpec, Ring, RingAborted

SPEC = PortSpec((2,), torch.float32)


def put(ring, value):
    f = ring.acquire_write()
    f.data.fill_(value)
    f.seq = value
    ring.publish(f)


def get(ring):
    assert ring.has_frame()
    f = ring.take()
    v = int(f.data[0])
    ring.release(f)
    return v


def test_slots_are_preallocated_and_reused():
    ring = Ring(SPEC, capacity=2)
    ptrs = {f.data.data_ptr() for f in ring.slots}
    for i in range(10):
        put(ring, i)
        assert get(ring) == i
    assert {f.data.data_ptr() for f in ring.slots} == ptrs


def test_block_policy_waits_for_the_consumer():
    ring = Ring(SPEC, capacity=2, policy="block")
    put(ring, 0)
    put(ring, 1)
    done = threading.Event()

    def producer():
        put(ring, 2)  # must wait: both slots hold unread frames
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    assert not done.wait(0.2)
    assert get(ring) == 0
    assert done.wait(2)
    t.join()
    assert [get(ring), get(ring)] == [1, 2]
    assert ring.drops == 0


@pytest.mark.parametrize("policy, kept", [("drop_oldest", [3, 4]), ("drop_newest", [0, 1])])
def test_a_dropping_ring_keeps_the_frames_its_policy_names(policy, kept):
    ring = Ring(SPEC, capacity=2, policy=policy)
    for i in range(5):
        put(ring, i)
    assert ring.drops == 3
    assert [get(ring), get(ring)] == kept
    assert not ring.has_frame()


def test_drop_oldest_with_one_slot_asked_still_delivers_to_a_slow_paced_consumer():
    from helpers import Collect

    from framegraph.stream import Clock, CountSource, Graph

    g = Graph(Clock("realtime"))
    s, k = g.add(CountSource(20, fps=50)), g.add(Collect(delay_s=0.03))
    g.connect(s, k, policy="drop_oldest", capacity=1)
    report = g.run(timeout=10)
    assert report["edges"][0]["capacity"] == 2
    assert len(k.got) >= 8 and k.values()[-1] == 19.0  # ~every other frame, and always the newest


def test_latest_gives_newest_and_repeats_it():
    ring = Ring(SPEC, capacity=1, policy="latest")
    assert ring.capacity == 3
    for i in range(4):
        put(ring, i)
    assert get(ring) == 3
    assert get(ring) == 3  # no newer value: the same one again
    put(ring, 7)
    assert get(ring) == 7
    assert ring.drops == 3  # 0, 1, 2 were superseded unread


def test_latest_never_blocks_the_writer_while_read():
    ring = Ring(SPEC, policy="latest")
    put(ring, 1)
    held = ring.take()
    for i in range(100):  # the reader holds a slot the whole time
        put(ring, i)
    assert int(held.data[0]) == 1


def test_drop_callback_reports_dropped_frames():
    ring = Ring(SPEC, capacity=2, policy="drop_oldest")
    dropped = []
    ring.on_drop = lambda f: dropped.append(f.seq)
    for i in range(4):
        put(ring, i)
    assert dropped == [0, 1]


def test_close_lets_the_consumer_finish_then_reports_finished():
    ring = Ring(SPEC, capacity=2)
    put(ring, 5)
    ring.close()
    assert not ring.finished
    assert get(ring) == 5
    assert ring.finished
    with pytest.raises(RuntimeError, match="after end of stream"):
        ring.acquire_write()


def test_abort_wakes_a_blocked_producer():
    ring = Ring(SPEC, capacity=1)
    put(ring, 0)
    err = []

    def producer():
        try:
            ring.acquire_write()
        except RingAborted as e:
            err.append(e)

    t = threading.Thread(target=producer)
    t.start()
    time.sleep(0.05)
    ring.abort()
    t.join(1)
    assert not t.is_alive() and err


@pytest.mark.parametrize("kwargs, match", [
    ({"policy": "newest"}, "unknown policy"),
    ({"capacity": 0}, "capacity must be 1..8"),
])
def test_bad_ring_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Ring(SPEC, **kwargs)
