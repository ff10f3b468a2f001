"""The server's building blocks on their own: media header, outbox drop policy, capture-time mapping,
the audio scope picture, and H264Encoder.request_keyframe (the stream/ change the outbox relies on)."""
import asyncio

import numpy as np
import pytest
import torch

from framegraph.apps.server.outbox import AUDIO, CONTROL, END, VIDEO, Item, Outbox
from framegraph.apps.server.protocol import (
    HEADER_BYTES,
    ErrorCode,
    Kind,
    MediaFlag,
    MediaHeader,
    ProtocolError,
    pack_media,
    parse_control,
    parse_media,
)
from framegraph.apps.server.stages import AudioScope, CaptureTimes
from framegraph.stream import Clock, Flag, Graph, PortSpec, RecordingSink
from framegraph.stream.media import H264Encoder, PushAudioSource
from framegraph.stream.testcard import TestCardVideo


def test_media_header_round_trip_and_layout():
    h = MediaHeader(Kind.H264, MediaFlag.KEYFRAME | MediaFlag.CLIENT_CLOCK, seq=7, pts=-3, capture_ns=2**62,
                    graph_us=1, compute_us=2, encode_us=3, send_wait_us=2**40)
    data = pack_media(h, b"abc")
    assert len(data) == HEADER_BYTES + 3 == 51
    assert data[:4] == b"FG\x01\x02" and data[6:8] == b"\x30\x00"  # magic, version 1, kind, header_len 48
    back, payload = parse_media(data)
    assert bytes(payload) == b"abc" and back.seq == 7 and back.pts == -3 and back.capture_ns == 2**62
    assert back.send_wait_us == 2**32 - 1  # clamped, never wrapped
    for bad in (data[:47], data[:-1], data + b"x", b"GF" + data[2:], data[:2] + b"\x02" + data[3:],
                data[:3] + b"\x09" + data[4:]):
        with pytest.raises(ProtocolError) as err:
            parse_media(bad)
        assert err.value.code == ErrorCode.BAD_BINARY


def test_control_parsing_checks_types_and_poses():
    pose = parse_control('{"type": "pose", "matrix": [1,0,0,0, 0,1,0,0, 0,0,1,2, 0,0,0,1]}')
    assert pose["matrix"][2] == [0, 0, 1, 2]
    for text, code in [('{"type": "pose", "matrix": [[1,0,0,0],[0,1,0,0],[0,0,1,0],[0,0,1,1]]}', "bad_message"),
                       ('{"type": "pose", "matrix": [[NaN,0,0,0],[0,1,0,0],[0,0,1,0],[0,0,0,1]]}', "bad_message"),
                       ('{"type": "start", "pipeline": "x", "version": 2}', "bad_message"),
                       ('{"type": "config", "options": true}', "bad_message"),
                       ("[" * 100_000, "bad_json"), ('"start"', "bad_json")]:
        with pytest.raises(ProtocolError) as err:
            parse_control(text)
        assert err.value.code.value == code, text


def _video(seq, key):
    return Item(VIDEO, b"v%d" % seq, MediaHeader(Kind.H264, seq=seq), keyframe=key)


def test_outbox_drops_oldest_and_restarts_h264_at_a_keyframe():
    async def scenario():
        requests = []
        box = Outbox(asyncio.get_running_loop(), video=2, audio=3, control=2,
                     on_keyframe_needed=lambda: requests.append(1))
        box.offer(_video(0, True))
        box.offer(_video(1, False))
        box.offer(_video(2, False))  # full: 0 is dropped, and 1, 2 depend on it → all gone, key requested
        assert requests == [1] and box.dropped[VIDEO] == 2
        assert not box.offer(_video(3, False))  # still waiting for a key frame
        box.offer(_video(4, True))
        box.offer(_video(5, False))
        for i in range(5):
            box.offer(Item(AUDIO, b"a%d" % i, MediaHeader(Kind.PCM16, seq=i)))
        box.offer(Item(CONTROL, {"type": "stats", "n": 1}, replace_key="stats"))
        box.offer(Item(CONTROL, {"type": "stats", "n": 2}, replace_key="stats"))  # replaces, not queues
        box.offer(Item(CONTROL, {"type": "ready"}), front=True)
        box.end()
        got = []
        while (item := await box.get()).kind != END:
            got.append(item)
        return box, got

    box, got = asyncio.run(scenario())
    assert got[0].payload == {"type": "ready"}
    assert [i.header.seq for i in got if i.kind == VIDEO] == [4, 5]
    assert [i.header.seq for i in got if i.kind == AUDIO] == [2, 3, 4]
    assert [i.payload["n"] for i in got if i.kind == CONTROL and i.payload["type"] == "stats"] == [2]
    assert box.dropped == {VIDEO: 4, AUDIO: 2, CONTROL: 0}
    assert box.take_discontinuity(VIDEO) and not box.take_discontinuity(VIDEO)


