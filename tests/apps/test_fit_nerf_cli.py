"""`framegraph fit-nerf` on captures as users bring them: frames without images, a lens, cameras on an arc
around a subject away from the origin; checkpoints, Ctrl-C, and a resume that ends where a straight run does."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import torch
from posed_captures import write_capture
from safetensors.torch import load_file

from framegraph.apps.cli import main
from framegraph.renderers.posed_images import load_transforms
from framegraph.stream.quality import psnr

TINY = ["--levels", "8", "--log2-table", "14", "--finest", "128", "--occupancy", "32", "--steps-per-diagonal", "96",
        "--device", "cpu", "--threads", "1"]


def test_a_capture_with_missing_images_a_lens_and_an_off_centre_arc_fits(tmp_path, capsys):
    """The three defects of issue #19 at once: the fit starts (missing frames skipped), its box holds the
    subject (the old box around the mean camera position rendered blank: 12.2 dB, the same as white), and
    the held-out views show the subject (measured 18.3 dB after 60 steps)."""
    path = write_capture(tmp_path / "data", 16, size=(40, 30), missing=(3, 11), lens={"k1": -0.2, "k2": 0.05},
                         fov_deg=45)
    out = tmp_path / "nerf"
    rc = main(["fit-nerf", str(path), "--out", str(out), "--steps", "60", "--batch-rays", "256", "--hold-out", "4",
               *TINY])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert err.count("warning:") == 1 and "skipping 2 of 16 frames" in err
    assert "undid the lens distortion of 14 images" in err
    assert re.search(r"held-out views: 100%", err) and "psnr=" in err  # both bars ran (training, evaluation)
    report = json.loads((out / "report.json").read_text())
    assert report["train_views"] == 10 and report["held_out_views"] == 4 and report["steps"] == 60
    _, held = load_transforms(path).split(4)
    blank = sum(psnr(torch.ones_like(im), im) for im in held.images) / len(held)
    assert report["held_out"]["psnr"] > blank + 4, (report["held_out"], blank)
    assert report["command"] and report["versions"]["torch"] and report["held_out"]["wall_s"] >= 0


def test_ctrl_c_saves_and_resume_ends_exactly_where_a_straight_run_does(tmp_path, capsys):
    path = write_capture(tmp_path / "data", 6, size=(24, 18))
    args = [str(path), "--batch-rays", "128", "--steps", "40", "--hold-out", "0", *TINY]
    straight = tmp_path / "straight"
    assert main(["fit-nerf", *args, "--out", str(straight), "--no-progress"]) == 0

    stopped = tmp_path / "stopped"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "framegraph.apps.cli", "fit-nerf", *args, "--out", str(stopped),
                             "--checkpoint-every", "3"], stderr=subprocess.PIPE, text=True, env=env)
    deadline, ckpt = time.monotonic() + 120, stopped / "fit.fit.json"
    while proc.poll() is None and time.monotonic() < deadline and \
            not (ckpt.is_file() and json.loads(ckpt.read_text())["step"] >= 9):  # written whole (renamed)
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err
    step = json.loads((stopped / "fit.fit.json").read_text())["step"]
    assert 9 <= step < 40 and f"interrupted at step {step}: saved the checkpoint" in err
    assert "psnr=" in err and re.search(r"<\d\d:\d\d", err)  # the bar shows PSNR and the time left

    capsys.readouterr()
    assert main(["fit-nerf", *args, "--out", str(stopped), "--resume", "--no-progress"]) == 0
    assert f"resuming {stopped} at step {step}" in capsys.readouterr().err
    a, b = load_file(str(straight / "model.safetensors")), load_file(str(stopped / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_errors_say_what_was_wrong(tmp_path, capsys):
    path = write_capture(tmp_path, 3, size=(8, 6), missing=(0, 1, 2))
    assert main(["fit-nerf", str(path), "--out", str(tmp_path / "o"), *TINY]) == 2
    err = capsys.readouterr().err
    assert "only 0 of 3 frames have their image" in err and "need at least 2" in err
    path = write_capture(tmp_path, 3, size=(8, 6))
    assert main(["fit-nerf", str(path), "--out", str(tmp_path / "o"), "--resume", *TINY]) == 2
    assert "no fit checkpoint to resume" in capsys.readouterr().err
