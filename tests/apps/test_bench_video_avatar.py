"""`framegraph bench video_avatar` on a tiny random video avatar and a clip of its own frames: the JSON holds
the held-out quality block and a speed run per region size, and a portrait bundle is refused."""
import json

import numpy as np
import pytest
import torch
from helpers import tone, write_video

from framegraph.apps.cli import main
from framegraph.models.avatar import random_avatar, save_avatar
from framegraph.models.avatar.video_bundle import random_video_avatar, save_video_avatar


@pytest.mark.slow
def test_bench_video_avatar_writes_quality_and_speed(tmp_path, capsys):
    torch.set_num_threads(1)
    avatar = random_video_avatar(n_frames=8)
    save_video_avatar(tmp_path / "me", avatar)
    frames = np.concatenate([avatar.frames.numpy()] * 4)  # 32 frames = 1.28 s of "the person"
    clip = write_video(tmp_path / "me.mp4", frames, 25, tone(1.28))
    out = tmp_path / "results" / "video_avatar.json"
    assert main(["bench", "video_avatar", "--avatar", str(tmp_path / "me"), "--clip", clip, "--seconds", "1",
                 "--region", "128", "--threads", "1", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["benchmark"] == "video_avatar" and r["command"].startswith("framegraph bench video_avatar")
    q = r["quality"]
    assert q["frames"] == 32 and q["faces_found_generated"] == 1.0
    assert q["outside_mouth_psnr_db"] >= 30  # outside the mouth: the clip's own frames
    assert [s["region_size"] for s in r["speed"]] == [64, 128]
    for s in r["speed"]:
        assert s["frames"] == 25 and s["fps"] > 0 and s["first_frame_ms"] > 0
    assert (tmp_path / "results" / "video_avatar.png").stat().st_size > 1000
    save_avatar(tmp_path / "portrait", random_avatar())
    capsys.readouterr()
    assert main(["bench", "video_avatar", "--avatar", str(tmp_path / "portrait"), "--clip", clip,
                 "--out", str(out)]) == 2
    assert "is a portrait bundle; this bench measures a video avatar" in capsys.readouterr().err