def test_outbox_holds_media_back_until_released_so_ready_comes_first():
    async def released():
        box = Outbox(asyncio.get_running_loop())
        box.hold_media(True)  # the graph is starting: its first frames must wait for "ready"
        box.offer(_video(0, True))
        box.offer(Item(AUDIO, b"a0", MediaHeader(Kind.PCM16, seq=0)))
        getter = asyncio.create_task(box.get())
        await asyncio.sleep(0.05)
        waiting = not getter.done()  # only media queued: nothing to hand out yet
        box.offer(Item(CONTROL, {"type": "ready"}), front=True)
        box.hold_media(False)
        box.end()
        got = [await asyncio.wait_for(getter, 1)]
        while (item := await asyncio.wait_for(box.get(), 1)).kind != END:
            got.append(item)
        return waiting, got

    waiting, got = asyncio.run(released())
    assert waiting
    assert [i.kind for i in got] == [CONTROL, VIDEO, AUDIO] and got[0].payload == {"type": "ready"}


def test_capture_times_map_samples_back_to_client_clock():
    ct = CaptureTimes(capacity=4)
    ct.add(320, 1_000_000_000)  # samples 0..319, last one captured at t = 1 s
    ct.add(640, 2_000_000_000)  # samples 320..959
    assert ct.of_sample(319) == 1_000_000_000
    assert ct.of_sample(959) == 2_000_000_000
    assert ct.of_sample(959 - 160) == 2_000_000_000 - 10_000_000  # 160 samples = 10 ms earlier
    assert ct.of_sample(960) is None  # not pushed yet
    for i in range(4):
        ct.add(320, 3_000_000_000 + i)
    assert ct.of_sample(0) is None  # forgotten (capacity 4)


def test_audio_scope_draws_one_picture_per_video_frame_and_passes_audio_through():
    g = Graph(Clock("fast"))
    mic = g.add(PushAudioSource())
    scope = g.add(AudioScope(width=64, height=48, fps=25))
    pics = g.add(RecordingSink({"video": PortSpec((48, 64, 3), torch.uint8)}, name="pics"))
    echo = g.add(RecordingSink({"audio": PortSpec((320,), torch.int16)}, name="echo"))
    g.connect(mic, scope)
    g.connect(scope, pics, "video")
    g.connect(scope, echo, "audio")
    quiet = np.zeros(3200, np.int16)
    loud = (0.9 * 32767 * np.sin(np.arange(3200) * 2 * np.pi * 500 / 16000)).astype(np.int16)
    mic.push(np.concatenate([quiet, loud]))
    mic.close()
    g.run(timeout=10)
    assert len(pics.records) == 10  # 0.4 s at 25 fps
    assert np.array_equal(torch.cat(echo.data()).numpy(), np.concatenate([quiet, loud]))
    assert pics.pts() == [1920 * i for i in range(10)]
    dark, bright = pics.data()[2].float().mean(), pics.data()[-1].float().mean()
    assert bright > dark + 60  # a loud sound is a bright frame


def test_h264_encoder_request_keyframe_makes_the_next_frame_a_keyframe():
    class Encoder(H264Encoder):  # asks for a key frame just before frame 5 (in its own thread: no race)
        def process(self, inputs, out):
            if self._index == 5:
                self.request_keyframe()
            super().process(inputs, out)

    g = Graph(Clock("fast"))
    card = g.add(TestCardVideo(width=64, height=48, fps=25, seconds=0.4))
    enc = g.add(Encoder(width=64, height=48, fps=25, gop=250))
    sink = g.add(RecordingSink({"h264": PortSpec((enc.outputs["h264"].shape[0],), torch.uint8)}, name="sink"))
    sink.inputs["h264"] = enc.outputs["h264"]
    g.connect(card, enc)
    g.connect(enc, sink)
    g.run(timeout=10)
    keys = [i for i, r in enumerate(sink.records) if r.flags & Flag.KEYFRAME]
    assert keys == [0, 5] and len(sink.records) == 10
