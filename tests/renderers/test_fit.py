"""Fitting Gaussians to posed images: the loop improves, densification moves the count, resume is exact."""
import dataclasses

import pytest
import torch

from framegraph.renderers.fit import DensifyConfig, FitConfig, Fitter, synthetic_dataset
from framegraph.renderers.fit.densify import DensifyState, refine, reset_opacity
from framegraph.renderers.fit.params import init_params, params_to_scene, scene_to_params
from framegraph.renderers.gaussians import load_ply
from framegraph.renderers.scenes import procedural_scene

W, H = 32, 24


@pytest.fixture(scope="module")
def tiny():
    train = synthetic_dataset("toy", 12, W, H, seed=0)
    held = synthetic_dataset("toy", 4, W, H, seed=0, held_out=True)
    return train, held


def test_short_fit_from_random_points_raises_psnr(tiny):
    train, held = tiny
    lo, hi = procedural_scene("toy").bounds
    cfg = FitConfig(steps=200, seed=0, sh_degree=1, init_points=150, densify_auto=False,
                    densify=DensifyConfig(refine_start=20, refine_every=20, refine_stop=150, reset_every=80,
                                          max_gaussians=500))
    f = Fitter(train, cfg, bounds=(lo, hi))
    start_train, start_held = f.evaluate(train)["psnr"], f.evaluate(held)["psnr"]
    n0 = f.n
    f.run(progress=False)
    end_train, end_held = f.evaluate(train)["psnr"], f.evaluate(held)["psnr"]
    assert end_train > start_train + 5.0, (start_train, end_train)
    assert end_held > start_held + 4.0, (start_held, end_held)  # it generalises to views it never saw
    refines = [h for h in f.history if h["event"] == "refine"]
    assert refines and sum(r["cloned"] + r["split"] for r in refines) > 0
    assert n0 < f.n <= 500
    assert f.sh_degree_now == 1
    assert any(h["event"] == "opacity_reset" for h in f.history)


