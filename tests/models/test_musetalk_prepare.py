"""A person prepared for MuseTalk: the face box as MuseTalk 1.5 draws it, the blend mask, the paste back, and
`framegraph avatar prepare --musetalk` on a real talking video (the astronaut's clip) with tiny random models in
MuseTalk's layout; bad input as sentences."""
import json

import av
import numpy as np
import pytest
import torch
from helpers import tiny_musetalk_folder

from framegraph.apps.cli import main
from framegraph.models.avatar.musetalk.bundle import load_musetalk_avatar
from framegraph.models.avatar.musetalk.face import (
    FACE_SIZE,
    MARGIN_PX,
    NOSE_RIDGE,
    blend_mask,
    crop_face,
    face_box,
    feather_sigma,
    paste_face,
)
from framegraph.models.avatar.musetalk.files import load_vae
from framegraph.models.avatar.musetalk.step import face_latents
from framegraph.models.face.landmarks import CHIN, FACE_OVAL, JAW_LINE, N_POINTS
from framegraph.models.synth import load_portrait

ASTRONAUT = load_portrait()


def landmarks(left=40.0, right=140.0, top=20.0, ridge=90.0, chin=150.0) -> np.ndarray:
    """A face's 478 points with the outline from ``left`` to ``right``, the nose ridge and the chin where asked."""
    p = np.full((N_POINTS, 2), [(left + right) / 2, ridge], np.float32)
    oval = list(FACE_OVAL)
    p[oval, 0] = np.linspace(left, right, len(oval))
    p[oval, 1] = top
    p[list(JAW_LINE), 1] = np.linspace(chin - 30, chin - 30, len(JAW_LINE))
    p[CHIN] = [(left + right) / 2, chin]
    p[NOSE_RIDGE, 1] = ridge
    return p


def test_the_face_box_is_musetalks_cheek_to_cheek_from_the_chin_mirrored_over_the_nose_ridge_plus_the_margin():
    x1, y1, x2, y2 = face_box(landmarks(), (200, 200))
    assert (x1, x2) == (40, 140)
    assert y1 == 90 - (150 - 90) and y2 == 150 + MARGIN_PX
    # clipped to the frame: a chin near the bottom edge, a ridge so low the mirrored top is above the frame
    assert face_box(landmarks(chin=195), (200, 200))[3] == 200
    assert face_box(landmarks(ridge=60, chin=190), (200, 200))[1] == 0
    with pytest.raises(ValueError, match="too small"):
        face_box(landmarks(left=50, right=50.5), (200, 200))


