"""What a video avatar's shape head hears (models/avatar/video/features.py): each candidate's columns of the joined
features, and a head fitted on them folded back onto the raw columns giving the same shapes."""
import pytest
import torch

from framegraph.models.avatar.video.features import CHOICES, PCA_DIMS, candidates, fold_head
from framegraph.models.avatar.video.lipsync import context_windows, fit_shape_head


def _joined(T=300, d=12, w=40, seed=0):
    """Joined features whose Whisper side has structure (a few strong directions) and an offset."""
    g = torch.Generator().manual_seed(seed)
    enc = torch.randn(T, d, generator=g)
    latent = torch.randn(T, 6, generator=g)
    whisper = latent @ torch.randn(6, w, generator=g) * 3 + 0.3 * torch.randn(T, w, generator=g) + 5.0
    shapes = torch.stack([latent[:, 0] + 0.5 * enc[:, 0], enc[:, 1], latent[:, 1]], 1)
    return torch.cat([enc, whisper], 1), shapes


@pytest.mark.parametrize("name", CHOICES)
def test_a_head_on_a_candidates_columns_folds_onto_the_raw_ones(name):
    x, shapes = _joined()
    (columns,) = candidates(x[:200], 12, (name,))
    cols = columns(x).float()
    assert cols.shape[1] == {"encoder": 12, "encoder+whisper": 52, f"encoder+whisper{PCA_DIMS}": 12 + PCA_DIMS}[name]
    head, _ = fit_shape_head(cols[:200], shapes[:200], context=3)
    folded = fold_head(head, columns)
    assert folded.config.feature_dim == columns.raw_dim == (12 if name == "encoder" else 52)
    with torch.no_grad():
        want = head(context_windows(cols, 3))
        got = folded(context_windows(x[:, :columns.raw_dim], 3))
    assert (got - want).abs().max() < 1e-3 * want.abs().max()
    if name.startswith("encoder+whisper1"):  # the components are the training frames': unit variance there
        assert torch.allclose(cols[:200, 12:].std(0), torch.ones(PCA_DIMS), atol=1e-3)


def test_an_unknown_candidate_is_named():
    x, _ = _joined()
    with pytest.raises(ValueError, match="expected one of"):
        candidates(x, 12, ("whisper-only",))


def test_a_bundle_that_hears_whisper_saves_loads_and_runs_it_live(tmp_path):
    """A video bundle whose head reads the joined features: avatar.json records Whisper's window and width, the
    loaded bundle hears [T, D + W] offline, its live graph runs the joined stage and draws a picture per frame
    whose mouth follows the Whisper columns; a head of the wrong width is refused with what was expected."""
    import json

    import numpy as np
    from helpers import avatar_session
    from test_audio_whisper import _voice

    from framegraph.models.avatar import load_avatar
    from framegraph.models.avatar.video.bundle import random_video_avatar, save_video_avatar
    from framegraph.models.avatar.video.lipsync import ShapeHead

    avatar = random_video_avatar(region_size=64)
    avatar.silence_gate = False  # the head's shape is drawn as it comes (its VAD is off)
    d = avatar.audio.feature_dim
    avatar.whisper = {"windows_ms": [1000, 80, 80], "dim": 384, "compute_type": "int8", "columns": "encoder+whisper"}
    head = ShapeHead(feature_dim=d + 384)
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.weight[:, -384:] = 0.05 * torch.randn(3, 384, generator=torch.Generator().manual_seed(1))
    avatar.shape_head = head.eval()
    save_video_avatar(tmp_path / "b", avatar)
    assert json.loads((tmp_path / "b" / "avatar.json").read_text())["whisper"]["windows_ms"] == [1000, 80, 80]
    a = load_avatar(tmp_path / "b")
    assert a.features_kind == "encoder+whisper" and a.whisper["dim"] == 384
    speech = _voice(2.0, seed=2)
    assert tuple(a.hear(speech).shape) == (50, d + 384)
    graph, sink = avatar_session(a, speech)
    assert "joined_features" in [s.name for s in graph.stages]
    assert graph.run(timeout=180)["error"] is None
    frames = np.stack([f.data.numpy() for f in sink.of("video")])
    with torch.no_grad():
        a.shape_head.linear.weight.zero_()  # the same bundle deaf to Whisper: one shape throughout
    graph, sink = avatar_session(a, speech)
    assert graph.run(timeout=180)["error"] is None
    deaf = np.stack([f.data.numpy() for f in sink.of("video")])
    assert len(frames) == len(deaf) == 50
    changed = np.abs(frames.astype(int) - deaf).reshape(50, -1).max(1)
    assert (changed > 10).sum() > 25, changed  # the mouth follows the Whisper columns
    cfg = json.loads((tmp_path / "b" / "avatar.json").read_text())
    cfg["whisper"]["dim"] = 512
    (tmp_path / "b" / "avatar.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"shape head reads 512 features; the audio encoder and Whisper give 640"):
        load_avatar(tmp_path / "b")
