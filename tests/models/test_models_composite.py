"""Composite: the generated region pasted into the full frame through a feathered mask, without a seam."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from framegraph.models.composite import Composite, composite, feather_mask, load_background
from framegraph.stream import Clock, EndOfStream, Graph, PortSpec, RecordingSink, Stage

BOX = (64, 40, 128, 128)  # x, y, w, h in a 256 x 256 frame
FEATHER = 16


@pytest.mark.parametrize("shape", ["ellipse", "rounded"])
def test_feather_mask_is_one_inside_zero_at_the_border_and_monotone(shape):
    m = feather_mask(128, 96, FEATHER, shape)
    assert m.shape == (128, 96) and m.dtype == torch.float32
    assert float(m.min()) == 0.0 and float(m.max()) == 1.0
    assert m[64, 48] == 1.0 and m[64, 48 - 20] == 1.0
    assert torch.all(m[0] == 0) and torch.all(m[-1] == 0) and torch.all(m[:, 0] == 0) and torch.all(m[:, -1] == 0)
    row = m[64, 48:]  # centre → right edge: never rises
    assert torch.all(row[1:] <= row[:-1])
    col = m[64:, 48]
    assert torch.all(col[1:] <= col[:-1])
    assert torch.equal(m, m.flip(0)) and torch.equal(m, m.flip(1))  # symmetric


def test_composite_keeps_region_inside_background_outside_and_blends_without_a_seam():
    bg = torch.zeros(256, 256, 3, dtype=torch.uint8)
    region = torch.full((128, 128, 3), 255, dtype=torch.uint8)
    x, y, w, h = BOX
    mask = feather_mask(h, w, FEATHER)
    out = composite(bg, region, BOX, mask)
    assert torch.equal(out[y + 44:y + 84, x + 44:x + 84], region[44:84, 44:84])  # the box centre is the region
    outside = torch.ones(256, 256, dtype=torch.bool)
    outside[y:y + h, x:x + w] = False
    assert torch.all(out[outside] == 0)  # everything outside the box is the background
    assert torch.all(out[y, x:x + w] == 0) and torch.all(out[y + h - 1, x:x + w] == 0)  # the box's own border too
    row = out[y + h // 2, x + w // 2:, 0].int()  # across the feather, centre → outside: monotone
    assert torch.all(row[1:] <= row[:-1]) and row[0] == 255 and row[-1] == 0
    # no seam: between neighbours the step is at most the smoothstep's steepest slope (1.5 / feather)
    o = out.int()
    steepest = max((o[:, 1:] - o[:, :-1]).abs().max(), (o[1:] - o[:-1]).abs().max())
    assert steepest <= 255 * 1.5 / FEATHER + 2
    assert bg.sum() == 0  # the background is not modified


def test_composite_resizes_the_region_and_writes_into_out():
    bg = torch.randint(0, 256, (200, 300, 3), dtype=torch.uint8)
    region = torch.full((64, 64, 3), 77, dtype=torch.uint8)
    box = (100, 50, 96, 96)
    mask = feather_mask(96, 96, 8, "rounded")
    out = torch.empty_like(bg)
    got = composite(bg, region, box, mask, out=out)
    assert got is out
    assert torch.all(out[50 + 48, 100 + 48] == 77)
    assert torch.equal(out[:50], bg[:50])
    f = composite(bg.float() / 255, region.float() / 255, box, mask)  # float images work the same way
    assert f.dtype == torch.float32 and torch.allclose(f[98, 148], torch.full((3,), 77 / 255))


def test_bad_arguments_say_what_is_wrong():
    bg = torch.zeros(100, 120, 3, dtype=torch.uint8)
    region = torch.zeros(32, 32, 3, dtype=torch.uint8)
    mask = feather_mask(32, 32, 4)
    with pytest.raises(ValueError, match="outside the 120x100 frame"):
        composite(bg, region, (100, 10, 32, 32), mask)
    with pytest.raises(ValueError, match="outside"):
        composite(bg, region, (-1, 10, 32, 32), mask)
    with pytest.raises(ValueError, match=r"mask is \[32, 32\]; expected \[40, 32\]"):
        composite(bg, region, (10, 10, 32, 40), mask)
    with pytest.raises(ValueError, match=r"region must be \[h, w, 3\]"):
        composite(bg, torch.zeros(32, 32, dtype=torch.uint8), (10, 10, 32, 32), mask)
    with pytest.raises(ValueError, match="both be uint8 or both float"):
        composite(bg, region.float(), (10, 10, 32, 32), mask)
    with pytest.raises(ValueError, match="too wide"):
        feather_mask(32, 32, 20)
    with pytest.raises(ValueError, match="shape='star'"):
        feather_mask(32, 32, 4, "star")
    with pytest.raises(ValueError, match="outside the 120x100 frame"):
        Composite(bg, (0, 0, 128, 64))
    with pytest.raises(ValueError, match=r"uint8 \[H, W, 3\]"):
        load_background(np.zeros((10, 10), np.uint8))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Composite("/nonexistent/portrait.png", (0, 0, 8, 8))


class Faces(Stage):
    def __init__(self, n, size):
        super().__init__("faces")
        self.n = n
        self.outputs = {"face": PortSpec((size, size, 3), torch.uint8)}
        self.i = 0

    def process(self, inputs, out):
        if self.i == self.n:
            raise EndOfStream
        f = out.write("face")
        f.data.fill_(40 * self.i)
        f.pts = self.ctx.clock.ticks_from_frame(self.i, 25)
        self.i += 1


def test_composite_stage_in_a_graph_pastes_every_frame_into_the_portrait():
    from framegraph.models.synth.portrait import portraits_folder

    stage = Composite(portraits_folder() / "astronaut.png", BOX, region_size=64, feather_px=FEATHER)
    bg = stage.background
    assert bg.shape == (256, 256, 3) and stage.mask.shape == (128, 128)
    assert stage.inputs["face"].shape == (64, 64, 3) and stage.outputs["video"].shape == (256, 256, 3)
    g = Graph(Clock("fast"))
    src, comp, sink = (g.add(Faces(4, 64)), g.add(stage),
                       g.add(RecordingSink({"video": PortSpec((256, 256, 3), torch.uint8)})))
    g.connect(src, comp)
    g.connect(comp, sink)
    g.run(timeout=60)
    assert sink.pts() == [0, 1920, 3840, 5760]
    for i, frame in enumerate(sink.data()):
        expected = composite(bg, torch.full((64, 64, 3), 40 * i, dtype=torch.uint8), BOX, stage.mask)
        assert torch.equal(frame, expected)
        assert torch.all(frame[40 + 64, 64 + 64] == 40 * i)
        assert torch.equal(frame[:40], bg[:40])
