"""A prepared MuseTalk bundle streamed like every bundle: `framegraph render --avatar` through the graph (the
context stage, the loop, the face stage) on tiny random models in MuseTalk's layout and the astronaut's speech —
sound in the file, the face redrawn inside its box from the sound of its time and nothing outside it; the runtimes
it does not have refused with a sentence."""
import numpy as np
import pytest
import torch
from helpers import write_wav

from framegraph.apps.cli import main
from framegraph.models.avatar import load_avatar
from framegraph.models.synth import synthesize
from framegraph.stream.media import read_video

RATE = 16_000


@pytest.fixture(scope="module")
def bundle(musetalk_bundle):
    return musetalk_bundle


def speech_between_silences(root, text: str):
    """1.2 s of silence, ``text`` said, 1.2 s of silence (16 kHz): the WAV, and the samples of silence and speech."""
    said = synthesize(text, voice="en-us", sample_rate=RATE).samples
    quiet = np.zeros(int(1.2 * RATE), np.int16)
    return write_wav(root / f"{len(text)}.wav", np.concatenate([quiet, said.astype(np.int16), quiet])), len(quiet), \
        len(said)


def test_render_streams_the_bundle_the_face_redrawn_in_its_box_from_the_sound_of_its_time(bundle, tmp_path):
    """Two renders whose sound is the same silence, then different sentences: their pictures are the same until the
    speech begins (less the context's 0.24-s reach), then the redrawn face differs, the rest of the frame never."""
    renders = []
    for text in ("Hello there, this is the avatar talking.", "Quick brown foxes jump over lazy dogs today."):
        wav, quiet, said = speech_between_silences(tmp_path, text)
        out = tmp_path / f"{len(text)}.mp4"
        assert main(["render", "--avatar", str(bundle), "--audio", str(wav), "--out", str(out)]) == 0
        v = read_video(out)
        assert v["fps"] == 25 and abs(len(v["frames"]) - np.ceil((2 * quiet + said) / 640)) <= 1
        assert np.abs(v["audio"][quiet + RATE // 10:quiet + said].astype(np.float32)).mean() > 200  # the sound
        renders.append(v["frames"].astype(np.float32))
    a = load_avatar(bundle)
    loop = a.frames.numpy().astype(np.float32)
    n = min(len(r) for r in renders)
    one, two = renders[0][:n], renders[1][:n]
    x1, y1 = a.boxes[:, :2].min(0)
    x2, y2 = a.boxes[:, 2:].max(0)
    outside = np.ones(one.shape[1:3], bool)
    outside[max(0, y1 - 4):y2 + 4, max(0, x1 - 4):x2 + 4] = False
    for k in (5, n // 2, n - 5):  # each picture is a loop frame outside the face boxes ...
        assert np.abs(loop[:, outside] - one[k][outside]).mean(axis=(1, 2)).min() < 3.0, k
    onset = int(quiet / 640)  # the first frame of speech
    # ... the same loop frame in both while both are silent (speaking, the loop plays its whole range as the voice
    # detector hears each sentence)
    assert np.abs(one[:onset - 7, outside] - two[:onset - 7, outside]).max() <= 2
    face = np.abs(one[:, y1:y2, x1:x2] - two[:, y1:y2, x1:x2]).mean(axis=(1, 2, 3))
    differ = int(np.argmax(face > 2.0))
    print(f"\nthe faces first differ at frame {differ}; speech starts at frame {onset}")
    assert face[:onset - 7].max() <= 1.0  # silence in both, further than a context reaches: the same picture
    assert onset - 7 <= differ <= onset + 1  # the face changes with the sound of its time, not later
    print(f"face difference in speech: {face[onset + 2:onset + 30].mean():.1f}")
    assert face[onset + 2:onset + 30].mean() > 3  # and is drawn from the sentence (5.9 here)


def test_runtimes_it_does_not_have_are_refused_with_a_sentence(bundle, tmp_path, capsys):
    wav = speech_between_silences(tmp_path, "Hi.")[0]
    code = main(["render", "--avatar", str(bundle), "--audio", str(wav), "--out", str(tmp_path / "x.mp4"),
                 "--runtime", "onnx-int8"])
    err = capsys.readouterr().err
    assert code == 2 and "avatar-musetalk runs on torch, compiled or onnx, not 'onnx-int8'" in err, err


def test_the_face_stage_draws_the_step_of_the_shown_loop_frame_pasted_by_its_mask(bundle):
    """One frame through the stage's picture against the parts spelled out: the step on loop frame i's latents
    and the context, the face scaled into i's box and blended by i's mask."""
    from framegraph.models.avatar.musetalk.engines import torch_engines
    from framegraph.models.avatar.musetalk.stages import MuseTalkFace

    a = load_avatar(bundle)
    settings = type("S", (), {"device": "cpu"})()
    eng = torch_engines(a, settings)
    rows = 10 * eng.whisper.layers
    stage = MuseTalkFace(a, eng.step, (rows, eng.whisper.width))
    context = torch.randn(rows, eng.whisper.width)
    i = 7
    frame = a.frames[i]
    got = stage.picture(context, frame, i)
    with torch.inference_mode():
        face = eng.step(a.latents[i:i + 1], context[None])[0]
    x1, y1, x2, y2 = (int(v) for v in a.boxes[i])
    drawn = torch.nn.functional.interpolate(face.permute(2, 0, 1)[None].float(), size=(y2 - y1, x2 - x1),
                                            mode="bilinear", align_corners=False)[0].permute(1, 2, 0)
    alpha = torch.from_numpy(a.masks[i]).float()[..., None] / 255
    want = frame.clone()
    want[y1:y2, x1:x2] = (alpha * drawn + (1 - alpha) * frame[y1:y2, x1:x2].float()).round().clamp(0, 255).byte()
    assert torch.equal(got, want)
    assert torch_engines(a, settings) is eng  # the models are loaded once per bundle, device and precision


def test_alpha_is_the_loop_frames_matte_once_the_bundle_has_one(bundle, tmp_path, capsys):
    """`--alpha` needs the person matte: refused with the command that adds it, then `avatar matte` adds the loop
    frames' mattes and the WebM's alpha is the matte of the frame shown."""
    import shutil

    from framegraph.stream.media import read_video_rgba

    own = tmp_path / "person"
    shutil.copytree(bundle, own)
    wav = speech_between_silences(tmp_path, "Alpha.")[0]
    out = tmp_path / "alpha.webm"
    code = main(["render", "--avatar", str(own), "--audio", str(wav), "--out", str(out), "--alpha"])
    err = capsys.readouterr().err
    assert code == 2 and "framegraph avatar matte --avatar" in err, err
    assert main(["avatar", "matte", "--avatar", str(own)]) == 0
    assert main(["render", "--avatar", str(own), "--audio", str(wav), "--out", str(out), "--alpha"]) == 0
    rgba = read_video_rgba(out)
    assert rgba["has_alpha"]
    mattes = load_avatar(own).matte.numpy().astype(np.float32)
    alpha = rgba["frames"][..., 3].astype(np.float32)
    assert min(np.abs(mattes - alpha[5]).mean(axis=(1, 2))) < 3  # the matte of a loop frame
    assert alpha[5].min() < 20 and alpha[5].max() > 235  # the background out, the person in


def test_avatar_eval_redraws_the_persons_real_frames_from_their_sound_and_measures_them(
        bundle, tmp_path, capsys, astronaut_talking_clip):
    """`avatar eval` on the person's real clip: each real frame's lower face redrawn (the rest of the frame its own),
    measured by the face landmarks; the figures in the JSON and the bundle's provenance; options of other kinds
    refused in a sentence."""
    import json
    import shutil

    own = tmp_path / "person"
    shutil.copytree(bundle, own)
    out, video = tmp_path / "m.json", tmp_path / "redrawn.mp4"
    assert main(["avatar", "eval", "--avatar", str(own), "--clip", str(astronaut_talking_clip), "--start-s", "1",
                 "--end-s", "3", "--out", str(out), "--video", str(video)]) == 0
    m = json.loads(out.read_text())
    assert m["frames"] == 50 and m["faces_found_real"] == 1.0 and m["reference"] == "the bundle's rest frame"
    assert m["outside_mouth_psnr_db"] > 30, m  # the face above the mouth is the real frame's
    for key in ("landmark_openness_corr", "landmark_openness_swing", "lips_sharpness_ratio", "redraw_ms_p50"):
        assert key in m
    real = read_video(astronaut_talking_clip)["frames"][25:75].astype(np.float32)
    drawn = read_video(video)["frames"].astype(np.float32)
    assert len(drawn) == 50
    a = load_avatar(own)
    x1, y1, x2, y2 = (int(v) for v in np.median(a.boxes, axis=0))
    assert np.abs(drawn[:, :y1 - 4] - real[:, :y1 - 4]).mean() < 3  # above the face: the real frame
    lower = slice((y1 + y2) // 2 + 8, y2 - 8), slice(x1 + 12, x2 - 12)
    assert np.abs(drawn[:, lower[0], lower[1]] - real[:, lower[0], lower[1]]).mean() > 8  # the model's mouth
    assert "mouth-openness correlation" in (own / "PROVENANCE.md").read_text()
    capsys.readouterr()
    code = main(["avatar", "eval", "--avatar", str(own), "--clip", str(astronaut_talking_clip), "--steps", "2",
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "--steps: not for a MuseTalk avatar" in err, err


def test_each_frame_shows_the_face_drawn_from_the_sound_of_its_own_time(bundle):
    """A/V sync of the composite, frame by frame: beeps and silence streamed through the graph, then each picture
    (outside the face: exactly a loop frame, which names it) redrawn by hand from the offline context of its own
    frame, of the frame before and of the frame after: its own time's face is the one shown, every frame."""
    from helpers import avatar_session

    from framegraph.models.avatar.base import RunSettings
    from framegraph.models.avatar.musetalk.engines import torch_engines
    from framegraph.models.avatar.musetalk.hearing import live_context
    from framegraph.models.avatar.musetalk.stages import MuseTalkFace

    a = load_avatar(bundle)
    beep = (9000 * np.sin(2 * np.pi * 700 * np.arange(RATE // 8) / RATE)).astype(np.int16)
    audio = np.zeros(2 * RATE, np.int16)
    for start in (0.5, 1.3):
        audio[int(start * RATE):][:len(beep)] = beep
    graph, sink = avatar_session(a, audio)
    graph.run()
    shown = torch.stack(sink.data())
    n = int(np.ceil(len(audio) / 640))
    assert len(shown) == n
    eng = torch_engines(a, RunSettings())
    context = live_context(eng.whisper, audio, a.fps, frames=n)
    stage = MuseTalkFace(a, eng.step, tuple(context.shape[1:]))
    x1, y1 = a.boxes[:, :2].min(0)
    x2, y2 = a.boxes[:, 2:].max(0)
    outside = torch.ones(shown.shape[1:3], dtype=torch.bool)
    outside[y1:y2, x1:x2] = False
    loop = a.frames.float()
    for k in range(n):
        i = int((loop[:, outside] - shown[k][outside].float()).abs().mean(dim=(1, 2)).argmin())
        face = shown[k, y1:y2, x1:x2].int()
        off = {j: (face - stage.picture(context[j], a.frames[i], i)[y1:y2, x1:x2].int()).abs()
               for j in {max(k - 1, 0), k, min(k + 1, n - 1)}}
        own = off.pop(k)
        assert int(own.max()) <= 1, k  # its own time's face, within a level of rounding
        assert all(own.float().mean() * 5 < d.float().mean() for d in off.values()), k  # not a neighbour's
