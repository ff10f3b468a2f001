"""`framegraph render --avatar DIR --audio FILE`: the shipped avatar speaks a file to MP4, A/V together."""
import wave

import numpy as np
import pytest
import torch
from helpers import write_wav

from framegraph.apps.cli import main
from framegraph.assets import path as asset
from framegraph.stream.media import read_video

SHIPPED = asset("avatars", "astronaut")


def test_render_shipped_avatar_from_audio(tmp_path, capsys):
    wav = tmp_path / "a.wav"
    t = np.arange(int(1.2 * 16000)) / 16000
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.sin(2 * np.pi * 180 * t) * 6000).astype("<i2").tobytes())
    out = tmp_path / "avatar.mp4"
    assert main(["render", "--avatar", str(SHIPPED), "--audio", str(wav), "--out", str(out)]) == 0
    v = read_video(out)
    assert v["frames"].shape[0] == 30 and v["frames"].shape[1:] == (256, 256, 3)
    assert v["audio"] is not None and abs(len(v["audio"]) / v["audio_rate"] - 1.2) < 0.1
    # --size scales the composited picture (it was silently ignored): the same face, 2x larger ...
    big = tmp_path / "big.mp4"
    assert main(["render", "--avatar", str(SHIPPED), "--audio", str(wav), "--out", str(big), "--size", "512x512"]) == 0
    b = read_video(big)["frames"]
    assert b.shape == (30, 512, 512, 3)
    small = torch.nn.functional.avg_pool2d(torch.from_numpy(b[10]).permute(2, 0, 1).float(), 2)
    mse = (small - torch.from_numpy(v["frames"][10]).permute(2, 0, 1).float()).pow(2).mean()
    assert 10 * torch.log10(255 ** 2 / mse) > 28  # dB: the same picture
    # ... and another aspect keeps the face's: bars at the sides, the picture in the middle
    wide = tmp_path / "wide.mp4"
    assert main(["render", "--avatar", str(SHIPPED), "--audio", str(wav), "--out", str(wide), "--size", "640x360"]) == 0
    w = read_video(wide)["frames"]
    assert w.shape == (30, 360, 640, 3)
    assert w[:, :, :130].max() < 24 and w[:, :, -130:].max() < 24  # black bars (codec noise allowed)
    assert w[:, :, 150:490].astype(float).std() > 20  # the portrait
    assert main(["render", "--avatar", str(SHIPPED), "--out", str(out)]) == 2
    assert "needs --audio" in capsys.readouterr().err
    assert main(["render", "--avatar", str(tmp_path), "--audio", str(wav), "--out", str(out)]) == 2
    assert str(tmp_path) in capsys.readouterr().err


def _write(path, samples: np.ndarray, rate: int, channels: int = 1):
    import av

    pcm = np.clip(samples, -32768, 32767).astype(np.int16)
    with av.open(str(path), "w") as c:
        s = c.add_stream("pcm_s16le", rate=rate)
        s.layout = "stereo" if channels == 2 else "mono"
        data = np.repeat(pcm[None], channels, 0).T.reshape(1, -1).copy()
        frame = av.AudioFrame.from_ndarray(data, format="s16", layout=s.layout.name)
        frame.sample_rate = rate
        c.mux(s.encode(frame))
        c.mux(s.encode(None))
    return path


def _voice(seconds: float, rate: int, amplitude: float) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return amplitude * 32767 * np.sin(2 * np.pi * 150 * t) * (np.sin(2 * np.pi * 3 * t) > 0)


@pytest.mark.parametrize("name,samples,rate,channels", [
    ("silence", np.zeros(16000), 16000, 1),
    ("quiet", _voice(1.0, 16000, 0.001), 16000, 1),  # -60 dBFS
    ("clipped", _voice(1.0, 16000, 8.0), 16000, 1),  # driven far past full scale, hard-clipped
    ("stereo 44.1 kHz", _voice(1.0, 44100, 0.3), 44100, 2),
    ("8 kHz", _voice(1.0, 8000, 0.3), 8000, 1),
])
def test_awkward_audio_still_renders_every_frame(tmp_path, name, samples, rate, channels):
    """No speech, very quiet, clipped, stereo, other sample rates: a full-length video, never a crash; with
    no speech the lips stay closed."""
    from framegraph.models.avatar import load_avatar
    from framegraph.models.avatar.eval.synthetic import mouth_openness

    wav = _write(tmp_path / "in.wav", samples, rate, channels)
    out = tmp_path / "out.mp4"
    assert main(["render", "--avatar", str(SHIPPED), "--audio", str(wav), "--out", str(out)]) == 0
    v = read_video(out)
    assert v["frames"].shape[0] == 25 and v["audio"] is not None, name
    if name == "silence":
        avatar = load_avatar(SHIPPED)
        opening = mouth_openness(torch.from_numpy(v["frames"]), avatar.mouth_box, avatar.portrait)
        assert opening.mean() < 2.0, opening  # px of dark opening per mouth width: closed (see evaluate.py)


def test_files_without_usable_audio_are_refused_with_the_reason(tmp_path, capsys):
    import av

    video_only = tmp_path / "video_only.mp4"
    with av.open(str(video_only), "w") as c:
        s = c.add_stream("libx264", rate=25)
        s.width, s.height, s.pix_fmt = 64, 64, "yuv420p"
        for _ in range(5):
            for p in s.encode(av.VideoFrame.from_ndarray(np.zeros((64, 64, 3), np.uint8), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    text = tmp_path / "notes.txt"
    text.write_text("not audio")
    for bad in (video_only, text, tmp_path / "missing.wav"):
        assert main(["render", "--avatar", str(SHIPPED), "--audio", str(bad), "--out", str(tmp_path / "o.mp4")]) == 2
        err = capsys.readouterr().err
        assert str(bad) in err or bad.name in err, err


def test_a_truncated_wav_renders_with_a_note_of_how_much_audio_was_read(tmp_path, capsys):
    whole = tmp_path / "whole.wav"
    t = np.arange(2 * 16000) / 16000
    write_wav(whole, np.sin(2 * np.pi * 180 * t) * 6000)
    cut = tmp_path / "cut.wav"
    data = whole.read_bytes()
    cut.write_bytes(data[:44 + 16000 * 2 // 2])  # the header, then 0.5 s of the 2 s it promises
    out = tmp_path / "cut.mp4"
    assert main(["render", "--avatar", str(SHIPPED), "--audio", str(cut), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"note: {cut} is cut short: its header promises 2.00 s of audio, the file holds 0.50 s" in err, err
    assert abs(len(read_video(out)["audio"]) / 16000 - 0.5) < 0.1
    assert main(["render", "--avatar", str(SHIPPED), "--audio", str(whole), "--out", str(tmp_path / "w.mp4")]) == 0
    assert "cut short" not in capsys.readouterr().err
