"""MuseTalk's audio context, live: the stage on a real graph gives each frame the window the offline twin gives it,
a frame's window hears nothing later than its look-ahead, a barge-in starts the windows afresh (tiny random
Whisper of MuseTalk's layout, real speech from the astronaut's talking clip)."""
import math

import numpy as np
import pytest
import torch
from helpers import MUSETALK_AUDIO_DIM, BargeIn, tiny_musetalk_folder

from framegraph.models.audio.whisper_stream import WhisperWindows
from framegraph.models.avatar.musetalk.audio import ROWS
from framegraph.models.avatar.musetalk.files import load_whisper
from framegraph.models.avatar.musetalk.hearing import ContextFrames, EveryLayerEngine, MuseTalkAudio, live_context
from framegraph.stream import Clock, Flag, Graph, PortSpec, RecordingSink
from framegraph.stream.media import AudioFileSource, PushAudioSource, decode_audio

WINDOWS = WhisperWindows(context_ms=600, hop_ms=80, lookahead_ms=80)  # short: the tiny model is still run often


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tiny_musetalk_folder(tmp_path_factory.mktemp("musetalk"))
    return EveryLayerEngine(load_whisper(root / "models/whisper", MUSETALK_AUDIO_DIM))


def run_stage(source, engine, frames_expected: int | None = None, barge_after: int | None = None):
    graph = Graph(Clock("fast"))
    src = graph.add(source)
    stage = graph.add(MuseTalkAudio(engine, windows=WINDOWS))
    sink = graph.add(RecordingSink({"context": PortSpec((ROWS * engine.layers, engine.width))}))
    if barge_after is None:
        graph.connect(src, stage, "audio")
    else:
        barge = graph.add(BargeIn(after=barge_after))
        barge.graph = graph
        graph.connect(src, barge, "audio")
        graph.connect(barge, stage, "audio")
    graph.connect(stage, sink, "context")
    report = graph.run(timeout=300)
    assert report["error"] is None, report["error"]
    return graph, sink.of("context")


def test_each_frame_gets_the_window_the_offline_twin_gives_it_at_its_pts(engine, astronaut_talking_clip):
    audio = decode_audio(astronaut_talking_clip)[:16000 * 4 + 123]  # 4 s and a short last chunk
    graph, got = run_stage(_push(audio), engine)
    n = math.ceil(len(audio) / 640)
    assert [f.pts for f in got] == [graph.clock.ticks_from_frame(k, 25) for k in range(n)]
    offline = live_context(engine, audio, 25, WINDOWS)
    assert offline.shape == (n, ROWS * engine.layers, engine.width) == (n, 10 * 3, MUSETALK_AUDIO_DIM)
    assert (torch.stack([f.data for f in got]) - offline).abs().max() < 1e-5
    # the file source too (its own chunking and end)
    _, from_file = run_stage(AudioFileSource(astronaut_talking_clip), engine)
    whole = decode_audio(astronaut_talking_clip)
    assert len(from_file) == math.ceil(len(whole) / 640)
    assert (torch.stack([f.data for f in from_file]) - live_context(engine, whole, 25, WINDOWS)).abs().max() < 1e-5


