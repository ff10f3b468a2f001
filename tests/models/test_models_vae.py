"""The video VAE: 16× compression, causality, streaming decode, save/load, training, the VAEDecode stage."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from framegraph.models.synth import FaceParams, PortraitRenderer, astronaut_portrait
from framegraph.models.vae import (
    CausalTemporalConv,
    TorchVAE,
    VAEDecode,
    VideoVAE,
    box_mask,
    crop_frames,
    face_clips_from_frames,
    face_crop_box,
    frames_to_uint8,
    load_face_clips,
    mouth_box_for_frame,
    redrawable,
    ssim,
    train_vae,
    with_reference_warp,
)
from framegraph.stream import Clock, EndOfStream, Graph, PortSpec, RecordingSink, Stage
from framegraph.stream.quality import psnr

# 4 (patch) · 2 · 2 = 16× like the default model, small enough to train in seconds on one core
TINY = dict(block_out_channels=(16, 32, 32), patch_size=4, latent_channels=4, norm_groups=4, temporal_from_level=0)


def tiny_vae(seed: int = 0, **kw) -> VideoVAE:
    """A tiny VAE whose temporal branches are switched on (random weights), so time mixing is tested."""
    torch.manual_seed(seed)
    model = VideoVAE(**{**TINY, **kw}).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, CausalTemporalConv):
                m.proj.weight.normal_(0.0, 0.1)
    return model


@pytest.fixture(scope="module")
def face_regions():
    """Synthetic talking frames of the shipped portrait (jaw opening, blinks), cut to a 32² face region,
    with the mouth box of each frame in region px."""
    portrait = astronaut_portrait()
    renderer = PortraitRenderer(portrait)
    crop = face_crop_box((portrait.height, portrait.width), portrait.face_box, portrait.mouth_box)
    jaw = [0.5 + 0.5 * np.sin(0.9 * i) for i in range(10)]
    frames = torch.stack([renderer.render(FaceParams(jaw_open=float(j), blink=float(i % 5 == 0)))
                          for i, j in enumerate(jaw)])
    pmeta = {"mouth_box": list(portrait.mouth_box)}
    s = 32 / crop[2]
    boxes = torch.tensor([[(b[0] - crop[0]) * s, (b[1] - crop[1]) * s, b[2] * s, b[3] * s]
                          for b in (mouth_box_for_frame(pmeta, {"jaw_open": j}) for j in jaw)], dtype=torch.float32)
    return crop_frames(frames, crop, 32), boxes


# ---- shapes ------------------------------------------------------------------------------------
def test_default_model_compresses_16x_in_space_and_keeps_every_frame():
    torch.manual_seed(0)
    vae = VideoVAE().eval()
    assert vae.spatial_compression == 16 and vae.latent_channels == 8
    x = torch.rand(1, 3, 2, 128, 128) * 2 - 1
    with torch.no_grad():
        z, _ = vae.encode(x)
        y, _ = vae.decode(z)
    assert z.shape == (1, 8, 2, 8, 8)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert vae.latent_shape(4, 256, 256) == (8, 4, 16, 16)
    assert vae.latent_shape(1, 128, 128) == (8, 1, 8, 8)


def test_bad_shapes_and_configs_say_what_is_wrong():
    vae = tiny_vae()
    with pytest.raises(ValueError, match="multiple of the spatial compression 16"):
        vae.encode(torch.zeros(1, 3, 1, 40, 32))
    with pytest.raises(ValueError, match=r"\[B, 3, T, H, W\]"):
        vae.encode(torch.zeros(1, 3, 32, 32))
    with pytest.raises(ValueError, match=r"\[B, 4, T, H, W\]"):
        vae.decode(torch.zeros(1, 8, 1, 2, 2))
    with pytest.raises(ValueError, match="latent_mean has 3 values"):
        VideoVAE(**TINY, latent_mean=[0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="norm_groups"):
        VideoVAE(block_out_channels=(12, 24), norm_groups=8)
    _, cache = vae.decode(torch.zeros(2, 4, 1, 2, 2))
    with pytest.raises(ValueError, match="another batch or size"):
        vae.decode(torch.zeros(1, 4, 1, 2, 2), cache)


# ---- time ---------------------------------------------------------------------------------------
def test_changing_a_frame_changes_only_that_frame_and_later_ones():
    vae = tiny_vae()
    x = torch.rand(1, 3, 6, 32, 32) * 2 - 1
    x2 = x.clone()
    x2[:, :, 3] = -x2[:, :, 3]
    with torch.no_grad():
        z, _ = vae.encode(x)
        z2, _ = vae.encode(x2)
        y, _ = vae.decode(z)
        y2, _ = vae.decode(z2)
        zb = z.clone()
        zb[:, :, 3] += 1.0
        yb, _ = vae.decode(zb)
    assert torch.equal(z[:, :, :3], z2[:, :, :3])  # encoder: the past does not see the future
    assert torch.equal(y[:, :, :3], y2[:, :, :3])
    assert torch.equal(y[:, :, :3], yb[:, :, :3])  # decoder alone too
    for later in (3, 4, 5):  # ... and the change does reach the frame and the ones after it
        assert (y[:, :, later] - yb[:, :, later]).abs().max() > 1e-3
        assert (z[:, :, later] - z2[:, :, later]).abs().max() > 1e-3


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_streaming_chunk_by_chunk_equals_decoding_the_whole_video(dtype, tol):
    vae = tiny_vae().double() if dtype == torch.float64 else tiny_vae()
    x = (torch.rand(2, 3, 9, 32, 32) * 2 - 1).to(dtype)
    with torch.no_grad():
        z_full, _ = vae.encode(x)
        y_full, _ = vae.decode(z_full)
        enc = dec = None
        zs, ys = [], []
        start = 0
        for n in (1, 3, 2, 1, 2):  # chunks of 1-3 frames
            z, enc = vae.encode(x[:, :, start:start + n], enc)
            y, dec = vae.decode(z_full[:, :, start:start + n], dec)
            zs.append(z)
            ys.append(y)
            start += n
    assert start == 9
    assert (torch.cat(zs, 2) - z_full).abs().max() <= tol
    assert (torch.cat(ys, 2) - y_full).abs().max() <= tol
    assert all(v.shape[1] == 2 for v in dec.values())  # the cache: the last temporal_kernel - 1 frames


def test_save_and_load_round_trip_keeps_weights_and_latent_scale(tmp_path):
    vae = tiny_vae()
    vae.set_latent_stats([0.5, -0.25, 0.0, 1.0], [2.0, 0.5, 1.0, 4.0])
    vae.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["latent_std"] == [2.0, 0.5, 1.0, 4.0] and cfg["_class_name"] == "VideoVAE"
    back = VideoVAE.from_pretrained(tmp_path).eval()
    x = torch.rand(1, 3, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        z, _ = vae.encode(x)
        z_back, _ = back.encode(x)
        raw, _, _ = vae.encode_moments(x)
        assert torch.equal(z, z_back)
        assert torch.allclose(z, (raw - torch.tensor([0.5, -0.25, 0.0, 1.0]).view(1, 4, 1, 1, 1))
                              / torch.tensor([2.0, 0.5, 1.0, 4.0]).view(1, 4, 1, 1, 1))
        assert torch.equal(vae.decode(z)[0], back.decode(z)[0])


# ---- losses and data ----------------------------------------------------------------------------
def test_ssim_psnr_and_box_mask_basics():
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    assert float(ssim(x, x)) == pytest.approx(1.0, abs=1e-6)
    assert float(ssim(x, torch.rand(2, 3, 16, 16) * 2 - 1)) < 0.2  # unrelated images
    assert psnr(x, x, 2.0, lo=-1.0) == float("inf")
    assert psnr(x + 0.1, x, 2.0, lo=-1.0) == pytest.approx(10 * np.log10(4 / 0.01), abs=0.2)
    m = box_mask(torch.tensor([[4.0, 2.0, 6.0, 3.0]]), 10, 12)[0, 0]
    assert m.shape == (10, 12) and float(m.sum()) == pytest.approx(18.0)
    assert m[3, 6] == 1 and m[0, 0] == 0


def test_face_crop_box_and_mouth_boxes_follow_the_ground_truth():
    portrait = astronaut_portrait()
    x, y, w, h = face_crop_box((256, 256), portrait.face_box, portrait.mouth_box)
    assert w == h == 128 and 0 <= x and x + w <= 256 and 0 <= y and y + h <= 256
    mx, my, mw, mh = portrait.mouth_box
    assert x < mx and mx + mw < x + w and y < my and my + mh + 0.32 * mw < y + h  # mouth, open jaw inside
    meta = {"mouth_box": list(portrait.mouth_box)}
    rest = mouth_box_for_frame(meta, {"jaw_open": 0.0, "head": {"dx": 0.0, "dy": 0.0}})
    moved = mouth_box_for_frame(meta, {"jaw_open": 1.0, "head": {"dx": 2.0, "dy": -1.0}})
    assert moved[0] == rest[0] + 2 and moved[1] == rest[1] - 1 and moved[3] > rest[3] + 10
    with pytest.raises(ValueError, match="too small"):
        face_crop_box((20, 20), (2, 2, 10, 10))


def test_load_face_clips_reads_mp4_and_json(tmp_path):
    from framegraph.stream.media import MP4Sink

    portrait = astronaut_portrait()
    renderer = PortraitRenderer(portrait)
    faces = [FaceParams(jaw_open=j) for j in (0.0, 0.5, 1.0, 0.5)]

    class Faces(Stage):
        def __init__(self):
            super().__init__("faces")
            self.outputs = {"video": PortSpec((256, 256, 3), torch.uint8)}
            self.i = 0

        def process(self, inputs, out):
            if self.i == len(faces):
                raise EndOfStream
            f = out.write("video")
            f.data.copy_(renderer.render(faces[self.i]))
            f.pts = self.ctx.clock.ticks_from_frame(self.i, 25)
            self.i += 1

    g = Graph(Clock("fast"))
    src, sink = g.add(Faces()), g.add(MP4Sink(tmp_path / "clip_00000.mp4", width=256, height=256, fps=25,
                                              audio_rate=None))
    g.connect(src, sink)
    g.run()
    (tmp_path / "clip_00000.json").write_text(json.dumps({
        "portrait": portrait.to_json(),
        "frames": [{"index": i, "jaw_open": f.jaw_open, "head": {"dx": 0.0, "dy": 0.0}} for i, f in enumerate(faces)]}))
    assert not redrawable(tmp_path)  # no lip / teeth / blink parameters: cannot be redrawn
    clips = load_face_clips(tmp_path, size=64)
    assert clips.crop_box == face_crop_box((256, 256), portrait.face_box, portrait.mouth_box)
    assert len(clips.frames) == 1 and clips.frames[0].shape == (4, 64, 64, 3)
    assert clips.mouth_boxes[0].shape == (4, 4)
    assert clips.mouth_boxes[0][2, 3] > clips.mouth_boxes[0][0, 3]  # the open jaw grows the box
    with pytest.raises(FileNotFoundError, match="avatar synth"):
        load_face_clips(tmp_path / "nothing")
    # with every parameter in the JSON the frames are redrawn without the codec as the targets
    (tmp_path / "clip_00000.json").write_text(json.dumps({
        "portrait": portrait.to_json(),
        "frames": [{"index": i, **{k: v for k, v in f.to_json().items() if not k.startswith("head_")},
                    "head": {"dx": 0.0, "dy": 0.0, "roll_deg": 0.0, "scale": 1.0}} for i, f in enumerate(faces)]}))
    assert redrawable(tmp_path)
    clips = load_face_clips(tmp_path, size=64, redraw_targets=True)
    clean = crop_frames(torch.stack([renderer.render(f) for f in faces]), clips.crop_box, 64)
    assert torch.equal(clips.targets[0], clean) and not torch.equal(clips.frames[0], clean)
    assert psnr(clips.frames[0], clean, 255.0) > 30
    train, held = clips.split(0.25)
    assert torch.equal(torch.cat([train.target(0), held.target(0)]), clean)


# ---- training -----------------------------------------------------------------------------------
def test_a_short_training_run_raises_heldout_psnr_and_resumes(face_regions, tmp_path):
    frames, boxes = face_regions
    data = face_clips_from_frames(frames, boxes)
    res = train_vae(data, tmp_path, steps=30, batch=4, clip_frames=2, lr=3e-3, warmup=5, seed=0,
                    model_config=TINY,
                    eval_every=1000, progress=False, holdout_fraction=0.2)
    rep = res.report
    assert rep["heldout_final"]["psnr_db"] > rep["heldout_initial"]["psnr_db"] + 4.0
    assert np.mean([h["loss"] for h in res.history[-5:]]) < 0.7 * np.mean([h["loss"] for h in res.history[:3]])
    saved = json.loads((tmp_path / "train_report.json").read_text())
    assert saved["steps"] == 30 and (tmp_path / "config.json").exists()
    # the latent the denoiser sees has ~unit variance per channel on the training frames
    model = VideoVAE.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        z, _ = model.encode(frames[:8].permute(3, 0, 1, 2)[None].float() / 127.5 - 1)
    std = z.transpose(0, 1).reshape(z.shape[1], -1).std(dim=1)
    assert torch.all((std > 0.7) & (std < 1.3)), std
    # resume from the checkpoint: continues at step 30 up to 33
    more = train_vae(data, tmp_path, steps=33, batch=4, clip_frames=2, progress=False, eval_every=1000,
                     holdout_fraction=0.2)
    assert more.report["steps"] == 33 and [h["step"] for h in more.history[-3:]] == [31, 32, 33]
    assert len(more.history) == 33


# ---- the stage ------------------------------------------------------------------------------------
class LatentChunks(Stage):
    """Source: ``latents [C, T_total, h, w]`` in chunks of ``chunk`` frames, pts of each chunk's first frame."""

    def __init__(self, latents: torch.Tensor, chunk: int, fps: float):
        super().__init__("latents")
        self.latents, self.chunk, self.fps = latents, chunk, fps
        c, _, h, w = latents.shape
        self.outputs = {"latent": PortSpec((c, chunk, h, w), torch.float32)}
        self.i = 0

    def process(self, inputs, out):
        start = self.i * self.chunk
        if start >= self.latents.shape[1]:
            raise EndOfStream
        f = out.write("latent")
        f.data.copy_(self.latents[:, start:start + self.chunk])
        f.pts = self.ctx.clock.ticks_from_frame(start, self.fps)
        self.i += 1


