"""The model service: sessions' graphs share one model, their calls run in batches on the lane's thread. Real engines
(a video avatar's generator), real graphs and threads: each session's frames are those it makes alone; a session
cancelled mid-batch, one whose request makes the batch fail, one whose deadline cannot be met hold up nobody;
sessions past the lane's capacity get fair shares; 20 sessions leave no thread behind."""
import threading
import time

import numpy as np
import pytest
import torch
from helpers import avatar_session

from framegraph.models.avatar import RunSettings, random_video_avatar
from framegraph.stream.batching import Cancelled, Full, Lane, Missed, ModelService
from framegraph.stream.media import SAMPLE_RATE


@pytest.fixture(scope="module")
def avatar():
    return random_video_avatar()


def speech(freq: float, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(SAMPLE_RATE * seconds)) / SAMPLE_RATE
    return (np.sin(2 * np.pi * freq * t) * 6000 * (np.sin(2 * np.pi * 3 * t) > 0)).astype(np.int16)


def alone(avatar, audio) -> np.ndarray:
    graph, sink = avatar_session(avatar, audio)
    graph.run(timeout=60)
    return torch.stack(sink.data()).numpy()


def side_by_side(avatar, audios, service, cancel: int | None = None):
    runs = [avatar_session(avatar, a, RunSettings(batching=service)) for a in audios]
    for graph, _ in runs:
        graph.start()
    if cancel is not None:
        sink = runs[cancel][1]
        while len(sink.data()) < 5:  # mid-stream: its requests are in the lane's batches
            time.sleep(0.005)
        runs[cancel][0].cancel()
    for graph, _ in runs:
        graph.join(60)
    return [torch.stack(sink.data()).numpy() if sink.data() else None for _, sink in runs]


def test_each_session_gets_the_frames_it_makes_alone(avatar):
    audios = [speech(f) for f in (150, 180, 220)]
    want = [alone(avatar, a) for a in audios]
    service = ModelService()
    got = side_by_side(avatar, audios, service)
    for g, w in zip(got, want):
        assert g.shape == w.shape == (25, avatar.height, avatar.width, 3)
        assert np.array_equal(g, w)
    (lane,) = service.lanes().values()
    assert max(lane.stats.batches) >= 2  # the sessions' calls did share batches
    assert lane.stats.served == 3 * 25 + 1  # and one warm-up of the picture step
    assert set(lane.cost_ns) >= {1, 2, 4, 8}  # measured once, by the first of the three sessions set up at once
    assert not lane.running


def test_a_session_cancelled_mid_batch_holds_up_nobody(avatar):
    audios = [speech(f, 2.0) for f in (150, 180, 220)]
    want = [alone(avatar, a) for a in audios]
    service = ModelService()
    t0 = time.monotonic()
    got = side_by_side(avatar, audios, service, cancel=1)
    assert time.monotonic() - t0 < 30
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[2], want[2])
    assert 5 <= len(got[1]) < 50 and np.array_equal(got[1], want[1][:len(got[1])])
    assert not any(t.name.startswith("framegraph:batch") for t in threading.enumerate())


def rows(avatar, n: int, seed: int = 0):
    """``n`` requests to the generator, each ``(masked, mask, reference, shape)`` of one row."""
    S, g = avatar.region_size, torch.Generator().manual_seed(seed)
    mask = avatar.mask[None, None].float()
    return [(torch.rand(1, 3, S, S, generator=g) * (1 - mask), mask, torch.rand(1, 3, S, S, generator=g),
             torch.randn(1, 3, generator=g)) for _ in range(n)]


