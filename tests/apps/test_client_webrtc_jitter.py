"""The Python WebRTC client's video jitter buffer (:class:`VideoJitterBuffer`), fed real RTP packets: pictures
encoded by aiortc's own H.264 encoder and packetized by it (several packets a frame), depayloaded as aiortc's
receiver does, and the released frames decoded by aiortc's H.264 decoder. Sequence numbers wrap during each
stream. Loss, reordering and retransmission are made by the order in which packets are handed in."""
import fractions
import random

import numpy as np
import pytest

aiortc = pytest.importorskip("aiortc", reason="WebRTC needs aiortc: pip install 'framegraph[webrtc]'")

from aiortc.codecs.h264 import H264Decoder, H264Encoder, h264_depayload  # noqa: E402
from aiortc.rtp import RtpPacket  # noqa: E402

from framegraph.apps.client_webrtc import KEYFRAME_WAITS, VideoJitterBuffer, starts_h264_keyframe  # noqa: E402

FPS, WAIT_MS, MS = 25, 60.0, 1_000_000  # MS: ns in a millisecond


def rtp_stream(n_frames: int, keyframes: set[int], first_seq: int = 65_530) -> list[list[RtpPacket]]:
    """``n_frames`` noisy 320x240 pictures as aiortc sends them: key frames at ``keyframes``, each frame's packets
    (the last with the marker bit), 90 kHz timestamps, sequence numbers from ``first_seq`` (wrapping)."""
    import av

    encoder, rng, seq, frames = H264Encoder(), np.random.default_rng(0), first_seq, []
    encoder.target_bitrate = 3_000_000  # its most: noise then takes several packets a frame
    for i in range(n_frames):
        picture = av.VideoFrame.from_ndarray(rng.integers(0, 256, (240, 320, 3), np.uint8), format="rgb24")
        picture.pts, picture.time_base = i * 90_000 // FPS, fractions.Fraction(1, 90_000)
        payloads, timestamp = encoder.encode(picture, force_keyframe=i in keyframes)
        packets = []
        for k, payload in enumerate(payloads):
            p = RtpPacket(payload_type=96, marker=int(k == len(payloads) - 1), sequence_number=seq % 2**16,
                          timestamp=timestamp, payload=payload)
            p._data = h264_depayload(payload)  # as aiortc's receiver does before its jitter buffer
            packets.append(p)
            seq += 1
        frames.append(packets)
    return frames


@pytest.fixture(scope="module")
def stream() -> list[list[RtpPacket]]:
    frames = rtp_stream(12, keyframes={0, 7})
    assert all(len(f) >= 2 for f in frames), "each frame should take several packets"
    return frames


def decoded(frames) -> int:
    """How many pictures aiortc's decoder makes of the released frames (it raises on what it cannot decode)."""
    decoder = H264Decoder()
    return sum(len(decoder.decode(f)) for f in frames)


def feed(buffer: VideoJitterBuffer, packets, now_ns: int = 0) -> tuple[bool, list]:
    pli, out = False, []
    for p in packets:
        asked, frames = buffer.add(p, now_ns)
        pli, out = pli or asked, out + frames
    return pli, out


def test_a_key_frame_starts_where_its_first_packet_is(stream):
    assert [starts_h264_keyframe(f[0]._data) for f in stream] == [i in (0, 7) for i in range(len(stream))]
    assert not any(starts_h264_keyframe(p._data) for f in stream for p in f[1:])


def test_each_frame_comes_out_on_its_last_packet_and_decodes(stream):
    buffer, released = VideoJitterBuffer(WAIT_MS), []
    for frame in stream:
        pli, out = feed(buffer, frame[:-1])
        assert (pli, out) == (False, []), "released before its last packet"
        pli, out = feed(buffer, frame[-1:])
        assert not pli and [f.timestamp for f in out] == [frame[0].timestamp]  # not waiting for the next frame
        assert out[0].data == b"".join(p._data for p in frame)
        assert buffer.deadline_ns is None
        released += out
    assert decoded(released) == len(stream)


def test_frames_behind_a_late_packet_all_come_out_when_it_does_within_the_deadline(stream):
    buffer = VideoJitterBuffer(WAIT_MS)
    assert len(feed(buffer, [p for f in stream[:2] for p in f])[1]) == 2
    late = stream[2][1]
    pli, out = feed(buffer, [p for f in stream[2:6] for p in f if p is not late], now_ns=10 * MS)
    assert (pli, out) == (False, []) and buffer.deadline_ns == 10 * MS + WAIT_MS * MS
    assert buffer.expire(10 * MS + WAIT_MS * MS - 1) == (False, [])
    pli, out = buffer.add(late, 10 * MS + WAIT_MS * MS - 1)  # the retransmission, just in time
    assert not pli and [f.timestamp for f in out] == [f[0].timestamp for f in stream[2:6]]
    assert buffer.deadline_ns is None