def test_vae_decode_stage_streams_frames_with_pts_in_a_graph():
    vae = tiny_vae()
    torch.manual_seed(1)
    latents = torch.randn(4, 12, 2, 2)  # 6 chunks of 2 latent frames
    with torch.no_grad():
        expected = frames_to_uint8(vae.decode(latents[None])[0][0].transpose(0, 1))  # [12, 32, 32, 3]
    g = Graph(Clock("fast"))
    src = g.add(LatentChunks(latents, chunk=2, fps=25))
    dec = g.add(VAEDecode(vae, size=32, chunk_frames=2, fps=25))
    sink = g.add(RecordingSink({"face": PortSpec((32, 32, 3), torch.uint8)}))
    g.connect(src, dec)
    g.connect(dec, sink, capacity=4)
    g.run(timeout=60)
    assert len(sink.records) == 12 and dec.frames_out == 12
    assert sink.pts() == [1920 * k for k in range(12)]  # 25 fps at 48 kHz ticks
    got = torch.stack(sink.data())
    assert (got.int() - expected.int()).abs().max() <= 1  # same as decoding the whole video (±1 rounding)
    assert dec.engine.cache is not None
    dec.reset()
    assert dec.engine.cache is None


def test_vae_decode_stage_checks_its_arguments():
    vae = tiny_vae()
    with pytest.raises(ValueError, match="chunk_frames=5"):
        VAEDecode(vae, size=32, chunk_frames=5)
    with pytest.raises(ValueError, match="multiple of the spatial compression"):
        VAEDecode(vae, size=40)
    stage = VAEDecode(vae, size=(32, 64), chunk_frames=3)
    assert stage.inputs["latent"].shape == (4, 3, 2, 4) and stage.outputs["face"].shape == (32, 64, 3)