def calls_side_by_side(clients, requests):
    """Each client calls with its request on its own thread at once; what each got (a tensor or an exception)."""
    got = [None] * len(clients)

    def call(i):
        try:
            got[i] = clients[i](*requests[i]).clone()
        except Exception as exc:  # noqa: BLE001 - what the session would see
            got[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return got


def test_a_request_that_fails_its_batch_fails_alone(avatar):
    service = ModelService(window_ms=200)  # the four requests are gathered into one batch
    clients = [service.client("generator", avatar.generator) for _ in range(4)]
    for c in clients:
        c.open()
    requests = rows(avatar, 4)
    requests[2] = tuple(t.double() for t in requests[2])  # this session's model call raises (float64 vs weights)
    got = calls_side_by_side(clients, requests)
    with torch.no_grad():
        for i in (0, 1, 3):
            assert torch.equal(got[i], avatar.generator(*requests[i]))
    assert isinstance(got[2], RuntimeError)
    lane = clients[0].lane
    assert lane.stats.failed == 1 and lane.stats.served == 3
    with pytest.raises(ValueError, match=r"shapes \[\[1, 3, 64, 64\], \[1, 1, 64, 64\].*this model runs"):
        clients[0](torch.zeros(1, 3, 64, 64), torch.zeros(1, 1, 64, 64), torch.zeros(1, 3, 64, 64),
                   torch.zeros(1, 4))
    for c in clients:
        c.close()
    assert not lane.running


def test_a_deadline_that_cannot_be_met_is_dropped_or_run_alone(avatar):
    service = ModelService()
    drop = service.client("generator", avatar.generator)
    late = service.client("generator", avatar.generator, on_miss="run")
    lane = drop.lane
    lane.warm(rows(avatar, 1)[0], sizes=(1, 2))
    assert lane.cost(1) > 0 and lane.capacity(fps=1e6) == 0 and lane.capacity(fps=1.0) == 2
    drop.open()
    late.open()
    (request,) = rows(avatar, 1)
    past = time.monotonic_ns() - 1
    with pytest.raises(Missed, match="deadline passed before it could start"):
        drop(*request, deadline_ns=past)
    with torch.no_grad():
        assert torch.equal(late(*request, deadline_ns=past), avatar.generator(*request))
    assert torch.equal(drop(*request, deadline_ns=time.monotonic_ns() + 10**10), late(*request))
    assert lane.stats.missed == 1 and lane.stats.late == 1
    drop.close()
    late.close()


def test_a_batch_is_as_large_as_the_earliest_deadline_allows(avatar):
    from framegraph.stream.batching import _Request

    service = ModelService()
    lane = service.lane("generator", avatar.generator)
    lane.warm(rows(avatar, 1)[0], sizes=(1, 8), repeats=10)  # the fastest of 10: a busy CPU inflates a few
    assert lane.cost(8) > 2 * lane.cost(1)

    def chosen(slack_ns):
        clients = [service.client("generator", avatar.generator) for _ in range(8)]
        requests = [_Request(c, r, None, "drop") for c, r in zip(clients, rows(avatar, 8))]
        requests[3].deadline_ns = time.monotonic_ns() + slack_ns  # the earliest, whatever its place in the queue
        for r in requests:
            lane.submit(r)
        with lane._cv:
            batch, dropped = lane._choose()
            lane._pending.clear()
        return [requests.index(r) for r in batch], [requests.index(r) for r in dropped]

    assert chosen(10**10) == ([3, 0, 1, 2, 4, 5, 6, 7], [])  # time to spare: one batch of all, earliest first
    # a batch of two would end cost(2) - cost(1) later than it alone, more than its slack: it runs alone
    assert chosen(int(lane.cost(1) / 2)) == ([3], [])
    assert chosen(-1) == ([0, 1, 2, 4, 5, 6, 7], [3])  # its start has passed: dropped, the others batched


def test_a_cancelled_call_returns_at_once_and_the_next_session_runs(avatar):
    service = ModelService(window_ms=0)
    lane = service.lane("generator", avatar.generator)
    clients = [service.client("generator", avatar.generator) for _ in range(2)]
    for c in clients:
        c.open()
    requests = rows(avatar, 2)
    errors = []

    def loop(c, request):
        try:
            while True:
                c(*request)
        except Cancelled as exc:
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(c, r)) for c, r in zip(clients, requests)]
    for t in threads:
        t.start()
    while lane.stats.served < 10:
        time.sleep(0.002)
    clients[0].cancel()
    threads[0].join(5)
    assert not threads[0].is_alive() and len(errors) == 1
    served = lane.stats.served
    while lane.stats.served < served + 5:  # the other session goes on
        time.sleep(0.002)
    clients[1].close()
    threads[1].join(5)
    clients[0].close()
    assert len(errors) == 2 and not lane.running
    clients[0].open()  # a new session on the same client runs again
    with torch.no_grad():
        assert torch.equal(clients[0](*requests[0]), avatar.generator(*requests[0]))
    clients[0].close()


