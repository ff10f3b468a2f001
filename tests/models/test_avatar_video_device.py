"""The video avatar's device path: the region cut and pasted through index tensors made from a box on the device
(no value read back, fixed shapes: what a GPU, a CUDA graph and a compiled graph need) equals its readable twin,
the slices at a box of Python ints; the mouth shape's speaking gate computed on the device equals the host one."""
import torch

from framegraph.models.avatar.video.bundle import random_video_avatar
from framegraph.models.avatar.video.jaw import kept_share
from framegraph.models.avatar.video.stages import MouthRegion, MouthShape


def test_picture_through_index_tensors_equals_the_sliced_picture():
    """With and without the texture map, with and without the jaw line's kept share."""
    avatar = random_video_avatar(n_frames=4, region_size=64)
    S = avatar.region_size
    texture = torch.rand(S, S, generator=torch.Generator().manual_seed(0))
    for tex, jaws in ((None, None), (texture, None), (texture, avatar.jaws)):
        stage = MouthRegion(avatar.generator, avatar.mask, avatar.paste, avatar.reference,
                            frame_size=(avatar.height, avatar.width), box_side=avatar.box_side, texture=tex,
                            kept_share=jaws is not None)
        assert stage.side != stage.size  # the resize to the model's size is on the path
        g = torch.Generator().manual_seed(1)
        for i, box in enumerate(avatar.boxes[:3]):
            frame = torch.randint(0, 256, (avatar.height, avatar.width, 3), dtype=torch.uint8, generator=g)
            shape = torch.randn(3, generator=g)
            ints = [int(round(float(v))) for v in box]
            kept = None if jaws is None else kept_share(jaws[i], ints)
            want = stage.picture(frame, ints, shape, kept)
            got = stage.picture_at(frame, torch.tensor(ints, dtype=torch.int32), shape, kept)
            assert torch.equal(got, want), (tex is not None, jaws is not None, i)
            if kept is not None:  # below the jaw line the frame is kept
                x, y, L, _ = ints
                assert (kept == 1).any() and torch.equal(got[y:y + L, x:x + L][kept == 1],
                                                         frame[y:y + L, x:x + L][kept == 1])


def test_speaking_gate_on_the_device_equals_the_host_gate():
    avatar = random_video_avatar(n_frames=4, region_size=64)
    host = MouthShape(avatar.shape_head, avatar.rest_shape)
    device = MouthShape(avatar.shape_head, avatar.rest_shape)
    g = torch.Generator().manual_seed(0)
    for speaking in [False, True, True, False, True, False, False]:
        feats = torch.randn(avatar.shape_head.config.feature_dim, generator=g)
        a = host.step(feats, speaking)
        b = device.step(feats, torch.tensor(speaking))
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_loop_draws_each_frames_kept_share_once_and_blends_it_in_a_cross_fade():
    import numpy as np

    from framegraph.models.avatar.video.loop import VideoLoop

    avatar = random_video_avatar(n_frames=6, region_size=64)
    loop = VideoLoop(avatar.frames, avatar.boxes, avatar.idle, jaws=avatar.jaws)
    first = loop.kept_share([(2, 1.0)])
    assert torch.equal(first, kept_share(avatar.jaws[2], np.round(avatar.boxes[2])))
    assert loop.kept_share([(2, 1.0)]) is first  # shown again: the share drawn before
    fade = loop.kept_share([(2, 0.25), (3, 0.75)])
    box = np.round(0.25 * np.asarray(avatar.boxes[2]) + 0.75 * np.asarray(avatar.boxes[3]))
    assert torch.equal(fade, kept_share(0.25 * avatar.jaws[2] + 0.75 * avatar.jaws[3], box))



def test_a_later_session_finds_the_kept_shares_an_earlier_one_drew():
    """The shares live with the bundle: drawing one takes ms at a real region (2.5-3.6 ms at 208-256 px), and each
    session used to draw every loop frame's again, the first time it showed it."""
    from framegraph.apps.bench.launches import Drain, _audio_source
    from framegraph.apps.bench.video_avatar_speed import at_region
    from framegraph.models.avatar import build_avatar_graph

    avatar = random_video_avatar(n_frames=6, region_size=64)

    def session(bundle):
        ag = build_avatar_graph(bundle, _audio_source(0.5), audio_sink=None)
        ag.graph.connect(ag.video, ag.graph.add(Drain(ag.video.outputs["video"])), "video", "video")
        ag.graph.run(timeout=60)

    session(avatar)
    drawn = dict(avatar.kept_shares)
    assert drawn
    session(avatar)
    assert all(avatar.kept_shares[i] is share for i, share in drawn.items())  # kept, not drawn again
    L = avatar.box_side
    session(at_region(avatar, L + 32))  # a copy with other boxes (it shares the dict): shares of its own box
    assert {tuple(s.shape) for s in avatar.kept_shares.values()} == {(L, L), (L + 32, L + 32)}