# ---- the identity reference (reference_skip) ------------------------------------------------------
def ref_vae(seed: int = 0) -> VideoVAE:
    """A tiny reference_skip VAE with its (zero-initialised) fusion convs randomised, so the reference
    path really changes the output in these tests."""
    vae = tiny_vae(seed, reference_skip=True)
    with torch.no_grad():
        for conv in vae.decoder.fuse:
            conv.weight.normal_(0.0, 0.05)
    return vae


def warp_vae(seed: int = 0) -> VideoVAE:
    """``ref_vae`` with the reference-warp head added and switched on with random weights."""
    vae = with_reference_warp(ref_vae(seed)).eval()
    with torch.no_grad():
        vae.decoder.blend_head.weight.normal_(0.0, 0.05)
        vae.decoder.blend_head.bias.fill_(0.5)
    return vae


@pytest.mark.parametrize("make", [ref_vae, warp_vae], ids=["reference", "reference+warp"])
def test_a_new_stream_starts_from_the_reference_features_an_earlier_one_computed(make):
    """Every session of a bundle decodes with the same reference: a stream's first chunk (a new session, a barge-in)
    takes its features from the stream before (the warm-up's) instead of computing them again, and decodes the same
    picture; another reference, or another model, computes its own."""
    vae = make()
    ref = torch.rand(1, 3, 32, 32) * 2 - 1
    z = torch.randn(1, 4, 2, 2, 2)
    calls = []
    vae.reference_features = lambda r, f=vae.reference_features: calls.append(1) or f(r)
    with torch.inference_mode():
        first = TorchVAE(vae, ref)
        a = first.decode(z)
        first.reset()  # a barge-in: a new stream of the same session
        b = first.decode(z)
        c = TorchVAE(vae, ref.clone()).decode(z)  # a new session's stage: an equal reference
        assert len(calls) == 1 and torch.equal(a, b) and torch.equal(a, c)
        other = TorchVAE(vae, -ref).decode(z)
        assert len(calls) == 2 and (other - a).abs().max() > 1e-3
        assert torch.equal(TorchVAE(vae, ref).decode(z), a) and len(calls) == 3  # the last reference is the one kept
    with torch.no_grad():
        vae.decoder.fuse[0].weight.mul_(1.5)  # a training step changes the weights: the features are computed again
    with torch.inference_mode():
        TorchVAE(vae, ref).decode(z)
        assert len(calls) == 4


