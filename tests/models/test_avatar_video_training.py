"""What a user of ``avatar train --video`` sees while it trains: the time said up front and an ETA, Ctrl-C that
keeps a checkpoint and a second run that continues from its step (to the uninterrupted run's weights), and only
framegraph's own lines on stderr (no MediaPipe, absl, TFLite, protobuf or nanobind noise)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from framegraph.models.training import cpu_threads

FOREIGN = [re.compile(p) for p in (r"^[IWEF]\d{4} \d\d:\d\d:\d\d", r"nanobind", r"AttributeError", r"GetPrototype",
                                   r"^INFO: ", r"absl::InitializeLog", r"TensorFlow Lite", r"Traceback")]


def foreign_lines(text: str) -> list[str]:
    """The lines of ``text`` (stderr; tqdm's carriage returns split it too) that framegraph did not write."""
    return [line for line in re.split(r"[\r\n]+", text) if any(p.search(line) for p in FOREIGN)]


# ---- the generator's checkpoint, in process ---------------------------------------------------------------
def _tiny_data(size: int = 32, frames: int = 12):
    gen = torch.Generator().manual_seed(3)
    regions = torch.randint(0, 256, (frames, size, size, 3), generator=gen, dtype=torch.uint8)
    mask = torch.zeros(size, size)
    mask[size // 2:] = 1
    lips = torch.zeros(size, size)
    lips[size // 2 + 4:size - 6, 8:size - 8] = 1
    return regions, torch.randn(frames, 3, generator=gen), mask, regions[0], lips


@pytest.mark.slow
def test_an_interrupted_generator_continues_from_its_step_to_the_uninterrupted_weights(tmp_path):
    from framegraph.models.avatar.video.train import VideoTrainConfig, train_generator

    regions, shapes, mask, reference, lips = _tiny_data()
    cfg = VideoTrainConfig(steps=90, batch=2, channels=(8, 16, 16, 16), critic_start=40, warmup=10)
    with cpu_threads(1):
        whole, whole_history, whole_report = train_generator(regions, shapes, mask, reference, cfg, lips,
                                                             checkpoint=tmp_path / "whole.pt")
        said = []

        def ctrl_c_at_step_50(line):  # the user presses Ctrl-C while step 50 runs
            said.append(line)
            if line.startswith("generator step 50/"):
                os.kill(os.getpid(), signal.SIGINT)

        with pytest.raises(KeyboardInterrupt):
            train_generator(regions, shapes, mask, reference, cfg, lips, ctrl_c_at_step_50,
                            checkpoint=tmp_path / "cut.pt")
        assert said[-1].startswith("interrupted at generator step 51/90; the checkpoint ")
        assert torch.load(tmp_path / "cut.pt", weights_only=False)["step"] == 51
        said.clear()
        resumed, history, report = train_generator(regions, shapes, mask, reference, cfg, lips, said.append,
                                                   checkpoint=tmp_path / "cut.pt")
    assert said[0] == f"generator: continuing at step 51/90 from the checkpoint {tmp_path / 'cut.pt'}"
    assert history == whole_history and report == whole_report
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    fresh, _, _ = train_generator(regions, shapes, mask, reference, cfg, lips, checkpoint=tmp_path / "cut.pt",
                                  resume=False)  # --no-resume starts over (and still reaches the same weights)
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), fresh.state_dict().values()))


def test_a_checkpoint_of_other_settings_is_not_continued_and_the_log_says_why(tmp_path):
    from framegraph.models.avatar.video.train import VideoTrainConfig, train_generator

    regions, shapes, mask, reference, lips = _tiny_data()
    cfg = VideoTrainConfig(steps=20, batch=2, channels=(8, 16, 16, 16), warmup=5)
    train_generator(regions, shapes, mask, reference, cfg, checkpoint=tmp_path / "g.pt")
    said = []
    other_lr = VideoTrainConfig(**{**cfg.__dict__, "lr": 1e-3})
    train_generator(regions, shapes, mask, reference, other_lr, log=said.append, checkpoint=tmp_path / "g.pt")
    assert said[0] == f"the generator checkpoint {tmp_path / 'g.pt'} was made with other settings (lr): training " \
                      f"the generator from step 0"
    said.clear()  # another video trained into the same folder: the same settings, other pictures
    train_generator(255 - regions, shapes, mask, reference, other_lr, log=said.append, checkpoint=tmp_path / "g.pt")
    assert said[0] == f"the generator checkpoint {tmp_path / 'g.pt'} was made with other settings (frames_sha256): " \
                      f"training the generator from step 0"


