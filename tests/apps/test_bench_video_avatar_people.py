"""`framegraph bench video_avatar --people`: per talking video, a bundle trained with the change off and one with it
on, sharing one generator, both measured on the held-out tail; the verdict follows the per-person figures."""
import json

import pytest

from framegraph.apps.cli import main
from framegraph.models.avatar.video.features import CHOICES


@pytest.mark.slow
def test_people_bench_trains_before_and_after_on_one_generator_and_judges_the_change(astronaut_talking_clip,
                                                                                  tmp_path, capsys):
    out, work = tmp_path / "people.json", tmp_path / "work"
    assert main(["bench", "video_avatar", "--people", str(astronaut_talking_clip), "--work", str(work),
                 "--steps", "40", "--seconds", "1", "--region", "0", "--threads", "1", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["benchmark"] == "video_avatar" and r["command"].startswith("framegraph bench video_avatar --people")
    assert r["change"] == "whisper" and r["holdout"] == 0.2
    (p,) = r["people"]
    before, after = p["before"], p["after"]
    # before: the encoder alone; after: every candidate was fitted and the best cross-validated one kept
    assert before["audio_features"] == "encoder" and before["features"] == "encoder"
    fits = json.loads((work / p["person"] / "after" / "train_report.json").read_text())["shape_head"]["features"]
    assert sorted(fits["cv_openness_corr"]) == sorted(CHOICES)
    assert after["audio_features"] == max(fits["cv_openness_corr"], key=fits["cv_openness_corr"].get)
    assert after["features"] == ("encoder" if after["audio_features"] == "encoder" else "encoder+whisper")
    reports = [json.loads((work / p["person"] / s / "train_report.json").read_text()) for s in ("before", "after")]
    assert reports[0]["generator_history"] == reports[1]["generator_history"]  # one generator, trained once
    for side in (before, after):  # measured on the tail training never saw, as a user's eyes would
        assert side["heldout_start_s"] > 9 and -1 <= side["landmark_openness_corr"] <= 1
        assert side["landmark_openness_swing"] > 0 and side["lips_sharpness_ratio"] > 0
        (size,) = side["fps"]  # the bundle's own region (--region 0: no other)
        assert side["fps"][size] > 0 and side["first_frame_ms"][size] > 0
    change = round(after["landmark_openness_corr"] - before["landmark_openness_corr"], 4)
    assert p["corr_change"] == change and p["worse"] == (change < -0.03)
    assert r["kept"] == (not p["worse"]) and r["verdict"].startswith("kept" if r["kept"] else "not kept")
    assert (tmp_path / "people.png").stat().st_size > 1000
    assert f"openness r {before['landmark_openness_corr']} -> {after['landmark_openness_corr']}" in \
        capsys.readouterr().out

    assert main(["bench", "video_avatar", "--people", str(astronaut_talking_clip), "--change", "steps",
                 "--out", str(out)]) == 2
    assert ("--change 'steps'; expected one of ['whisper', 'av_sync', 'follow_openness', 'gain_folds']"
            in capsys.readouterr().err)
    assert main(["bench", "video_avatar", "--people", str(tmp_path / "none.mp4"), "--out", str(out)]) == 2
    assert "does not exist; expected a talking video of one person" in capsys.readouterr().err
    assert main(["bench", "video_avatar", "--out", str(out)]) == 2
    assert "needs --avatar and --clip" in capsys.readouterr().err
