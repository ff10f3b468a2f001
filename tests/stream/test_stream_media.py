"""Media I/O through real FFmpeg (PyAV): audio sources, MP4 / H.264 / JPEG / image outputs, bad input."""
import io
import os
import threading

import av
import numpy as np
import pytest
import torch
from helpers import Collect
from PIL import Image

from framegraph.stream import Flag, Graph, PortSpec, RecordingSink, Stage, StageError
from framegraph.stream.media import (
    AudioFileSource,
    H264Encoder,
    ImageSequenceSink,
    JpegEncoder,
    MediaError,
    MP4Sink,
    PushAudioSource,
    decode_audio,
    read_video,
)
from framegraph.stream.testcard import TestCardVideo


def write_tone(path, seconds=1.0, rate=44100, channels=2, codec="pcm_s16le", freq=440.0):
    """A sine tone file written by FFmpeg itself."""
    layout = "stereo" if channels == 2 else "mono"
    with av.open(str(path), "w") as c:
        s = c.add_stream(codec, rate=rate)
        s.layout = layout
        n = int(seconds * rate)
        t = np.arange(n) / rate
        wave = (0.5 * np.sin(2 * np.pi * freq * t) * 32767).astype(np.int16)
        step = 1024
        for i in range(0, n, step):
            block = np.repeat(wave[i:i + step][None], channels, 0).T.reshape(1, -1).copy()
            frame = av.AudioFrame.from_ndarray(block, format="s16", layout=layout)
            frame.sample_rate = rate
            frame.pts = i
            c.mux(s.encode(frame))
        c.mux(s.encode(None))
    return path


def audio_sink() -> RecordingSink:
    return RecordingSink({"audio": PortSpec((320,), torch.int16)})


def samples_of(sink: RecordingSink) -> torch.Tensor:
    """The real samples of every chunk (the last one's zero padding cut), end to end."""
    return torch.cat([r.data[:r.length] for r in sink.records])


@pytest.mark.parametrize("codec, ext", [("pcm_s16le", "wav"), ("flac", "flac"), ("aac", "m4a")])
def test_audio_file_source_resamples_to_16k_mono_in_20ms_chunks(tmp_path, codec, ext):
    path = write_tone(tmp_path / f"tone.{ext}", seconds=1.013, codec=codec)
    g = Graph()
    src, sink = g.add(AudioFileSource(path)), g.add(audio_sink())
    g.connect(src, sink)
    g.run(timeout=20)
    lengths = [r.length for r in sink.records]
    assert all(n == 320 for n in lengths[:-1]) and 0 < lengths[-1] <= 320
    total = sum(lengths)
    assert abs(total - 1.013 * 16000) < 0.03 * 16000
    assert sink.pts() == [i * 320 * 3 for i in range(len(sink.records))]  # pts: 3 ticks per 16 kHz sample
    audio = samples_of(sink).numpy().astype(float)
    spectrum = np.abs(np.fft.rfft(audio[1600:14400]))
    assert abs(np.argmax(spectrum) * 16000 / 12800 - 440) < 5  # still a 440 Hz tone


def test_decode_audio_matches_the_source_stage(tmp_path):
    path = write_tone(tmp_path / "t.wav", seconds=0.5)
    pcm = decode_audio(path)
    assert pcm.dtype == np.int16 and abs(len(pcm) - 8000) < 100


@pytest.mark.parametrize("make, problem", [
    (lambda p: None, "no such file"),
    (lambda p: open(p, "wb").close(), "is empty"),
    (lambda p: open(p, "wb").write(b"this is not media at all" * 100), "not a media file"),
])
def test_bad_audio_files_give_clear_errors_naming_the_file(tmp_path, make, problem):
    path = tmp_path / "input.wav"
    make(path)
    with pytest.raises(MediaError, match=problem) as info:
        AudioFileSource(path)
    assert str(path) in str(info.value)