def test_the_blend_mask_keeps_the_lower_face_below_the_box_middle_feathered_and_nothing_outside_it():
    box = (40, 30, 140, 160)
    polygon = np.array([[50, 60], [130, 60], [130, 150], [50, 150]], np.float32)  # the lower face, px of the frame
    m = blend_mask(polygon, box).astype(np.float32)
    assert m.shape == (130, 100)
    middle = (160 - 30) // 2
    assert m[:middle - 8].max() < 40  # above the middle: the face as it was (the feather reaches a little up)
    assert m[middle + 30:110, 30:70].min() == 255  # deep inside: all of the drawn face
    assert m[:, :2].max() < 5  # well left of the polygon (3 sigma): nothing
    edge = m[middle + 30:110, 10]  # the polygon's left edge (x 50 = column 10) is soft, not a step
    assert 40 < edge.mean() < 215, edge
    assert feather_sigma(box) == pytest.approx(0.3 * ((int(0.1 * 2 * int(130 // 2 * 1.5) // 2 * 2) + 1 - 1) * 0.5
                                                      - 1) + 0.8)


def test_the_paste_blends_the_drawn_face_into_its_box_by_the_mask_and_leaves_the_rest_of_the_frame():
    frame = torch.from_numpy(np.asarray(ASTRONAUT.image)).clone()
    box = (60, 40, 180, 200)
    face = torch.full((FACE_SIZE, FACE_SIZE, 3), 200, dtype=torch.uint8)
    mask = torch.zeros(160, 120, dtype=torch.uint8)
    mask[80:] = 255
    mask[60:80] = 128
    out = paste_face(frame, face, box, mask)
    assert torch.equal(out[:, :60], frame[:, :60]) and torch.equal(out[:40], frame[:40])
    assert torch.equal(out[40:100, 60:180], frame[40:100, 60:180])  # mask 0: the frame as it was
    assert (out[120:200, 60:180] == 200).all()  # mask 255: the drawn face (flat 200 stays 200 when scaled)
    half = (frame[100:120, 60:180].float() * (1 - 128 / 255) + 200 * 128 / 255).round()
    assert torch.equal(out[100:120, 60:180].float(), half)
    assert torch.equal(frame, torch.from_numpy(np.asarray(ASTRONAUT.image)))  # not changed in place


@pytest.fixture(scope="module")
def musetalk_dir(tmp_path_factory):
    return tiny_musetalk_folder(tmp_path_factory.mktemp("musetalk"))


def test_prepare_makes_a_bundle_of_the_loop_its_face_boxes_masks_and_latents(musetalk_dir, astronaut_talking_clip,
                                                                              tmp_path, capsys):
    out = tmp_path / "person"
    assert main(["avatar", "prepare", "--musetalk", str(musetalk_dir), "--video", str(astronaut_talking_clip),
                 "--out", str(out), "--loop-seconds", "3", "--idle-seconds", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(out.resolve())
    a = load_musetalk_avatar(out)
    assert a.kind == "musetalk" and a.fps == 25.0 and len(a.frames) == 75 and (a.width, a.height) == (256, 256)
    assert a.idle[1] - a.idle[0] == 25 and len(a.nearest_idle) == 75
    assert all(a.idle[0] <= j < a.idle[1] for j in a.nearest_idle)
    # every box holds the portrait's mouth (the clip is the astronaut speaking) and sits on the face
    mx, my, mw, mh = ASTRONAUT.mouth_box
    for x1, y1, x2, y2 in a.boxes:
        assert x1 <= mx and mx + mw <= x2 and y1 <= my and my + mh <= y2, (x1, y1, x2, y2)
        assert 60 <= x2 - x1 <= 160 and 80 <= y2 - y1 <= 200
    # the mask covers the mouth, not the eyes
    x1, y1, _, _ = a.boxes[0]
    m = a.masks[0]
    assert m[my + mh // 2 - y1, mx + mw // 2 - x1] == 255
    eye_x, eye_y = ASTRONAUT.eye_boxes[0][:2]
    assert m[max(0, eye_y - y1), max(0, eye_x - x1)] == 0
    # the latents are the VAE's of each loop face as MuseTalk crops it
    vae = load_vae(musetalk_dir / "models/sd-vae")
    files = json.loads((out / "avatar.json").read_text())["musetalk"]
    assert files["vae"] == str(musetalk_dir / "models/sd-vae")
    crop = crop_face(a.frames[10].numpy(), tuple(a.boxes[10]))
    again = face_latents(vae, torch.from_numpy(crop)[None])[0]
    assert a.latents.shape == (75, 8, 32, 32)
    # the loop frames are read back from the H.264 loop (crf 10): near, and nearer than another loop frame's
    off = (a.latents[10] - again).abs().mean() / a.latents[10].std()
    other = (a.latents[50] - again).abs().mean() / a.latents[10].std()
    assert off < 0.1 and off < other / 2, (off, other)
    assert "SHA-256" in (out / "PROVENANCE.md").read_text()


def write_video(path, frames: np.ndarray, fps: int = 25) -> None:
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for f in frames:
            c.mux(s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        c.mux(s.encode(None))


def test_bad_input_is_a_sentence_naming_it(musetalk_dir, tmp_path, capsys):
    def prepare(video, folder=musetalk_dir, *more):
        code = main(["avatar", "prepare", "--musetalk", str(folder), "--video", str(video), "--out",
                     str(tmp_path / "out"), "--loop-seconds", "1", *more])
        return code, capsys.readouterr().err

    portrait = np.asarray(ASTRONAUT.image)
    faceless = tmp_path / "wall.mp4"
    write_video(faceless, np.full((25, 128, 128, 3), 90, np.uint8))
    code, err = prepare(faceless)
    assert code == 2 and "no face" in err and "of 25 frames" in err, err
    pair = tmp_path / "two.mp4"
    write_video(pair, np.repeat(np.concatenate([portrait, portrait], axis=1)[None], 25, axis=0))
    code, err = prepare(pair)
    assert code == 2 and "two faces" in err, err
    code, err = prepare(tmp_path / "missing.mp4")
    assert code == 2 and "missing.mp4" in err and "does not exist" in err, err
    code, err = prepare(faceless, tmp_path / "nowhere")
    assert code == 2 and "musetalk.json" in err and "models/musetalkV15" in err, err
    code, err = prepare(faceless, musetalk_dir, "--whisper", str(tmp_path / "nowhere"))
    assert code == 2 and "Whisper is not at" in err, err
