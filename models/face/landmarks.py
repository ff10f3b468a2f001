"""One face's 478 MediaPipe face-mesh landmarks in pixels, and the geometry read from them.

Index tables follow MediaPipe's canonical face mesh. It has 468 points, plus 10 iris points with
``refine_landmarks=True``. "Left" and "right" below are the *image's* left and right. They are the subject's
right and left.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

N_POINTS = 478
# outer lip contour, clockwise in the image from the left mouth corner (61) over the upper lip
LIP_OUTER = (61, 185, 40, 39, 37, 0, 267, 269, 270, 409, 291, 375, 321, 405, 314, 17, 84, 181, 91, 146)
# inner lip contour (where the lips meet), from the left inner corner (78) over the upper lip
LIP_INNER = (78, 191, 80, 81, 82, 13, 312, 311, 310, 415, 308, 324, 318, 402, 317, 14, 87, 178, 88, 95)
MOUTH_CORNERS = (61, 291)
# (upper, lower) inner-lip pairs across the middle of the mouth: left third, centre, right third
LIP_GAP_PAIRS = ((81, 178), (13, 14), (311, 402))
# the face's outline, clockwise in the image from the top of the forehead (10)
FACE_OVAL = (10, 338, 297, 332, 284, 251, 389, 356, 454, 323, 361, 288, 397, 365, 379, 378, 400, 377, 152,
             148, 176, 149, 150, 136, 172, 58, 132, 93, 234, 127, 162, 21, 54, 103, 67, 109)
FOREHEAD, CHIN, SUBNASALE = 10, 152, 2
# the jaw line: the face outline from one jaw angle over the chin (152) to the other (a stretch of FACE_OVAL)
JAW_LINE = (172, 136, 150, 149, 176, 148, 152, 377, 400, 378, 379, 365, 397)
# six points per eye for the eye aspect ratio: outer/inner corners (p1, p4), two upper (p2, p3), two
# lower (p6, p5) — image-left eye, then image-right eye
EYES = ((33, 160, 158, 133, 153, 144), (362, 385, 387, 263, 373, 380))
EYE_BOXES = ((33, 246, 161, 160, 159, 158, 157, 173, 133, 155, 154, 153, 145, 144, 163, 7),
             (362, 398, 384, 385, 386, 387, 388, 466, 263, 249, 390, 373, 374, 380, 381, 382))
# how far the lower-face region reaches past the chin, as a fraction of the subnasale-to-chin distance
BELOW_CHIN = 0.15


def _box(points: np.ndarray, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """(x, y, w, h) px of the points' bounding box. It is in whole pixels, covering them, clipped to the image."""
    width, height = size
    x0, y0 = np.floor(points.min(axis=0)).astype(int)
    x1, y1 = np.ceil(points.max(axis=0)).astype(int) + 1
    x0, y0 = max(int(x0), 0), max(int(y0), 0)
    x1, y1 = min(int(x1), width), min(int(y1), height)
    return x0, y0, max(x1 - x0, 0), max(y1 - y0, 0)


