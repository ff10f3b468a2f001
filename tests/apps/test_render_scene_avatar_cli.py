"""The talking avatar inside a 3D Gaussian scene (`framegraph render --scene ... --avatar ... --place ...`): one graph,
audio driving the avatar and the camera driving the scene, meeting in a compositing stage on the audio clock. What a
viewer notices: the mouth moves in the composite while speech plays and rests in silence; picture and sound stay
together after compositing (a flash / beep clip placed in the scene); bad input is refused with a sentence."""
import json
import shutil
import subprocess

import numpy as np
import pytest
import torch
from helpers import write_wav
from test_testcard_cli import beep_onsets_s

from framegraph.apps.cli import main
from framegraph.assets import path as asset
from framegraph.models.avatar import load_avatar
from framegraph.renderers.billboard import Placement
from framegraph.renderers.cameras import OPENGL_TO_OPENCV, CameraPath, intrinsics, look_at, project_points
from framegraph.stream.media import read_video

SHIPPED = asset("avatars", "astronaut")
TOY = asset("scenes", "toy.ply")
W, H = 256, 144
EYE, TARGET = (-0.3, -2.1, 0.75), (-0.3, -0.9, 0.5)
PLACE = Placement((-0.3, -0.9, 0.0), 1.0, 0.0)  # facing -y: towards the camera