@pytest.mark.parametrize("make", [ref_vae, warp_vae], ids=["reference", "reference+warp"])
def test_reference_decoder_streams_like_the_whole_video_and_keeps_its_features_in_the_cache(make):
    vae = make()  # the reference read by the decoder; with the warp it also copies its pixels
    x = torch.rand(2, 3, 6, 32, 32) * 2 - 1
    ref = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        z, _ = vae.encode(x)
        full, _ = vae.decode(z, reference=ref)
        a, cache = vae.decode(z[:, :, :2], reference=ref)
        b, cache = vae.decode(z[:, :, 2:5], cache)  # no reference: its features come from the cache
        c, _ = vae.decode(z[:, :, 5:], cache)
        other, _ = vae.decode(z, reference=-ref)
    assert (torch.cat([a, b, c], 2) - full).abs().max() <= 1e-5
    assert (other - full).abs().max() > 1e-3  # the decoder does read the reference
    assert any(k.startswith("reference.") for k in cache)
    assert ("reference.pixels" in cache) == (make is warp_vae)


def test_reference_decoder_says_what_is_missing(tmp_path):
    vae = ref_vae()
    z = torch.zeros(1, 4, 1, 2, 2)
    with pytest.raises(ValueError, match="identity reference"):
        vae.decode(z)
    with pytest.raises(ValueError, match="reference"):
        vae.decode(z, reference=torch.zeros(1, 3, 64, 64))  # another size than the latent's
    with pytest.raises(ValueError, match="without reference_skip"):
        tiny_vae().reference_features(torch.zeros(1, 3, 32, 32))
    with pytest.raises(ValueError, match="identity reference"):
        VAEDecode(vae, size=32)
    with pytest.raises(ValueError, match="reference_image"):
        train_vae(face_clips_from_frames(torch.zeros(4, 32, 32, 3, dtype=torch.uint8)), tmp_path / "out", steps=1,
                  model_config={**TINY, "reference_skip": True}, progress=False)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_reference_training_beats_the_plain_vae_on_the_same_budget(face_regions, tmp_path):
    """Same data, steps and seed: the decoder that reads the portrait reconstructs the held-out frames better
    (fine identity detail does not have to pass through the 16× latent)."""
    frames, boxes = face_regions
    data = face_clips_from_frames(frames, boxes)
    reference = frames[0]  # jaw half open; any frame of the person works as the identity
    kw = dict(steps=40, batch=4, clip_frames=2, lr=3e-3, warmup=5, seed=0, eval_every=1000, progress=False,
              holdout_fraction=0.2)
    plain = train_vae(data, tmp_path / "plain", model_config=TINY, **kw).report["heldout_final"]["psnr_db"]
    res = train_vae(data, tmp_path / "ref", model_config={**TINY, "reference_skip": True},
                    reference_image=reference, **kw)
    assert res.report["heldout_final"]["psnr_db"] > plain + 0.5, (res.report["heldout_final"], plain)
    # saved with the flag, and the stage decodes with the portrait region
    model = VideoVAE.from_pretrained(tmp_path / "ref").eval()
    assert model.uses_reference
    stage = VAEDecode(model, size=32, reference=reference)
    assert stage.reference.shape == (1, 3, 32, 32)


