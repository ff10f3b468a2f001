"""Fixed capacities (``renderers/capacity.py``): read once, then checked one frame late without a host sync."""
import pytest
import torch

from framegraph.renderers.capacity import Capacity
from framegraph.stream.audit import OpCounter


def test_first_size_reads_the_count_with_headroom_rounded_up():
    cap = Capacity(headroom=1.5, quantum=64)
    assert cap.size(torch.tensor(100)) == 192  # 150 rounded up to a multiple of 64
    assert Capacity(quantum=64).size(torch.tensor(0)) == 64  # never below one quantum
    assert Capacity().size(torch.tensor(1000), limit=700) == 700


def test_later_frames_make_no_host_sync_and_grow_one_frame_late():
    cap = Capacity(headroom=1.0, quantum=1)
    assert cap.size(torch.tensor(10)) == 10
    counter = OpCounter()
    with counter:
        assert cap.size(torch.tensor(25)) == 10  # this frame overflows: it cannot know yet
        assert cap.size(torch.tensor(5)) == 25  # the previous frame's count arrived: grown
        assert cap.size(torch.tensor(5)) == 25
    assert counter.syncs == 0
    assert cap.overflows == 1 and cap.peak == 25


@pytest.mark.gpu
def test_on_cuda_the_count_reaches_the_host_without_a_sync_and_the_capacity_grows_once_it_has():
    """The CUDA path: the count is copied into pinned memory behind an event; a frame whose copy has not landed
    yet leaves the capacity as it is, the first frame after it has landed grows it."""
    cap = Capacity(headroom=1.0, quantum=1)
    assert cap.size(torch.tensor(10, device="cuda")) == 10
    counter = OpCounter()
    with counter:
        assert cap.size(torch.tensor(25, device="cuda")) == 10  # overflows: it cannot know yet
        torch.cuda.synchronize()  # the copy lands (in a stream: a frame or so later)
        assert cap.size(torch.tensor(5, device="cuda")) == 25
    assert counter.syncs == 0
    assert cap.overflows == 1 and cap.peak == 25


@pytest.mark.gpu
def test_on_cuda_an_overflow_whose_copy_lands_late_is_still_seen_after_a_smaller_frame():
    """The overflowing frame's count is still on its way when the next frame (which fits) records its own: the
    maximum the later copy carries holds the overflow, so it is not lost."""
    cap = Capacity(headroom=1.0, quantum=1)
    counts = {n: torch.tensor(n, device="cuda") for n in (10, 25, 5)}  # uploaded now, not behind the sleep
    assert cap.size(counts[10]) == 10
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time queued before the next count: its copy lands late
    assert cap.size(counts[25]) == 10  # overflows
    assert cap.size(counts[5]) == 10  # the overflow's copy has not landed: nothing known yet
    torch.cuda.synchronize()
    assert cap.size(counts[5]) == 25  # the overflow, seen though a smaller frame came after
    assert cap.overflows == 1 and cap.peak == 25
