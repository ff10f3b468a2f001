"""``framegraph bench first_frame`` on the CPU: each configuration in a fresh process, the video avatar once per
region; the first frame is split into the graph's start, what the source captured before the first unit, and the
first unit's own latency; a warm-up shortens the first frame a user waits for."""
import json

from framegraph.apps.cli import main


def test_first_frame_per_region_split_into_its_parts_and_shortened_by_the_warm_up(tmp_path):
    out = tmp_path / "ff.json"
    assert main(["bench", "first_frame", "--pipelines", "video_avatar", "--runtimes", "torch", "--video-region",
                 "64,96", "--frames", "10", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = data["configurations"]
    assert [(r["video_region"], r["start"]) for r in rows] == [(64, "cold"), (64, "warm"), (96, "cold"),
                                                             (96, "warm")]
    for r in rows:
        assert "error" not in r, r
        assert 0 < r["graph_start_s"] <= r["first_capture_s"] < r["first_frame_s"]
        assert r["first_frame_s"] >= r["first_unit_latency_s"] > 0 and r["units"] >= 8
        assert r["first_over_steady"] == r["first_frame_s"] / r["steady_latency_s"]
        assert r["meets_target"] == (r["first_over_steady"] <= data["target_first_over_steady"])
    for region in (64, 96):
        cold, warm = (r for r in rows if r["video_region"] == region)
        assert warm["first_frame_s"] < cold["first_frame_s"], (region, cold, warm)
    assert (tmp_path / "ff.png").stat().st_size > 0


def test_repeat_keeps_the_median_run_of_fresh_processes(tmp_path):
    out = tmp_path / "ff.json"
    assert main(["bench", "first_frame", "--pipelines", "video_avatar", "--runtimes", "torch", "--video-region",
                 "64", "--frames", "6", "--warmup", "1", "--repeat", "3", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["repeat"] == 3
    for r in data["configurations"]:
        ratios = r["first_over_steady_runs"]
        assert r["runs"] == 3 and len(ratios) == 3 and len(set(ratios)) == 3  # three processes, three samples
        assert r["first_over_steady"] == sorted(ratios)[1]