@dataclass
class FaceLandmarks:
    """One face in one image.

    ``points``: float32 [478, 2] pixel (x, y) in the image given. They may lie a little outside it. That
    happens when the border cuts the face. ``image_size``: (width, height)."""
    points: np.ndarray
    image_size: tuple[int, int]

    def __post_init__(self):
        self.points = np.asarray(self.points, np.float32)
        if self.points.shape != (N_POINTS, 2):
            raise ValueError(f"face landmarks must be [{N_POINTS}, 2] pixel (x, y); got {self.points.shape}")
        self.image_size = (int(self.image_size[0]), int(self.image_size[1]))

    def face_box(self) -> tuple[int, int, int, int]:
        """(x, y, w, h) px of the whole face. It spans all landmarks: mid-forehead to chin, cheek to cheek."""
        return _box(self.points, self.image_size)

    def mouth_box(self) -> tuple[int, int, int, int]:
        """(x, y, w, h) px of the outer lip contour."""
        return _box(self.lip_outer(), self.image_size)

    def lip_outer(self) -> np.ndarray:
        """float32 [20, 2] px: the outer lip contour, a closed polygon. Its last point joins the first."""
        return self.points[list(LIP_OUTER)].copy()

    def lip_inner(self) -> np.ndarray:
        """float32 [20, 2] px: the inner lip contour, a closed polygon. It is the opening between the lips."""
        return self.points[list(LIP_INNER)].copy()

    def jaw_line(self) -> np.ndarray:
        """float32 [13, 2] px: the jaw line. There the face meets the neck or collar.

        It is an open polyline (:data:`JAW_LINE`). It runs from one jaw angle over the chin to the other."""
        return self.points[list(JAW_LINE)].copy()

    def mouth_corners(self) -> tuple[np.ndarray, np.ndarray]:
        """(left, right) float32 [2] px: the outer mouth corners, image-left first."""
        a, b = (self.points[i].copy() for i in MOUTH_CORNERS)
        return (a, b) if a[0] <= b[0] else (b, a)

    def mouth_width(self) -> float:
        """px between the outer mouth corners."""
        left, right = self.mouth_corners()
        return float(np.linalg.norm(right - left))

    def mouth_openness(self) -> float:
        """Mean gap between the inner lips / mouth width; unitless.

        The gap is measured at 3 places across the mouth. It is 0 when the lips touch. It is about 0.3-0.5 for a
        wide-open "a"."""
        gaps = [np.linalg.norm(self.points[lo] - self.points[up]) for up, lo in LIP_GAP_PAIRS]
        return float(np.mean(gaps) / max(self.mouth_width(), 1e-6))

    def eyes_openness(self) -> float:
        """Mean eye aspect ratio of both eyes: lid gap / eye width. About 0.25-0.35 open, < 0.15 shut."""
        ratios = []
        for p1, p2, p3, p4, p5, p6 in EYES:
            pt = self.points
            lid = np.linalg.norm(pt[p2] - pt[p6]) + np.linalg.norm(pt[p3] - pt[p5])
            ratios.append(lid / (2 * max(float(np.linalg.norm(pt[p4] - pt[p1])), 1e-6)))
        return float(np.mean(ratios))

    def eye_boxes(self) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
        """(x, y, w, h) px of each eye's lid contour, image-left eye first."""
        return tuple(_box(self.points[list(ring)], self.image_size) for ring in EYE_BOXES)

    def up_axis(self) -> np.ndarray:
        """float32 [2] unit vector from the chin towards the forehead. Image y grows downwards."""
        up = self.points[FOREHEAD] - self.points[CHIN]
        return (up / max(float(np.linalg.norm(up)), 1e-6)).astype(np.float32)

    def lower_face_polygon(self) -> np.ndarray:
        """float32 [K, 2] px: the face outline below the nose, cheek to cheek. It is a closed polygon.

        The cut runs through the subnasale, across the face's own axis. So a tilted head tilts it. The polygon
        reaches past the chin by ``BELOW_CHIN`` of the nose-to-chin distance. An opening jaw goes there. It is
        the region a lip-sync model regenerates. It is clipped to the image."""
        up = self.up_axis()
        nose = self.points[SUBNASALE]
        oval = self.points[list(FACE_OVAL)]
        height = (oval - nose) @ up               # > 0 above the cut
        kept = []
        for i in range(len(oval)):                # walk the outline, keep what is below the cut
            j = (i + 1) % len(oval)
            if height[i] <= 0:
                kept.append(oval[i])
            if (height[i] <= 0) != (height[j] <= 0):  # the outline crosses the cut: add the crossing
                t = height[i] / (height[i] - height[j])
                kept.append(oval[i] + t * (oval[j] - oval[i]))
        poly = np.stack(kept)
        below = np.minimum((poly - nose) @ up, 0)  # px below the cut, as a negative number
        poly = poly + BELOW_CHIN * below[:, None] * up  # the chin goes down by BELOW_CHIN x its depth
        width, height_px = self.image_size
        poly[:, 0] = poly[:, 0].clip(0, width - 1)
        poly[:, 1] = poly[:, 1].clip(0, height_px - 1)
        return poly.astype(np.float32)

    def size_px(self) -> int:
        """The face's width in px, cheek to cheek at the widest. The checks compare this size."""
        return self.face_box()[2]
