"""The test card rendered through the CLI: frame count, size, duration, and A/V sync from the file."""
import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from framegraph.apps.cli import main
from framegraph.stream.media import read_video
from framegraph.stream.testcard import BEEP_AMP, flash_frames

PY = sys.executable


def beep_onsets_s(audio: np.ndarray, rate: int, start_s: float) -> np.ndarray:
    """Times where the loud beep starts: the smoothed amplitude crosses half the beep level."""
    env = np.convolve(np.abs(audio.astype(float) / 32767), np.ones(16) / 16, "same")
    level = BEEP_AMP * 0.5
    idx = np.where((env[1:] > level) & (env[:-1] <= level))[0] + 1
    return idx / rate + start_s


@pytest.mark.parametrize("fps, size, seconds", [(25, (320, 240), 3.0), (30, (256, 144), 2.5)])
def test_testcard_mp4_has_requested_frames_size_duration_and_beeps_on_flashes(tmp_path, fps, size, seconds):
    out = tmp_path / "card.mp4"
    w, h = size
    assert main(["render", "--testcard", "--seconds", str(seconds), "--fps", str(fps), "--size", f"{w}x{h}",
                 "--out", str(out)]) == 0
    v = read_video(out)
    n = round(seconds * fps)
    assert v["frames"].shape == (n, h, w, 3)
    assert v["fps"] == pytest.approx(fps)
    assert v["frame_times_s"][-1] == pytest.approx((n - 1) / fps, abs=1e-3)
    assert len(v["audio"]) / v["audio_rate"] == pytest.approx(seconds, abs=0.1)
    flashes = np.where(v["frames"].mean(axis=(1, 2, 3)) > 240)[0]
    assert list(flashes) == flash_frames(fps, n)
    beeps = beep_onsets_s(v["audio"], v["audio_rate"], v["audio_start_s"] or 0.0)
    assert len(beeps) == len(flashes)
    offsets = beeps - v["frame_times_s"][flashes]
    assert np.all(np.abs(offsets) <= 1.0 / fps), offsets  # every beep within one frame of its flash


def test_render_bad_arguments_say_what_was_expected(capsys):
    with pytest.raises(SystemExit):
        main(["render", "--testcard", "--size", "640by360", "--out", "x.mp4"])
    assert "expected WIDTHxHEIGHT" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["render", "--testcard", "--size", "641x360", "--out", "x.mp4"])
    assert "positive and even" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["render", "--testcard", "--fps", "0", "--out", "x.mp4"])
    assert "expected a positive number" in capsys.readouterr().err


def test_render_report_json(tmp_path):
    report = tmp_path / "r.json"
    assert main(["render", "--testcard", "--seconds", "1", "--size", "64x48", "--out", str(tmp_path / "a.mp4"),
                 "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["sink_frames"] == 25 and data["interrupted"] is False
    assert set(data["stages"]) == {"testcard_video", "testcard_audio", "mp4"}


def interrupted_render(out, size="640x360") -> subprocess.CompletedProcess:
    """A 600 s test card rendered to ``out``, Ctrl-C'ed once its partial file holds some frames."""
    # The render starts as from a terminal, Ctrl-C at its default: a suite started in the background (`pytest &`)
    # ignores SIGINT, and a child inherits that (it then rendered all 600 s and never heard the Ctrl-C).
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([PY, "-m", "framegraph.apps.cli", "render", "--testcard", "--seconds", "600",
                                 "--size", size, "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, ignored)
    partial = out.with_name(out.stem + ".partial.mp4")
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size > 20000) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_ctrl_c_during_render_drains_and_leaves_a_playable_file(tmp_path):
    out = tmp_path / "long.mp4"
    done = interrupted_render(out)
    assert done.returncode == 0, done.stderr
    assert "interrupted" in done.stderr
    v = read_video(out)
    assert 0 < len(v["frames"]) < 600 * 25
    assert not (tmp_path / "long.partial.mp4").exists()


def test_ctrl_c_never_replaces_an_earlier_complete_file_and_says_where_the_partial_is(tmp_path):
    out = tmp_path / "take.mp4"
    assert main(["render", "--testcard", "--seconds", "1", "--size", "64x48", "--out", str(out)]) == 0
    earlier = out.read_bytes()
    done = interrupted_render(out)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == earlier  # the complete file from before, intact
    partial = tmp_path / "take.partial.mp4"
    assert 0 < len(read_video(partial)["frames"]) < 600 * 25  # what was rendered, playable, under its own name
    assert str(partial) in done.stderr and "left as it was" in done.stderr
    assert done.stdout.strip() == str(partial)
    # a complete render does replace it
    assert main(["render", "--testcard", "--seconds", "2", "--size", "64x48", "--out", str(out)]) == 0
    assert len(read_video(out)["frames"]) == 50


def test_an_output_extension_no_writer_knows_is_refused_naming_those_accepted(tmp_path, capsys):
    assert main(["render", "--testcard", "--seconds", "1", "--out", str(tmp_path / "x.txt")]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "'.txt'" in err and ".mp4" in err and ".webm" in err
    assert list(tmp_path.iterdir()) == []


def test_info_lists_versions_and_backends(capsys):
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["versions"]["torch"] and info["versions"]["av"]
    assert info["backends"]["encoders"]["libx264"] is True
    assert "available" in info["cuda"]
    if not info["cuda"]["available"]:  # the wheel carries NVENC, but it cannot open without a GPU
        assert info["backends"]["encoders"]["h264_nvenc"] is False


def test_cli_help_explains_commands():
    out = subprocess.run([PY, "-m", "framegraph.apps.cli", "--help"], capture_output=True, text=True).stdout
    for cmd in ("render", "bench", "info"):
        assert cmd in out
    out = subprocess.run([PY, "-m", "framegraph.apps.cli", "render", "--help"], capture_output=True, text=True).stdout
    assert "--testcard" in out and "WIDTHxHEIGHT" in out


def test_a_command_imports_only_its_own_module():
    """`framegraph bench ...` must work where the demo's web stack (gradio, fastapi) is missing, as on a bare
    GPU machine: only the chosen command's module is imported."""
    code = ("import sys; from framegraph.apps.cli import build_parser; "
            "build_parser(['bench', 'kernels', '--tiny']).parse_args(['bench', 'kernels', '--tiny']); "
            "print(sorted(m for m in sys.modules if m.startswith(('framegraph.apps.demo', 'gradio', 'fastapi'))))")
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
