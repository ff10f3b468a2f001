"""A prepared MuseTalk bundle live: a real server's ``avatar`` session over the WebSocket (microphone audio in, the
person's frames with the face redrawn out, the echo, a barge-in) and a real Pipecat pipeline (pictures at the fps,
each audio frame after its picture). Tiny random models in MuseTalk's layout, prepared on the astronaut's clip."""
import asyncio
import io

import numpy as np
import pytest
from helpers import tiny_musetalk_folder
from PIL import Image
from test_avatar_pipeline import speak
from test_server_session import running, tone

from framegraph.apps.cli import main
from framegraph.models.avatar import load_avatar
from framegraph.stream import TICKS_PER_SECOND


@pytest.fixture(scope="module")
def avatar_dir(tmp_path_factory, astronaut_talking_clip):
    root = tmp_path_factory.mktemp("avatars")
    files = tiny_musetalk_folder(tmp_path_factory.mktemp("musetalk"))
    assert main(["avatar", "prepare", "--musetalk", str(files), "--video", str(astronaut_talking_clip),
                 "--out", str(root / "muse"), "--loop-seconds", "3", "--idle-seconds", "1"]) == 0
    mp = pytest.MonkeyPatch()
    mp.setenv("FRAMEGRAPH_AVATARS", str(root))
    yield root
    mp.undo()


def test_a_server_session_streams_the_person_with_the_face_redrawn_and_takes_a_barge_in(avatar_dir):
    samples = tone(1.6, amp=0.3)
    with running() as srv:
        ready, got = asyncio.run(speak(srv.url, {"avatar": "muse"}, samples, {40: {"type": "interrupt"}}))
    assert ready["avatar"] == "muse" and (ready["video"]["width"], ready["video"]["height"]) == (256, 256)
    # 1.6 s at 25 fps: the tiny model on a 2-core CPU skips some live, but the picture never stops for long
    seconds = np.array([h.pts for h, *_ in got["video"]]) / TICKS_PER_SECOND
    assert len(seconds) >= 10 and seconds[-1] >= 1.0 and np.diff(seconds).max() < 0.4, seconds
    a = load_avatar(avatar_dir / "muse")
    x1, y1, x2, y2 = (int(v) for v in np.median(a.boxes, axis=0))
    picture = np.asarray(Image.open(io.BytesIO(got["video"][-1][1])).convert("RGB"), np.float64)
    loop = a.frames.numpy().astype(np.float64)
    top = min(np.abs(loop[i, :y1] - picture[:y1]).mean() for i in range(len(loop)))
    face = min(np.abs(loop[i, (y1 + y2) // 2 + 4:y2 - 4, x1 + 8:x2 - 8]
                      - picture[(y1 + y2) // 2 + 4:y2 - 4, x1 + 8:x2 - 8]).mean() for i in range(len(loop)))
    assert top < 6 and face > 10, (top, face)  # the person's own frame above the face, the model's lower face
    assert sum(h.payload_len for h, *_ in got["audio"]) >= 2 * 0.8 * 16000  # the echo
    assert got["control"][-1]["type"] == "ended"


def test_a_pipecat_pipeline_gets_pictures_at_the_fps_each_before_its_sound(avatar_dir):
    pytest.importorskip("pipecat", reason="framegraph[pipecat] (pipecat-ai) is part of the dev extra")
    from pipecat.frames.frames import EndFrame

    from framegraph.apps.bench.pipecat_agent import Agent, audio_after_image, run, split, utterance
    from framegraph.apps.pipecat import FramegraphAvatar
    from framegraph.models.synth import synthesize

    said = synthesize("The prepared person speaks through Pipecat.", voice="en-us", sample_rate=24_000).samples
    agent = Agent(FramegraphAvatar(str(avatar_dir / "muse")))
    run([agent], [["pictures", 0.6, ("realtime", utterance(said, 24_000, "one")), 0.8, EndFrame()]])
    end = agent.fed[-1][0]
    rec = split([(t, f) for t, f in agent.sink.got if t < end])
    span = (rec.images[-1][0] - rec.images[0][0]) / 1e9
    assert len(rec.images) / span == pytest.approx(25, rel=0.15)  # the output rate, the models skipping if slow
    assert {f.size for _, f in rec.images} == {(256, 256)}
    order = audio_after_image(rec)
    assert order["frames"] > 50 and order["share"] == 1.0 and order["lead_ms"] == 0, order
    heard = sum(len(f.audio) // 2 for _, f in rec.audio)
    assert heard > 0.8 * len(said)
