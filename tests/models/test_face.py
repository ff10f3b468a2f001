"""Face landmarks from MediaPipe's face mesh, on the shipped real photograph and on renders of it."""
import json
from importlib import metadata

import cv2
import numpy as np
import pytest

from framegraph.models.face import FaceError, FaceLandmarker, FaceLandmarks, one_face
from framegraph.models.synth import FaceParams, PortraitRenderer, astronaut_portrait
from framegraph.models.synth.portrait import portraits_folder


@pytest.fixture(scope="module")
def landmarker():
    with FaceLandmarker() as fl:
        yield fl


@pytest.fixture(scope="module")
def astronaut():
    return astronaut_portrait().image


def inside(polygon: np.ndarray, point) -> bool:
    return cv2.pointPolygonTest(polygon.astype(np.float32).reshape(-1, 1, 2), tuple(map(float, point)), False) >= 0


def iou(a, b) -> float:
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    w = max(0, min(ax + aw, bx + bw) - max(ax, bx))
    h = max(0, min(ay + ah, by + bh) - max(ay, by))
    return w * h / (aw * ah + bw * bh - w * h)


def test_one_opencv_in_the_environment():
    """mediapipe is installed without its dependencies: no opencv-contrib-python beside ours."""
    opencvs = sorted(d.metadata["Name"].lower() for d in metadata.distributions()
                     if d.metadata["Name"].lower().startswith("opencv"))
    assert opencvs == ["opencv-python-headless"], opencvs
    assert cv2.__version__.startswith("4."), cv2.__version__


def test_landmarks_land_on_the_astronauts_real_mouth_and_eyes(landmarker, astronaut):
    faces = landmarker.detect(astronaut)
    assert len(faces) == 1
    face = faces[0]
    assert face.points.shape == (478, 2) and face.points.dtype == np.float32
    assert face.image_size == (256, 256)
    meta = json.loads((portraits_folder() / "astronaut.json").read_text())
    assert iou(face.mouth_box(), meta["mouth_box"]) > 0.5, (face.mouth_box(), meta["mouth_box"])
    # the lips part where the measured lip line is, and the mouth is inside the face
    centre_gap_y = (face.points[13, 1] + face.points[14, 1]) / 2
    assert abs(centre_gap_y - meta["lip_line_y"]) <= 3, centre_gap_y
    left, right = face.mouth_corners()
    mx, my, mw, mh = meta["mouth_box"]
    assert left[0] < right[0] and abs(left[0] - mx) <= 4 and abs(right[0] - (mx + mw)) <= 4, (left, right)
    for found, measured in zip(face.eye_boxes(), meta["eye_boxes"]):
        assert iou(found, measured) > 0.3, (found, measured)
    fx, fy, fw, fh = face.face_box()
    assert fx < left[0] < right[0] < fx + fw and fy < my < fy + fh
    # a smiling, lightly parted mouth; open eyes
    assert 0.02 < face.mouth_openness() < 0.3
    assert face.eyes_openness() > 0.2


def test_lower_face_polygon_covers_mouth_and_chin_not_the_eyes(landmarker, astronaut):
    face = landmarker.detect(astronaut)[0]
    poly = face.lower_face_polygon()
    assert poly.ndim == 2 and poly.shape[1] == 2 and len(poly) >= 8
    for p in np.concatenate([face.lip_outer(), face.points[[152]]]):  # every lip point and the chin
        assert inside(poly, p), p
    chin_y = face.points[152, 1]
    assert poly[:, 1].max() > chin_y + 2, "the region reaches past the chin (the jaw drops into it)"
    for p in face.points[[1, 33, 263, 10]]:  # nose tip, eye corners, forehead: not regenerated
        assert not inside(poly, p), p


def test_open_jaw_measures_more_openness_than_closed(landmarker):
    """The synthetic renderer's jaw, measured by the real landmark model: open > closed."""
    renderer = PortraitRenderer(astronaut_portrait())
    closed = landmarker.detect(renderer.render(FaceParams()).numpy())[0].mouth_openness()
    opened = landmarker.detect(renderer.render(FaceParams(jaw_open=1.0)).numpy())[0].mouth_openness()
    assert opened > closed + 0.1, (closed, opened)


