"""The person matte (models/matte.py): MediaPipe's selfie segmentation from the installed wheel, smoothed over time,
refined on the picture, the face filled — what makes a talking avatar see-through around the person."""
import numpy as np
import torch
import torch.nn.functional as F

from framegraph.models.matte import _box_mean, guided_filter, person_matte, person_mattes, smooth_over_time


def test_the_astronauts_matte_is_the_person_not_the_background():
    from framegraph.models.synth import astronaut_portrait

    p = astronaut_portrait()
    matte = person_matte(p.image)
    assert matte.dtype == torch.uint8 and matte.shape == p.image.shape[:2]
    assert int(matte[:20, :20].max()) == 0 and int(matte[:20, -20:].max()) == 0  # the sky-grey corners behind her
    x, y, w, h = p.face_box
    assert int(matte[y + h // 4:y + 3 * h // 4, x + w // 4:x + 3 * w // 4].min()) == 255  # the face
    assert 0.3 < float((matte > 127).float().mean()) < 0.8


def test_a_moving_person_is_followed_frame_by_frame():
    from framegraph.models.synth import astronaut_portrait

    image = np.array(astronaut_portrait().image)
    frames = np.stack([np.roll(image, 2 * k, axis=1) for k in range(9)])  # the head moving 2 px a frame
    mattes = person_mattes(frames)
    col = [int(torch.nonzero(m[60] > 127)[0]) for m in mattes]  # the left edge of the hair on one row
    assert all(a <= b for a, b in zip(col, col[1:])) and abs((col[6] - col[2]) - 8) <= 2, col


def test_guided_filter_keeps_a_step_edge_that_the_guide_has():
    guide = torch.zeros(40, 40)
    guide[:, 20:] = 1.0
    coarse = torch.zeros(40, 40)
    coarse[:, 17:] = 1.0  # the model's edge, three pixels off the picture's
    refined = guided_filter(coarse, guide, radius=6, eps=1e-3)
    assert float(refined[:, 20:].min()) > 0.95  # solid up to the picture's edge...
    assert float((refined[:, 20] - refined[:, 19]).min()) > 0.4  # ...where it steps down...
    assert float(refined[:, :8].max()) < 0.05  # ...to nothing away from it


def test_smoothing_over_time_damps_flicker_and_keeps_a_steady_matte():
    steady = torch.rand(1, 8, 8).expand(10, 8, 8)
    assert torch.allclose(smooth_over_time(steady), steady, atol=1e-6)
    flicker = steady + 0.1 * (torch.arange(10) % 2 * 2 - 1).float()[:, None, None]
    assert float((smooth_over_time(flicker) - steady).abs().max()) < 0.05


def test_the_box_mean_is_the_plain_window_mean():
    """The guided filter's box mean (a row pass after a column pass) equals the mean over the whole window, edges
    replicated, computed the plain way."""
    x = torch.rand(3, 37, 53, generator=torch.Generator().manual_seed(0))
    for r in (1, 4, 14):
        padded = F.pad(x[:, None], (r, r, r, r), mode="replicate")
        plain = torch.stack([padded[:, 0, i:i + 2 * r + 1, j:j + 2 * r + 1].mean((-2, -1))
                             for i in range(37) for j in range(53)], -1).reshape(3, 37, 53)
        assert torch.allclose(_box_mean(x, r), plain, atol=1e-5)