def test_truncated_file_error_names_file(tmp_path):
    good = write_tone(tmp_path / "good.m4a", seconds=2.0, codec="aac")
    data = open(good, "rb").read()
    bad = tmp_path / "cut.m4a"
    open(bad, "wb").write(data[: len(data) // 3])
    with pytest.raises(MediaError, match="cut.m4a"):
        decode_audio(bad)


def test_video_without_audio_is_refused_as_audio_input(tmp_path):
    path = tmp_path / "silent.mp4"
    g = Graph()
    v = g.add(TestCardVideo(width=64, height=48, fps=10, seconds=0.5))
    k = g.add(MP4Sink(path, width=64, height=48, fps=10, audio_rate=None))
    g.connect(v, k)
    g.run()
    with pytest.raises(MediaError, match="no audio stream.*video"):
        AudioFileSource(path)


def test_push_source_delivers_pushed_pcm_in_order_with_pts():
    src = PushAudioSource(max_buffer_ms=2000)
    g = Graph()
    g.add(src)
    sink = g.add(audio_sink())
    g.connect(src, sink)
    g.start()
    pcm = (np.arange(16000) % 1000).astype(np.int16)

    def feed():
        for i in range(0, len(pcm), 700):  # odd-sized pushes, like network packets
            src.push(pcm[i:i + 700].tobytes())
        src.close()

    t = threading.Thread(target=feed)
    t.start()
    g.join(timeout=10)
    t.join()
    got = samples_of(sink).numpy()
    assert src.overflow_samples == 0 and np.array_equal(got, pcm)
    assert sink.pts() == [i * 960 for i in range(len(sink.records))]


def test_push_source_overflow_drops_oldest_and_counts():
    src = PushAudioSource(max_buffer_ms=100)  # 1600 samples
    src.push(np.zeros(1000, np.int16))
    src.push(np.ones(1000, np.int16))
    assert src.buffered == 1600 and src.overflow_samples == 400
    with pytest.raises(ValueError, match="even number of bytes"):
        src.push(b"\x00\x01\x02")


def test_mp4_sink_writes_h264_yuv420p_aac(tmp_path):
    from framegraph.stream.testcard import TestCardAudio

    path = tmp_path / "card.mp4"
    g = Graph()
    v = g.add(TestCardVideo(width=96, height=64, fps=20, seconds=1.0))
    a = g.add(TestCardAudio(fps=20, seconds=1.0))
    k = g.add(MP4Sink(path, width=96, height=64, fps=20, preset="live"))
    g.connect(v, k, "video")
    g.connect(a, k, "audio")
    g.run(timeout=30)
    with av.open(str(path)) as c:
        vs, as_ = c.streams.video[0], c.streams.audio[0]
        assert vs.codec_context.name == "h264" and vs.codec_context.pix_fmt == "yuv420p"
        assert as_.codec_context.name == "aac" and as_.codec_context.sample_rate == 16000
    assert not os.path.exists(tmp_path / "card.partial.mp4")


def test_failed_graph_keeps_a_playable_partial_file_under_a_partial_name(tmp_path):
    class FailLater(Stage):
        def __init__(self):
            super().__init__("fail")
            self.inputs = {"video": PortSpec((48, 64, 3), torch.uint8)}
            self.outputs = {"video": PortSpec((48, 64, 3), torch.uint8)}
            self.n = 0

        def process(self, inputs, out):
            self.n += 1
            if self.n > 15:
                raise RuntimeError("model crashed")
            out.write().data.copy_(inputs["video"].data)

    path = tmp_path / "take.mp4"
    g = Graph()
    v = g.add(TestCardVideo(width=64, height=48, fps=10, seconds=5))
    f = g.add(FailLater())
    k = g.add(MP4Sink(path, width=64, height=48, fps=10, audio_rate=None))
    g.connect(v, f)
    g.connect(f, k)
    with pytest.raises(StageError, match="model crashed"):
        g.run(timeout=20)
    assert not path.exists()
    partial = tmp_path / "take.partial.mp4"
    assert 1 <= len(read_video(partial)["frames"]) <= 15


def test_h264_encoder_emits_one_decodable_access_unit_per_frame():
    g = Graph()
    v = g.add(TestCardVideo(width=64, height=48, fps=10, seconds=2))
    e = g.add(H264Encoder(width=64, height=48, fps=10, gop=10))
    k = g.add(RecordingSink({"h264": e.outputs["h264"]}))
    g.connect(v, e)
    g.connect(e, k)
    g.run(timeout=20)
    k.payloads = [(bytes(r.data[:r.length].numpy()), bool(r.flags & Flag.KEYFRAME)) for r in k.records]
    assert len(k.payloads) == 20  # zerolatency: a packet for every frame, none held back
    assert [key for _, key in k.payloads].count(True) == 2
    dec = av.CodecContext.create("h264", "r")
    decoded = [f for data, _ in k.payloads for f in dec.decode(av.Packet(data))]
    assert len(decoded) == 20 and decoded[0].width == 64


def test_jpeg_encoder_and_image_sequence(tmp_path):
    class Jpegs(Collect):
        def __init__(self, spec):
            super().__init__(ports=("jpeg",))
            self.inputs = {"jpeg": spec}
            self.images = []

        def process(self, inputs, out):
            self.images.append(Image.open(io.BytesIO(bytes(inputs["jpeg"].valid.numpy()))))

    g = Graph()
    v = g.add(TestCardVideo(width=64, height=48, fps=10, seconds=0.5))
    j = g.add(JpegEncoder(width=64, height=48))
    k = g.add(RecordingSink({"jpeg": j.outputs["jpeg"]}))
    seq = g.add(ImageSequenceSink(tmp_path / "frames", width=64, height=48, fps=10))
    g.connect(v, j)
    g.connect(v, seq)
    g.connect(j, k)
    g.run(timeout=20)
    images = [Image.open(io.BytesIO(bytes(r.data[:r.length].numpy()))) for r in k.records]
    assert len(images) == 5 and images[0].size == (64, 48) and images[0].format == "JPEG"
    assert sorted(os.listdir(tmp_path / "frames")) == [f"frame_{i:06d}.png" for i in range(5)]
    first = np.asarray(Image.open(tmp_path / "frames" / "frame_000000.png"))
    assert first.min() == 255  # frame 0 is a flash


def test_odd_sizes_are_refused():
    with pytest.raises(ValueError, match="must be positive and even"):
        MP4Sink("x.mp4", width=63, height=48, fps=10)