# ---- silence of foreign logs ------------------------------------------------------------------------------
def test_face_landmarks_and_the_matte_write_nothing_to_stderr():
    code = ("import numpy as np\n"
            "from framegraph.models.face import FaceLandmarker\n"
            "from framegraph.models.matte import person_mattes\n"
            "from framegraph.models.synth import astronaut_portrait\n"
            "img = np.array(astronaut_portrait().image)\n"
            "noise = np.random.default_rng(0).integers(0, 255, img.shape, dtype=np.uint8)\n"
            "with FaceLandmarker() as m:\n"
            "    print(len(m.detect(img)), len(m.detect(noise)))\n"
            "print(person_mattes(np.stack([img, img])).shape[0])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "0", "2"]
    assert done.stderr == ""


# ---- the command line: estimate, ETA, Ctrl-C, --resume, silence -------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(900)  # two trainings of a 12-s clip, each with its landmarks and matte
def test_ctrl_c_in_training_keeps_the_step_and_the_same_command_continues_there(astronaut_talking_clip, tmp_path):
    out = tmp_path / "avatar"
    cmd = [sys.executable, "-m", "framegraph.apps.cli", "avatar", "train", "--video", str(astronaut_talking_clip),
           "--out", str(out), "--steps", "200", "--max-region", "64", "--threads", "1", "--loop-seconds", "6",
           "--no-openness-calibration", "--typed-sentences", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = []
    for line in proc.stderr:
        first.append(line)
        if line.startswith("generator step 100/200"):
            proc.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal sends
    proc.stdout.read()
    assert proc.wait(timeout=60) == 130
    first = "".join(first)
    assert re.search(r"^the generator's 200 steps will take about \d+ (s|min|h) here: [\d.]+ s a step, measured just "
                     r"now on 3 trial steps at 64² with 1 CPU thread", first, re.M), first
    assert re.search(r"^generator step 50/200 loss [\d.]+ \(L1 [\d.]+\), [\d.]+ s/step, about \d+ (s|min|h) left$",
                     first, re.M), first
    assert "Ctrl-C: finishing this step and saving (Ctrl-C again to stop at once)" in first
    stopped = re.search(r"^interrupted at generator step (\d+)/200; the checkpoint (.+) keeps it: run the same "
                        r"command again to continue from there$", first, re.M)
    assert stopped and stopped[2] == str(out / "train" / "generator_state.pt"), first
    assert not (out / "avatar.json").exists()
    assert foreign_lines(first) == [], first

    second = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr
    assert f"generator: continuing at step {stopped[1]}/200 from the checkpoint {stopped[2]}\n" in second.stderr
    assert "generator step 0/200" not in second.stderr and "generator step 199/200" in second.stderr
    assert foreign_lines(second.stderr) == [], second.stderr
    report = json.loads((out / "train_report.json").read_text())
    assert [h["step"] for h in report["generator_history"]] == [*range(0, 200, 50), 199]
    assert np.isfinite([h["loss"] for h in report["generator_history"]]).all()
    assert second.stdout.strip() == str(out.resolve())


def test_the_estimate_is_not_measured_when_the_checkpoint_has_every_step(tmp_path, monkeypatch):
    """Resuming from a finished generator says so instead of timing 3 trial steps (a few seconds for nothing);
    an unfinished one, or --no-resume, is still measured."""
    import torch

    from framegraph.models.avatar.video import generator as g
    from framegraph.models.avatar.video.train import VideoTrainConfig

    cfg = VideoTrainConfig(steps=200, max_region=64)
    checkpoint = tmp_path / "generator_state.pt"
    torch.save({"step": 200}, checkpoint)
    measured, said = [], []
    monkeypatch.setattr(g, "estimate_generator", lambda cfg, side: measured.append(side) or 0.01)
    g.say_estimate(cfg, 1, checkpoint, said.append)
    assert measured == [] and "has all 200 steps" in said[-1]
    g.say_estimate(cfg, 1, checkpoint, said.append, resume=False)
    torch.save({"step": 120}, checkpoint)
    g.say_estimate(cfg, 1, checkpoint, said.append)
    assert measured == [64, 64] and all("will take about" in s for s in said[1:])