# ---- the reference warp (reference_warp) -----------------------------------------------------------
def test_reference_warp_starts_off_and_then_copies_the_reference_in_the_drawn_pose():
    import torch.nn.functional as F

    from framegraph.models.vae.register import register_affine

    source = ref_vae()
    vae = with_reference_warp(source).eval()
    assert vae.config.reference_warp and not source.config.reference_warp
    z = torch.randn(1, 4, 3, 2, 2)
    ref = torch.rand(1, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        before, _ = source.decode(z, reference=ref)
        after, cache = vae.decode(z, reference=ref)
        assert (after - before).abs().max() <= 1e-6  # the blend starts at 0: the same decoder
        assert "reference.pixels" in cache
        vae.decoder.blend_head.bias.fill_(1.0)  # blend weight 1: the reference, moved to the drawn frame's pose
        copied, _ = vae.decode(z, reference=ref)
        drawn = before[0].transpose(0, 1)  # [T, 3, H, W]
        theta = register_affine(ref, drawn)
        moved = F.grid_sample(ref.expand(3, -1, -1, -1), F.affine_grid(theta, list(drawn.shape), align_corners=False),
                              padding_mode="border", align_corners=False)
    assert (copied[0].transpose(0, 1) - moved).abs().max() <= 1e-5


@pytest.mark.parametrize("blur", [0, 2], ids=["sharp", "drawn soft"])
def test_affine_registration_finds_the_head_pose(blur):
    """The pose of a moved portrait is found to a small fraction of a pixel, also when the frame is softer
    than the portrait (as a decoder draws it) and its mouth opened (which must not pull the pose)."""
    import math

    import torch.nn.functional as F

    from framegraph.models.vae.register import affine_sample, register_affine

    portrait = astronaut_portrait()
    crop = face_crop_box((portrait.height, portrait.width), portrait.face_box, portrait.mouth_box)
    ref = crop_frames(torch.from_numpy(np.array(portrait.image))[None], crop, 128)
    ref = ref.permute(0, 3, 1, 2).float() / 127.5 - 1  # [1, 3, 128, 128]
    a, dx, dy = math.radians(0.8), 0.015, -0.01  # roll 0.8°, shift ~1 px and ~0.6 px
    truth = torch.tensor([[[math.cos(a), -math.sin(a), dx], [math.sin(a), math.cos(a), dy]]])
    frame = F.grid_sample(ref, F.affine_grid(truth, [1, 3, 128, 128], align_corners=False), padding_mode="border",
                          align_corners=False)
    assert (affine_sample(ref, truth) - frame).abs().max() < 1e-5  # the broadcast grid is affine_grid's
    if blur:
        frame = F.avg_pool2d(frame, 2 * blur + 1, 1, blur, count_include_pad=False)
    frame[..., 80:100, 45:85] = -1.0  # a wide-open dark mouth
    theta = register_affine(ref, torch.cat([frame, ref]))
    assert (theta[0] - truth[0]).abs().max() * 64 < 0.1  # px (normalised units × half the side)
    assert (theta[1] - torch.eye(2, 3)).abs().max() * 64 < 0.02  # the portrait itself: no motion


def test_reference_warp_says_what_is_wrong():
    with pytest.raises(ValueError, match="needs reference_skip"):
        VideoVAE(**TINY, reference_warp=True)
    with pytest.raises(ValueError, match="without reference_skip"):
        with_reference_warp(tiny_vae())
    with pytest.raises(ValueError, match="already"):
        with_reference_warp(warp_vae())
    vae, z = warp_vae(), torch.zeros(1, 4, 1, 2, 2)
    with torch.no_grad():
        _, cache = vae.decode(z, reference=torch.zeros(1, 3, 32, 32))
        del cache["reference.pixels"]  # a cache from before the warp head holds only the features
        with pytest.raises(ValueError, match="identity reference"):
            vae.decode(z, cache)


def test_decoder_only_training_keeps_the_latent_space_and_learns_the_warp(face_regions, tmp_path):
    """A trained reference VAE given the warp head and trained with ``train_encoder=False``: the encoder and
    the latent statistics do not move (a denoiser trained on them stays valid), the warp switches on, and
    the held-out reconstruction improves."""
    frames, boxes = face_regions
    data = face_clips_from_frames(frames, boxes)
    kw = dict(batch=4, clip_frames=2, warmup=5, seed=0, eval_every=1000, progress=False, holdout_fraction=0.2)
    base = train_vae(data, tmp_path / "base", steps=30, lr=3e-3, model_config={**TINY, "reference_skip": True},
                     reference_image=frames[0], **kw).model
    with pytest.raises(ValueError, match="latent_mean"):
        train_vae(data, tmp_path / "fresh", steps=1, model_config={**TINY, "reference_skip": True},
                  reference_image=frames[0], train_encoder=False, **kw)
    x = frames[:6].permute(3, 0, 1, 2)[None].float() / 127.5 - 1
    with torch.no_grad():
        z_before, _ = base.encode(x)
    encoder_before = {k: v.clone() for k, v in base.encoder.state_dict().items()}
    with pytest.raises(ValueError, match="latent_noise"):
        train_vae(data, tmp_path / "x", steps=1, model=base, reference_image=frames[0], latent_noise=-0.1, **kw)
    res = train_vae(data, tmp_path / "warp", steps=30, lr=3e-3, model=with_reference_warp(base),
                    reference_image=frames[0], train_encoder=False, latent_noise=0.3, **kw)
    model = VideoVAE.from_pretrained(tmp_path / "warp").eval()
    assert model.config.reference_warp and res.report["train_encoder"] is False and res.report["latent_noise"] == 0.3
    assert model.config.latent_mean == base.config.latent_mean and model.config.latent_std == base.config.latent_std
    for k, v in model.encoder.state_dict().items():
        assert torch.equal(v, encoder_before[k]), k
    with torch.no_grad():
        z_after, _ = model.encode(x)
    assert torch.equal(z_after, z_before)
    assert float(model.decoder.blend_head.weight.detach().abs().max()) > 0.0  # the blend learned
    rep = res.report
    assert rep["heldout_final"]["psnr_db"] > rep["heldout_initial"]["psnr_db"] + 0.3, rep


def test_latent_noise_perturbs_the_decoded_latent_by_the_given_std():
    vae = ref_vae()
    vae.set_latent_stats([0.0] * 4, [2.0] * 4)  # noise is in normalised units: raw std 2 per unit
    x = torch.rand(2, 3, 2, 32, 32) * 2 - 1
    ref = torch.rand(2, 3, 32, 32) * 2 - 1
    seen, decode_raw = [], vae.decode_raw

    def spy(z, cache=None, **kw):  # the latent the decoder is given
        seen.append(z)
        return decode_raw(z, cache, **kw)

    vae.decode_raw = spy
    with torch.no_grad():
        clean, mean, _ = vae(x, sample=False, reference=ref)
        same, _, _ = vae(x, sample=False, reference=ref, latent_noise=torch.zeros(2))
        vae(x, sample=False, reference=ref, latent_noise=torch.tensor([0.0, 0.5]),
            generator=torch.Generator().manual_seed(0))
    assert torch.equal(clean, same)
    d = seen[-1] - mean
    assert d[0].abs().max() == 0  # std 0: that sample is untouched
    assert abs(float(d[1].std()) - 0.5 * 2.0) < 0.15  # std 0.5 normalised = 1.0 raw