def test_blink_measures_as_closed_eyes(landmarker):
    renderer = PortraitRenderer(astronaut_portrait())
    open_eyes = landmarker.detect(renderer.render(FaceParams()).numpy())[0].eyes_openness()
    shut = landmarker.detect(renderer.render(FaceParams(blink=1.0)).numpy())[0].eyes_openness()
    assert shut < 0.7 * open_eyes, (open_eyes, shut)


def test_no_face_gives_an_empty_list_and_a_clear_error(landmarker):
    rng = np.random.default_rng(0)
    for image in (np.zeros((240, 320, 3), np.uint8), rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)):
        assert landmarker.detect(image) == []
    with pytest.raises(FaceError, match="no face found in empty.png"):
        one_face([], where="empty.png")


def test_two_faces_and_a_small_face_are_errors(landmarker, astronaut):
    pair = np.concatenate([astronaut, astronaut[:, ::-1]], axis=1)  # two people side by side
    faces = landmarker.detect(pair)
    assert len(faces) == 2
    centres = sorted(f.face_box()[0] + f.face_box()[2] / 2 for f in faces)
    assert centres[0] < 256 < centres[1]
    with pytest.raises(FaceError, match="two faces found in pair.png"):
        one_face(faces, where="pair.png")
    face = landmarker.detect_one(astronaut, where="astronaut.png", min_face_px=64)
    with pytest.raises(FaceError, match=r"face too small in astronaut.png \(\d+ px wide, need ≥ 400 px\)"):
        one_face([face], where="astronaut.png", min_face_px=400)



def test_a_small_face_in_a_wide_frame_is_found_with_its_landmarks_in_frame_px(landmarker, astronaut):
    """A person at a lectern filmed in 1280x720: the face ~75 px wide, too small for the mesh's own detector (the
    video mode, which uses only that one, finds nothing); found all the same, landmarks where the photo's are;
    two such people are still two faces."""
    small = cv2.resize(astronaut, (200, 200), interpolation=cv2.INTER_AREA)
    frame = np.full((720, 1280, 3), 90, np.uint8)
    frame[300:500, 700:900] = small
    with FaceLandmarker(video=True, max_faces=1) as own_detector_only:
        assert own_detector_only.detect(frame) == []
    faces = landmarker.detect(frame)
    assert len(faces) == 1 and faces[0].image_size == (1280, 720)
    alone = landmarker.detect(small)[0]
    assert np.abs(faces[0].points - (alone.points + [700, 300])).mean() < 2.0  # px of the whole frame
    assert abs(faces[0].size_px() - alone.size_px()) <= 3 and faces[0].size_px() < 100
    frame[300:500, 200:400] = small[:, ::-1]
    with pytest.raises(FaceError, match="two faces"):
        one_face(landmarker.detect(frame), where="lectern.png")

def test_landmarks_scale_with_the_image_and_video_mode_tracks(astronaut):
    big = cv2.resize(astronaut, (512, 512), interpolation=cv2.INTER_CUBIC)
    with FaceLandmarker(video=True, max_faces=1) as fl:
        small = fl.detect(astronaut)[0]
        tracked = [fl.detect(big)[0] for _ in range(3)]
    for face in tracked:
        assert face.image_size == (512, 512)
        assert np.abs(face.points / 2 - small.points).mean() < 1.5  # same face, twice the pixels


def test_bad_input_and_closed_landmarker_say_what_was_expected(astronaut):
    fl = FaceLandmarker()
    with pytest.raises(ValueError, match=r"uint8 \[H, W, 3\] RGB"):
        fl.detect(astronaut.astype(np.float32))
    with pytest.raises(ValueError, match=r"uint8 \[H, W, 3\] RGB"):
        fl.detect(astronaut[..., 0])
    fl.close()
    with pytest.raises(RuntimeError, match="closed"):
        fl.detect(astronaut)
    with pytest.raises(ValueError, match=r"\[478, 2\]"):
        FaceLandmarks(np.zeros((468, 2)), (10, 10))