def test_a_packet_that_never_comes_is_given_up_on_and_play_resumes_at_the_next_key_frame(stream):
    buffer = VideoJitterBuffer(WAIT_MS)
    out = feed(buffer, [p for f in stream[:3] for p in f])[1]
    lost = stream[3][0]
    pli, held = feed(buffer, [p for f in stream[3:7] for p in f if p is not lost], now_ns=5 * MS)
    assert (pli, held) == (False, [])
    pli, dropped = buffer.expire(5 * MS + WAIT_MS * MS)
    assert (pli, dropped, buffer.keyframe_requests) == (True, [], 1)  # frames 3-6 refer to the lost one: dropped
    assert buffer.add(lost, 6 * MS) == (False, [])  # its retransmission, too late: ignored
    pli, resumed = feed(buffer, [p for f in stream[7:] for p in f], now_ns=7 * MS)
    assert not pli and [f.timestamp for f in resumed] == [f[0].timestamp for f in stream[7:]]
    assert decoded(out + resumed) == 3 + len(stream) - 7 and buffer.deadline_ns is None


def test_a_key_frame_already_in_behind_the_hole_is_played_from_without_asking_for_one(stream):
    buffer = VideoJitterBuffer(WAIT_MS)
    lost = stream[5][-1]  # the last packet of the frame before the key frame
    feed(buffer, [p for f in stream for p in f if p is not lost])
    pli, out = buffer.expire(WAIT_MS * MS)
    assert not pli and buffer.keyframe_requests == 0
    assert [f.timestamp for f in out] == [f[0].timestamp for f in stream[7:]]


def test_a_key_frame_that_lost_a_packet_waits_longer_then_is_given_up_on_and_the_next_one_asked_for(stream):
    """The stream's first key frame lost a packet: its retransmission is waited for ``KEYFRAME_WAITS`` times as
    long (another key frame would be as large and as exposed); then it is dropped (not taken again as the key
    frame to start from), a key frame is asked for, and the next one plays."""
    buffer = VideoJitterBuffer(WAIT_MS)
    lost = stream[0][1]
    pli, out = feed(buffer, [p for f in stream[:3] for p in f if p is not lost], now_ns=2 * MS)
    assert (pli, out) == (False, []) and buffer.deadline_ns == 2 * MS + KEYFRAME_WAITS * WAIT_MS * MS
    assert buffer.expire(2 * MS + WAIT_MS * MS) == (False, [])
    pli, out = buffer.expire(2 * MS + KEYFRAME_WAITS * WAIT_MS * MS)
    assert (pli, out, buffer.keyframe_requests) == (True, [], 1)
    pli, resumed = feed(buffer, [p for f in stream[7:] for p in f], now_ns=90 * MS)
    assert not pli and [f.timestamp for f in resumed] == [f[0].timestamp for f in stream[7:]]
    assert decoded(resumed) == len(stream) - 7


def test_a_key_frame_whose_lost_packet_comes_again_in_time_plays_with_what_came_behind_it(stream):
    buffer = VideoJitterBuffer(WAIT_MS)
    lost = stream[0][2]
    feed(buffer, [p for f in stream[:4] for p in f if p is not lost], now_ns=2 * MS)
    pli, out = buffer.add(lost, 2 * MS + 2 * WAIT_MS * MS)  # past one wait, within a key frame's
    assert not pli and [f.timestamp for f in out] == [f[0].timestamp for f in stream[:4]]
    assert decoded(out) == 4 and buffer.deadline_ns is None


def test_a_key_frame_asked_for_that_does_not_come_is_asked_for_again(stream):
    buffer = VideoJitterBuffer(WAIT_MS)
    feed(buffer, [p for f in stream[:2] for p in f] + [p for f in stream[3:5] for p in f])
    assert buffer.expire(WAIT_MS * MS)[0] and buffer.deadline_ns == WAIT_MS * MS * (1 + KEYFRAME_WAITS)
    assert buffer.expire(WAIT_MS * MS * (1 + KEYFRAME_WAITS) - 1) == (False, [])
    assert buffer.expire(WAIT_MS * MS * (1 + KEYFRAME_WAITS)) == (True, []) and buffer.keyframe_requests == 2


@pytest.mark.parametrize("seed", range(5))
def test_reordered_packets_without_loss_lose_no_frame(stream, seed):
    """Each packet delayed 0-60 ms (as the impaired link does), 10 ms apart: every frame comes out, in order."""
    rng = random.Random(seed)
    sent = [p for f in stream for p in f]
    arrivals = sorted((i * 10 * MS + rng.uniform(0, 60) * MS, i) for i in range(len(sent)))
    buffer, out = VideoJitterBuffer(WAIT_MS), []
    for t, i in arrivals:
        assert buffer.deadline_ns is None or t < buffer.deadline_ns
        pli, frames = buffer.add(sent[i], int(t))
        assert not pli
        out += frames
    assert [f.timestamp for f in out] == [f[0].timestamp for f in stream]
    assert decoded(out) == len(stream)


def test_the_stream_is_joined_at_a_key_frame_whose_first_packet_comes_after_others(stream):
    buffer = VideoJitterBuffer(WAIT_MS)
    key = stream[0]
    assert feed(buffer, key[1:]) == (False, [])
    pli, out = buffer.add(key[0], 0)
    assert not pli and [f.timestamp for f in out] == [key[0].timestamp] and decoded(out) == 1