def _push(audio: np.ndarray) -> PushAudioSource:
    src = PushAudioSource(max_buffer_ms=len(audio) // 16 + 20)
    src.push(audio)
    src.close()
    return src


def test_a_frame_hears_nothing_past_its_look_ahead(engine, astronaut_talking_clip):
    """Frame k's window reads rows up to 2k + 5 (80 ms past its end), each row from a Whisper window reaching 80 ms
    past its hop (up to 80 ms long): audio changed after that cannot change it."""
    audio = decode_audio(astronaut_talking_clip)[:16000 * 3]
    cut = 16000 * 2
    changed = audio.copy()
    changed[cut:] = np.random.default_rng(0).integers(-8000, 8000, len(audio) - cut, dtype=np.int16)
    a, b = live_context(engine, audio, 25, WINDOWS), live_context(engine, changed, 25, WINDOWS)
    reach_ms = 80 + WINDOWS.lookahead_ms + WINDOWS.hop_ms  # past the frame's own end
    deaf = [k for k in range(len(a)) if (k + 1) * 40 + reach_ms <= cut / 16]
    assert deaf and torch.equal(a[deaf], b[deaf])
    assert not torch.equal(a[deaf[-1] + 3:], b[deaf[-1] + 3:])  # later ones hear the change


def test_the_frames_a_push_releases_are_those_whose_rows_have_come(engine):
    """Pushed 20 ms at a time, frame k leaves once its window's last row exists; the end releases the rest."""
    frames = ContextFrames(engine, WINDOWS, 25.0)
    x = (np.sin(np.arange(16000) * 0.05) * 6000).astype(np.int16)
    released = []
    for i in range(0, len(x), 320):
        released += [(k, i + 320) for k, _ in frames.push(i, x[i:i + 320])]
    at_end = frames.finish()
    assert [k for k, _ in released] + [k for k, _ in at_end] == list(range(25))
    for k, samples in released:  # its last row 2k + 5 needs Whisper's window reaching past it
        row_end = (2 * k + 6) * 320
        assert samples >= row_end, (k, samples)
        assert samples <= row_end + WINDOWS.lookahead + WINDOWS.hop + 320, (k, samples)


def test_a_barge_in_starts_the_windows_afresh_and_marks_one_frame(engine, astronaut_talking_clip):
    audio = decode_audio(astronaut_talking_clip)[:16000 * 2]
    _, got = run_stage(_push(audio), engine, barge_after=30)  # reset after 30 chunks (0.6 s)
    assert len(got) == 50
    marked = [i for i, f in enumerate(got) if f.flags & Flag.INTERRUPTED]
    assert len(marked) == 1
    k = marked[0]

    def heard_from(c: int) -> torch.Tensor:  # the windows of a stream from frame k on, silent before chunk c
        heard = audio[k * 640:].copy()
        heard[:c * 320 - k * 640] = 0
        return live_context(engine, heard, 25, WINDOWS)

    # the chunks the stage had taken before the reset are forgotten (which ones were in flight is the threads'
    # timing: one of the last few before the 30th)
    after = torch.stack([f.data for f in got[k:]])
    assert any((after - heard_from(c)[:len(after)]).abs().max() < 1e-5 for c in range(25, 31))


def test_a_window_takes_the_positions_its_rows_have_in_the_30_s_segment(engine):
    """Whisper's position code is absolute: a window's rows get the positions they have offline (the embedding
    layer then equals the offline one away from the window's edges, where the convolutions see the cut); a window
    reaching before the stream's start is encoded from the start, its rows before it zero."""
    from framegraph.models.audio.whisper import torch_encode, whisper_log_mel

    wave = torch.from_numpy((np.sin(np.arange(16000 * 6) * 0.03) * 0.3).astype(np.float32))
    segment = torch.zeros(30 * 16000)
    segment[:len(wave)] = wave
    mel = whisper_log_mel(segment[None])
    offline = torch_encode(engine.encoder, mel, every_layer=True)[0]  # [1500, L + 1, D]
    n = 75  # rows of a 1.5-s window
    got = engine.encode_at(mel[..., 200:200 + 2 * n], [100 * 320]).reshape(n, engine.layers, engine.width)
    assert (got[1:-1, 0] - offline[101:100 + n - 1, 0]).abs().max() < 1e-4
    relative = engine(mel[..., 200:200 + 2 * n]).reshape(n, engine.layers, engine.width)
    assert (relative[1:-1, 0] - offline[101:100 + n - 1, 0]).abs().max() > 1e-2  # positions from 0: not the same
    before = torch.full_like(mel[..., :20], float(mel.min()))  # 10 rows of silence before the stream's start
    early = engine.encode_at(torch.cat([before, mel[..., :2 * (n - 10)]], -1), [-10 * 320])
    early = early.reshape(n, engine.layers, engine.width)
    assert early[:10].abs().max() == 0
    from_start = engine.encode_at(mel[..., :2 * (n - 10)], [0]).reshape(n - 10, engine.layers, engine.width)
    assert (early[10:] - from_start).abs().max() < 1e-5
