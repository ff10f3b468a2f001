"""`framegraph render --avatar DIR --audio FILE`: the shipped avatar speaks a file to MP4, A/V together."""
import wave
from pathlib import Path

import numpy as np

from framegraph.apps.cli import main
from framegraph.stream.media import read_video

SHIPPED = Path(__file__).resolve().parents[1] / "assets" / "avatars" / "astronaut"


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
    assert main(["render", "--avatar", str(SHIPPED), "--out", str(out)]) == 2
    assert "needs --audio" in capsys.readouterr().err
    assert main(["render", "--avatar", str(tmp_path), "--audio", str(wav), "--out", str(out)]) == 2
    assert str(tmp_path) in capsys.readouterr().err