def camera_path_file(path) -> str:
    """A nerfstudio camera_path.json holding one camera (a still camera: the path loops)."""
    c2w = torch.linalg.inv(look_at(EYE, TARGET).double()) @ OPENGL_TO_OPENCV
    doc = {"render_width": W, "render_height": H, "fps": 25, "camera_type": "perspective",
           "camera_path": [{"camera_to_world": c2w.flatten().tolist(), "fov": 50.0}]}
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.fixture(scope="module")
def speech_then_silence(tmp_path_factory):
    """espeak-ng saying a sentence (about 1.6 s, 16 kHz), then 1.4 s of silence; the speech's length in s."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("needs the system package espeak-ng")
    folder = tmp_path_factory.mktemp("speech")
    said = folder / "said.wav"
    subprocess.run(["espeak-ng", "-w", str(said), "-s", "190", "Hello there, I am talking."], check=True)
    from framegraph.stream.media import decode_audio

    voice = decode_audio(str(said))[:int(1.6 * 16000)]
    return write_wav(folder / "talk.wav", np.concatenate([voice, np.zeros(int(1.4 * 16000), np.int16)])), \
        len(voice) / 16000


def mouth_box_px(avatar) -> tuple[int, int, int, int]:
    """The avatar's mouth box (its bundle's, around the lips at rest) as pixels of the composite: x0, y0, x1, y1."""
    x, y, w, h = avatar.mouth_box
    K = intrinsics(W, H, fov_deg=50.0)
    center = torch.tensor(EYE, dtype=torch.float32)
    aspect = avatar.width / avatar.height
    corners = torch.stack([PLACE.world_point(u / avatar.width, v / avatar.height, aspect, center)
                           for u in (x - 4, x + w + 4) for v in (y - 4, y + h + 8)])
    uv, _ = project_points(corners, look_at(EYE, TARGET), K)
    (x0, y0), (x1, y1) = uv.min(0).values.floor().int().tolist(), uv.max(0).values.ceil().int().tolist()
    return x0, y0, x1, y1


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_mouth_moves_in_the_scene_while_speech_plays_and_rests_in_silence(tmp_path, speech_then_silence, device):
    """On CUDA the avatar's picture arrives on the GPU and the blend runs there (on an H200 the graph once refused
    to start: the compositor's picture port was on the host)."""
    wav, speech_s = speech_then_silence
    out = tmp_path / "in_scene.mp4"
    assert main(["render", "--scene", str(TOY), "--avatar", str(SHIPPED), "--audio", wav, "--place=-0.3,-0.9,0,0,1",
                 "--camera-path", camera_path_file(tmp_path / "camera.json"), "--size", f"{W}x{H}",
                 "--device", device, "--out", str(out)]) == 0
    v = read_video(out)
    frames = v["frames"].astype(float)
    assert frames.shape == (75, H, W, 3) and v["fps"] == 25.0
    assert v["audio"] is not None and abs(len(v["audio"]) / v["audio_rate"] - 3.0) < 0.1
    x0, y0, x1, y1 = mouth_box_px(load_avatar(SHIPPED))
    assert x1 - x0 >= 12 and y1 - y0 >= 6  # the mouth is in the picture, big enough to see
    motion = np.abs(np.diff(frames[:, y0:y1, x0:x1], axis=0)).mean(axis=(1, 2, 3))  # per frame step
    talking = motion[2:int(speech_s * 25) - 2].mean()
    resting = motion[int(speech_s * 25) + 8:].mean()  # after the voice detector's hangover
    assert talking > 1.5 and talking > 4 * resting, (talking, resting)
    # the rest of the picture is the still scene: it does not move (the camera stands still)
    still = np.abs(np.diff(frames[:, :, :W // 4], axis=0)).mean()
    assert still < 0.5


def test_picture_and_sound_stay_together_after_compositing(tmp_path):
    """The flash / beep check through the scene: the test card (a white flash each second, a beep exactly on it)
    stands in the scene as the picture branch, the toy scene renders around it; in the written file each beep is
    within +15 ms (sound early) / -45 ms (sound late) of its flash, as broadcast practice asks."""
    from framegraph.apps.scene_avatar.graph import add_scene_branch, place_picture
    from framegraph.renderers.scene_file import open_scene
    from framegraph.renderers.stages import CameraSource
    from framegraph.stream import Clock, Graph
    from framegraph.stream.media import MP4Sink
    from framegraph.stream.testcard import TestCardAudio, TestCardVideo

    fps, seconds, w, h = 25, 3.0, 160, 96
    scene = open_scene(TOY)
    view, K = look_at(EYE, TARGET), intrinsics(w, h, fov_deg=50.0)
    g = Graph(Clock("fast"), name="flash-in-scene")
    card = g.add(TestCardVideo(width=96, height=72, fps=fps, seconds=seconds))
    sound = g.add(TestCardAudio(fps=fps, seconds=seconds))
    _, render = add_scene_branch(g, scene, CameraSource(CameraPath(view[None], K[None], w, h, fps), fps=fps,
                                                        n_frames=int(seconds * fps)), width=w, height=h)
    quad = place_picture(g, card, render, Placement((-0.3, -0.9, 0.0), 0.8, 0.0), image_size=(72, 96), scene=scene,
                         matte=False)
    sink = g.add(MP4Sink(tmp_path / "flash.mp4", width=w, height=h, fps=fps))
    g.connect(quad, sink, "video", "video")
    g.connect(sound, sink, "audio", "audio", capacity=4)
    g.run()
    v = read_video(tmp_path / "flash.mp4")
    uv, _ = project_points(torch.tensor([[-0.3, -0.9, 0.4]]), view, K)  # the middle of the card in the scene
    x, y = uv[0].int().tolist()
    brightness = v["frames"][:, y - 3:y + 4, x - 3:x + 4].mean(axis=(1, 2, 3))
    flashes = np.where(brightness > 240)[0]
    assert list(flashes) == [0, 25, 50]
    beeps = beep_onsets_s(v["audio"], v["audio_rate"], v["audio_start_s"] or 0.0)
    assert len(beeps) == 3
    offsets_ms = 1000 * (beeps - v["frame_times_s"][flashes])
    assert np.all((offsets_ms >= -15) & (offsets_ms <= 45)), offsets_ms


@pytest.fixture(scope="module")
def short_wav(tmp_path_factory):
    from helpers import tone

    return write_wav(tmp_path_factory.mktemp("a") / "a.wav", tone(0.4))


@pytest.mark.parametrize("argv, message", [
    (["--place", "5,0,0"], "--place 5,0,0: the point (5,0,0) lies outside the scene"),
    (["--place", "0,0,0,0,-1"], "HEIGHT -1 must be > 0"),
    ([], "needs --place X,Y,Z[,YAW,HEIGHT]"),
    (["--place", "0,0,0", "--alpha"], "in a scene the scene is the background"),
])
def test_bad_placement_is_refused_with_a_sentence(tmp_path, short_wav, capsys, argv, message):
    cmd = ["render", "--scene", str(TOY), "--avatar", str(SHIPPED), "--audio", short_wav, *argv,
           "--out", str(tmp_path / "x.mp4")]
    if "must be > 0" in message:  # argparse's own refusal
        with pytest.raises(SystemExit):
            main(cmd)
    else:
        assert main(cmd) == 2
    assert message in capsys.readouterr().err


def test_a_bundle_without_matte_or_a_scene_that_does_not_load_is_named(tmp_path, short_wav, capsys):
    old = tmp_path / "old"
    shutil.copytree(SHIPPED, old, ignore=shutil.ignore_patterns("matte.png", "onnx"))
    base = ["render", "--audio", short_wav, "--place", "0,0,0", "--out", str(tmp_path / "x.mp4")]
    assert main([*base, "--scene", str(TOY), "--avatar", str(old)]) == 2
    assert f"avatar bundle '{old}' has no person matte" in capsys.readouterr().err
    broken = tmp_path / "broken.ply"
    broken.write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 3\nend_header\n")
    assert main([*base, "--scene", str(broken), "--avatar", str(SHIPPED)]) == 2
    err = capsys.readouterr().err
    assert str(broken) in err and "error:" in err
    assert main([*base, "--scene", str(tmp_path / "nothing.ply"), "--avatar", str(SHIPPED)]) == 2
    assert "does not exist" in capsys.readouterr().err
