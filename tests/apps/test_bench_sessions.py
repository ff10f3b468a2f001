"""``framegraph bench sessions`` on the CPU: live sessions of a video avatar and of the portrait with and without the
model service, each run twice; a wrong pipeline name is refused in a sentence."""
import json

import pytest

from framegraph.apps.cli import main


def test_sessions_batched_and_alone_each_with_their_figures(tmp_path):
    out = tmp_path / "sessions.json"
    assert main(["bench", "sessions", "--pipeline", "video_avatar,avatar", "--sessions", "2", "--batching", "on,off",
                 "--runtime", "torch", "--video-region", "64", "--seconds", "1", "--repeat", "2",
                 "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    video = data["pipelines"]["video_avatar"]
    on, off = video["runs"]
    assert (on["batching"], off["batching"]) == ("on", "off") and on["sessions"] == off["sessions"] == 2
    for run in (on, off):
        assert len(run["per_session"]) == 2 and all(p["frames"] > 0 for p in run["per_session"])
        assert run["aggregate_fps"] == pytest.approx(sum(p["presented_fps"] for p in run["per_session"]))
        assert run["cpu_ms_per_frame"] > 0 and run["p95_ms_max"] > 0
    for run in (on, off):  # two runs each: the row is the slower (the lower median), both runs' figure beside it
        assert len(run["repeats_fps_min"]) == 2 and run["fps_min"] == min(run["repeats_fps_min"])
    (lane,) = on["service"].values()  # the generator's
    assert lane["served"] > 0 and set(lane["cost_ms"]) >= {"1", "2"}
    assert "service" not in off
    portrait_on, portrait_off = data["pipelines"]["avatar"]["runs"]
    assert sum(lane["served"] for lane in portrait_on["service"].values()) > 0  # its DiT's blocks, batched
    assert "service" not in portrait_off
    assert all(p["frames"] > 0 for run in (portrait_on, portrait_off) for p in run["per_session"])
    assert (tmp_path / "sessions.png").stat().st_size > 0


def test_a_pipeline_it_does_not_know_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "sessions", "--pipeline", "scope", "--out", "x.json"])
    assert e.value.code == 2
    assert "--pipeline 'scope': expected some of avatar, video_avatar, comma-separated" in capsys.readouterr().err