def _params(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    pts = torch.rand(n, 3, generator=g)
    return init_params(pts, torch.rand(n, 3, generator=g), sh_degree=1, generator=g)


def _with_adam(params):
    """``params``, an Adam optimiser per tensor (each with state after one step), and a fresh DensifyState."""
    opts = {k: torch.optim.Adam([v], lr=1e-3) for k, v in params.items()}
    loss = sum(v.sum() for v in params.values())  # give every tensor Adam state
    loss.backward()
    for o in opts.values():
        o.step()
    return params, opts, DensifyState(params["means"].shape[0])


def test_grow_clones_small_and_splits_large_gaussians():
    params, opts, state = _with_adam(_params())
    n = params["means"].shape[0]
    with torch.no_grad():
        params["scales"][:8] = torch.log(torch.tensor(0.001))  # small -> cloned
        params["scales"][8:16] = torch.log(torch.tensor(0.5))  # large -> split
    state.grad2d[:16] = 1.0
    state.count[:16] = 1.0
    cfg = DensifyConfig(grow_grad2d=0.1, grow_scale3d=0.01, prune_opacity=0.0)
    counts = refine(params, opts, state, cfg, step=10, scene_scale=1.0)
    assert counts == {"cloned": 8, "split": 8, "pruned": 0}
    assert params["means"].shape[0] == n + 8 + 8  # clone adds one each; split replaces one by two
    for k, p in params.items():
        assert p.shape[0] == n + 16 and p.requires_grad and p.is_leaf
        st = opts[k].state[p]
        assert st["exp_avg"].shape == p.shape and opts[k].param_groups[0]["params"][0] is p
        assert torch.all(st["exp_avg"][-16:] == 0)  # new Gaussians start with zero moments
    big = torch.exp(params["scales"]).max(-1).values
    assert int((big > 0.4).sum()) == 0 and int(((big - 0.5 / 1.6).abs() < 1e-5).sum()) == 16
    assert state.grad2d.shape == (n + 16,) and float(state.grad2d.sum()) == 0  # reset after a round


def test_prune_removes_transparent_and_huge_gaussians():
    params, opts, state = _with_adam(_params())
    n = params["means"].shape[0]
    with torch.no_grad():
        params["opacities"][:5] = -10.0  # sigmoid ~ 4.5e-5 < 0.005
        params["scales"][5:7] = torch.log(torch.tensor(3.0))  # > 0.1 x scene scale
    cfg = DensifyConfig(grow_grad2d=1e9, reset_every=5)
    counts = refine(params, opts, state, cfg, step=10, scene_scale=10.0)  # "huge": > 1.0
    assert counts["pruned"] == 7 and params["means"].shape[0] == n - 7
    # before the first opacity reset, only transparency prunes
    params, opts, state = _with_adam(_params())
    with torch.no_grad():
        params["scales"][5:7] = torch.log(torch.tensor(3.0))
    assert refine(params, opts, state, cfg, step=4, scene_scale=10.0)["pruned"] == 0


def test_opacity_reset_caps_opacities_and_clears_their_moments():
    params, opts, _ = _with_adam(_params())
    reset_opacity(params, opts, 0.01)
    assert float(torch.sigmoid(params["opacities"].detach()).max()) <= 0.01 + 1e-6
    assert torch.all(opts["opacities"].state[params["opacities"]]["exp_avg"] == 0)


def test_scene_round_trip_through_params():
    params = _params()
    scene = params_to_scene(params)
    back = scene_to_params(scene)
    for k in ("means", "sh0", "shN"):
        assert torch.allclose(back[k], params[k].detach(), atol=1e-6)
    assert torch.allclose(torch.exp(back["scales"]), torch.exp(params["scales"].detach()), rtol=1e-5)


def _short_cfg(steps):
    return FitConfig(steps=steps, seed=3, sh_degree=1, init_points=80, densify_auto=False,
                     densify=DensifyConfig(refine_start=4, refine_every=8, refine_stop=40, reset_every=24),
                     sh_interval=10)


def test_checkpoint_resume_continues_from_the_same_state(tiny, tmp_path):
    train, _ = tiny
    lo, hi = procedural_scene("toy").bounds
    straight = Fitter(train, _short_cfg(48), bounds=(lo, hi))
    straight.run(progress=False)

    first = Fitter(train, _short_cfg(48), bounds=(lo, hi))
    first.run(30, progress=False)
    paths = first.save(str(tmp_path / "ck.ply"))
    assert load_ply(paths["ply"]).n == first.n
    resumed = Fitter.load(str(tmp_path / "ck"), train)
    assert resumed.step == 30 and resumed.n == first.n
    resumed.run(progress=False)

    assert straight.n == resumed.n
    for k in straight.params:
        assert torch.equal(straight.params[k], resumed.params[k]), k
        a = straight.optimizers[k].state[straight.params[k]]
        b = resumed.optimizers[k].state[resumed.params[k]]
        assert torch.equal(a["exp_avg_sq"], b["exp_avg_sq"]), k
    assert [h for h in straight.history if h["event"] != "train"] == \
        [h for h in resumed.history if h["event"] != "train"]


def test_resume_refuses_other_data_and_missing_files(tiny, tmp_path):
    from framegraph.renderers.fit import CheckpointError

    train, held = tiny
    with pytest.raises(CheckpointError, match="no fit checkpoint"):
        Fitter.load(str(tmp_path / "none"), train)
    f = Fitter(train, _short_cfg(4), bounds=procedural_scene("toy").bounds)
    f.run(progress=False)
    f.save(str(tmp_path / "a"))
    with pytest.raises(CheckpointError, match="n_views=12"):
        Fitter.load(str(tmp_path / "a"), held)
    (tmp_path / "a.fit.safetensors").unlink()
    with pytest.raises(CheckpointError, match="a.fit.safetensors: missing"):
        Fitter.load(str(tmp_path / "a"), train)


def test_config_scales_the_schedule_with_steps():
    cfg = FitConfig(steps=3000).resolved()
    assert cfg.sh_interval == 100
    d = cfg.densify
    assert (d.refine_start, d.refine_stop, d.refine_every, d.reset_every) == (150, 1500, 50, 600)
    assert FitConfig.from_json(cfg.to_json()) == cfg
    manual = FitConfig(steps=3000, densify_auto=False, densify=DensifyConfig(refine_every=7)).resolved()
    assert manual.densify.refine_every == 7 and dataclasses.asdict(manual)["densify"]["refine_start"] == 500