def test_sessions_past_the_lanes_capacity_get_fair_shares(avatar):
    """Five live sessions each ask for a frame every period, due by the next, from a lane that runs two rows a batch
    and four rows a period: past its capacity. Each gets the same share of frames (within 5 %), none starved; the
    frames the lane could not start in time are dropped, about as many for each, and a stage skips the frames whose
    time passed while it waited."""
    service = ModelService(max_batch=2, window_ms=0)
    clients = [service.client("generator", avatar.generator) for _ in range(5)]
    requests = rows(avatar, 5)
    lane = clients[0].lane
    lane.warm(requests[0], sizes=(1, 2), repeats=5)
    period_ns = int(2 * lane.cost(2))  # two batches of two a period: four of the five sessions' frames
    served, missed = [0] * 5, [0] * 5
    t0, end = time.monotonic_ns() + 10**8, time.monotonic_ns() + 10**8 + 2 * 10**9

    def session(i):
        k = 0
        while (due := t0 + k * period_ns) < end:
            time.sleep(max(0.0, (due - time.monotonic_ns()) / 1e9))
            try:
                clients[i](*requests[i], deadline_ns=due + period_ns)
                served[i] += 1
            except Missed:
                missed[i] += 1
            k = max(k + 1, (time.monotonic_ns() - t0) // period_ns + 1)  # the frames whose time passed: skipped

    for c in clients:
        c.open()
    threads = [threading.Thread(target=session, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for c in clients:
        c.close()
    mean = sum(served) / 5
    assert mean > 20 and all(abs(n - mean) <= 0.05 * mean + 1 for n in served), (served, missed)
    assert max(lane.stats.batches) == 2


def test_twenty_sessions_leave_no_thread_behind(avatar):
    service = ModelService()
    audio = speech(180, 0.2)
    side_by_side(avatar, [audio, audio], service)  # the graphs' parked workers exist from here on
    before = {t.ident for t in threading.enumerate()}
    for _ in range(10):
        got = side_by_side(avatar, [audio, audio], service)
        assert all(len(g) == 5 for g in got)
    after = {t.ident for t in threading.enumerate()}
    assert after <= before  # the graphs' workers are reused; the lane's thread ended with its last session
    (lane,) = service.lanes().values()
    assert not lane.running


def test_a_lane_refuses_max_batch_zero():
    with pytest.raises(ValueError, match="max_batch 0; expected at least 1"):
        Lane(lambda x: x, max_batch=0)


def test_a_service_that_admits_refuses_the_session_its_measured_cost_cannot_fit():
    # wider than the trained bundles' generator, at a 256² region: on one thread a batch of 2 takes several frames
    heavy = random_video_avatar(region_size=256, generator_channels=(32, 64, 128, 128))
    service = ModelService(admit=True)
    first, _ = avatar_session(heavy, speech(150, 3.0), RunSettings(batching=service))
    first.start()  # its setup opens its client and measures the lane's cost per batch size
    (lane,) = service.lanes().values()
    assert lane.sessions == 1 and lane.cost(2) > 40e6 and lane.capacity(25.0) <= 1
    with pytest.raises(Full, match=r"1 session\(s\) already fill this model's time on this machine \(a batch of 2 "
                                   r"is expected to take \d+\.\d ms, one frame at 25 fps is 40.0 ms\)"):
        avatar_session(heavy, speech(180), RunSettings(batching=service))
    service.admit = False  # a service that does not admit (a benchmark past capacity) gives every client
    second, _ = avatar_session(heavy, speech(180, 0.2), RunSettings(batching=service))
    second.cancel()
    service.admit = True
    first.cancel()
    first.join(60)
    assert lane.sessions == 0 and not lane.running
    # room again once the first has gone
    third, _ = avatar_session(heavy, speech(220, 0.2), RunSettings(batching=service))
    third.cancel()


@pytest.mark.gpu
def test_on_cuda_each_session_stream_and_the_lanes_are_ordered_by_events():
    """Sessions on their own CUDA streams write their inputs just before calling, and read the result at once. The
    lane's stream waits for each request's writes, and each caller's stream waits for its row's copy, without a
    device-wide wait. Every row is the session's own, on every call (a missing wait reads half-written inputs)."""
    service = ModelService(max_batch=4, window_ms=5.0)
    weight = torch.randn(1024, 1024, device="cuda") / 32

    def run(x):
        for _ in range(8):  # long enough on the lane's stream for a reader that did not wait to see stale rows
            x = torch.tanh(x @ weight)
        return x

    errors, sessions = [], 4
    start = threading.Barrier(sessions)

    def session(i):
        client = service.client(("cuda-order",), run, name="order")
        client.open()
        stream = torch.cuda.Stream()
        g = torch.Generator(device="cuda").manual_seed(i)
        start.wait()
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(20):
                x = torch.randn(1, 1024, 1024, device="cuda", generator=g)
                for _ in range(4):  # the inputs are still being written when the call is made
                    x = torch.tanh(x @ weight)
                got = client(x).clone()  # read on this stream right away
                stream.synchronize()
                want = run(x)
                torch.cuda.synchronize()
                errors.append((got - want).abs().max().item())
        client.close()

    threads = [threading.Thread(target=session, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(errors) == 20 * sessions and max(errors) < 1e-3, max(errors)
    (lane,) = service.lanes().values()
    assert max(lane.stats.batches) > 1  # the calls were really batched
