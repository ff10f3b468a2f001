"""fudan-zvg 4DGS checkpoints: load them, with their activations, and save in the same layout.

Their training, ``main.py`` and ``Scene.save``, writes ``chkpnt<iteration>.pth`` and ``chkpnt_best.pth``. It
uses ``torch.save((gaussians.capture(), iteration), path)``. For ``gaussian_dim=4``,
``GaussianModel.capture()`` is the 19-tuple::

    0 active_sh_degree   int
    1 _xyz               [N, 3]
    2 _features_dc       [N, 1, 3]
    3 _features_rest     [N, K - 1, 3]
    4 _scaling           [N, 3]       log standard deviations (x, y, z)
    5 _rotation          [N, 4]       left quaternion (w, x, y, z), unnormalised
    6 _opacity           [N, 1]       logit
    7 max_radii2D        [N]
    8 xyz_gradient_accum [N, 1]
    9 t_gradient_accum   [N, 1]
   10 denom              [N, 1]
   11 optimizer.state_dict()
   12 spatial_lr_scale   float
   13 _t                 [N, 1]       temporal mean
   14 _scaling_t         [N, 1]       log standard deviation in time
   15 _rotation_r        [N, 4]       right quaternion (empty when rot_4d is False)
   16 rot_4d             bool
   17 env_map            tensor or None (a background environment map; not rendered here)
   18 active_sh_degree_t int

A ``gaussian_dim=3`` checkpoint has 12 entries. It has no ``t_gradient_accum`` and nothing after
``spatial_lr_scale``. Their code saves no point-cloud PLY for 4D models. ``Scene.save`` writes only the
checkpoint, and ``GaussianModel`` has no ``save_ply``. The scene's ``time_duration`` comes from their config
file, not the checkpoint. Pass it to :func:`load_checkpoint`. Or keep it in the JSON sidecar that
:func:`save_checkpoint` writes next to the ``.pth``, ``<name>.json``.

``rot_4d=False`` checkpoints load as the equivalent ``rot_4d`` scene. Those have a 3D rotation. They use
``exp(_scaling_t)`` directly as the temporal *variance*, as their renderer does.

Checkpoints are pickles. :func:`load_checkpoint` calls ``torch.load(weights_only=False)``, which can run code
from the file. Only load checkpoints you trust.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from framegraph.renderers.gaussians.reference import quat_to_rotmat
from framegraph.renderers.gaussians.scene import SceneError
from framegraph.stream.files import write_json, written_whole

from .reference import rotmat4_to_quats
from .scene import DEFAULT_TIME_DURATION, Gaussian4DScene

PathLike = str | os.PathLike

CAPTURE_FIELDS = (
    "active_sh_degree", "_xyz", "_features_dc", "_features_rest", "_scaling", "_rotation", "_opacity",
    "max_radii2D", "xyz_gradient_accum", "t_gradient_accum", "denom", "optimizer_state", "spatial_lr_scale",
    "_t", "_scaling_t", "_rotation_r", "rot_4d", "env_map", "active_sh_degree_t",
)
_FIELD = {name: i for i, name in enumerate(CAPTURE_FIELDS)}
_SH_BLOCK = 16  # fudan-zvg's eval_shfs_4d puts temporal block k at coefficients 16 k .. 16 k + 15
SIDECAR_FORMAT = "framegraph 4DGS checkpoint metadata v1"


class CheckpointError(SceneError):
    """A 4DGS checkpoint that can't be used. The message names the file and what was expected."""


def sidecar_path(path: PathLike) -> Path:
    """``scene.pth`` -> ``scene.json``: where :func:`save_checkpoint` keeps ``time_duration``."""
    return Path(path).with_suffix(".json")


# ----------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------
def load_checkpoint(
    path: PathLike,
    *,
    time_duration: Sequence[float] | None = None,
    device: str | torch.device = "cpu",
) -> Gaussian4DScene:
    """Read a fudan-zvg 4DGS checkpoint into an activated :class:`Gaussian4DScene`.

    Activations are as in their ``GaussianModel``. ``_scaling`` and ``_scaling_t`` get ``exp``. ``_opacity``
    gets ``sigmoid``. Quaternions are normalised. Colours keep the active degrees, ``active_sh_degree`` and
    ``active_sh_degree_t``. Their 16-wide temporal blocks are compacted to ``(active_sh_degree + 1) ** 2``.

    Args:
        path: a ``chkpnt*.pth``.
        time_duration: ``(t0, t1)`` from the training config. For example ``[0, 10]`` for their N3V configs,
            ``[0, 1]`` for D-NeRF. Default: the JSON sidecar if there is one. Else their default ``(-0.5, 0.5)``.
        device: where the tensors go.

    Raises:
        CheckpointError: naming the file and what was wrong. Not a torch file, or not the
            ``(model_params, iteration)`` layout. A 3D checkpoint, bad shapes, NaN/Inf values.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # any unpickling / zip failure
        raise CheckpointError(f"{path}: not a readable torch checkpoint ({type(exc).__name__}: {exc})") from None
    params = _unpack(path, obj)
    fields = dict(zip(CAPTURE_FIELDS, params))
    if time_duration is None:
        time_duration = _read_sidecar(path)
    scene = _scene_from_fields(path, fields, time_duration)
    return scene.to(device) if torch.device(device) != scene.device else scene


def _unpack(path: Path, obj: Any) -> tuple[Any, ...]:
    expected = ("expected (model_params, iteration) as written by fudan-zvg 4D Gaussian splatting "
                "(torch.save((gaussians.capture(), iteration), ...))")
    if not isinstance(obj, (tuple, list)) or len(obj) != 2:
        got = type(obj).__name__ + (f" of length {len(obj)}" if isinstance(obj, (tuple, list)) else "")
        raise CheckpointError(f"{path}: {expected}; got a {got}")
    params, _iteration = obj
    if not isinstance(params, (tuple, list)):
        raise CheckpointError(f"{path}: {expected}; model_params is a {type(params).__name__}")
    if len(params) == 12:
        raise CheckpointError(f"{path}: this is a 3D Gaussian checkpoint (12 fields, gaussian_dim=3); expected "
                              f"a 4D one with {len(CAPTURE_FIELDS)} fields. Render 3D scenes with "
                              "framegraph.renderers.gaussians")
    if len(params) != len(CAPTURE_FIELDS):
        raise CheckpointError(f"{path}: model_params has {len(params)} fields; a 4D checkpoint "
                              f"(GaussianModel.capture(), gaussian_dim=4) has {len(CAPTURE_FIELDS)}: "
                              + ", ".join(CAPTURE_FIELDS))
    return tuple(params)


def _tensor(path: Path, fields: dict, name: str, shape: tuple[int | None, ...]) -> Tensor:
    x = fields[name]
    want = "[" + ", ".join("N" if s is None else str(s) for s in shape) + "]"
    if not isinstance(x, Tensor):
        raise CheckpointError(f"{path}: field {_FIELD[name]} ({name}) should be a tensor {want}, "
                              f"got {type(x).__name__}")
    x = x.detach().to("cpu", torch.float32)
    if x.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, x.shape)):
        raise CheckpointError(f"{path}: field {_FIELD[name]} ({name}) should have shape {want}, got {list(x.shape)}")
    bad = int((~torch.isfinite(x)).sum())
    if bad:
        raise CheckpointError(f"{path}: field {_FIELD[name]} ({name}) contains {bad} NaN or Inf values")
    return x


def _int_field(path: Path, fields: dict, name: str, lo: int, hi: int) -> int:
    v = fields[name]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise CheckpointError(f"{path}: field {_FIELD[name]} ({name}) should be an int in {lo}..{hi}, got {v!r}")
    return v


def _scene_from_fields(path: Path, fields: dict, time_duration: Sequence[float] | None) -> Gaussian4DScene:
    deg = _int_field(path, fields, "active_sh_degree", 0, 3)
    deg_t = _int_field(path, fields, "active_sh_degree_t", 0, 8)
    rot_4d = fields["rot_4d"]
    if not isinstance(rot_4d, bool):
        raise CheckpointError(f"{path}: field {_FIELD['rot_4d']} (rot_4d) should be a bool, got {rot_4d!r}")

    xyz = _tensor(path, fields, "_xyz", (None, 3))
    n = xyz.shape[0]
    dc = _tensor(path, fields, "_features_dc", (n, 1, 3))
    rest = _tensor(path, fields, "_features_rest", (n, None, 3))
    scaling = _tensor(path, fields, "_scaling", (n, 3))
    rotation = _tensor(path, fields, "_rotation", (n, 4))
    opacity = _tensor(path, fields, "_opacity", (n, 1))
    t = _tensor(path, fields, "_t", (n, 1))
    scaling_t = _tensor(path, fields, "_scaling_t", (n, 1))
    if n and (rotation.norm(dim=-1) == 0).any():
        raise CheckpointError(f"{path}: field {_FIELD['_rotation']} (_rotation) has zero-norm quaternions")

    if rot_4d:
        rotation_r = _tensor(path, fields, "_rotation_r", (n, 4))
        if n and (rotation_r.norm(dim=-1) == 0).any():
            raise CheckpointError(f"{path}: field {_FIELD['_rotation_r']} (_rotation_r) has zero-norm quaternions")
        quats_l, quats_r = F.normalize(rotation, dim=-1), F.normalize(rotation_r, dim=-1)
        scales_t = torch.exp(scaling_t)
    else:
        # 3D rotation in (x, y, z), time independent of space: R4 = diag(R3, 1); their renderer uses
        # exp(_scaling_t) as the temporal variance, so the standard deviation is its square root.
        R4 = torch.zeros(n, 4, 4, dtype=torch.float64)
        R4[:, :3, :3] = quat_to_rotmat(rotation.double())
        R4[:, 3, 3] = 1.0
        quats_l, quats_r = (q.float() for q in rotmat4_to_quats(R4))
        scales_t = torch.exp(0.5 * scaling_t)

    sh = torch.cat([dc, rest], dim=1)  # [N, K, 3], coefficient-major like their features
    n_sh = (deg + 1) ** 2
    if deg_t > 0 and sh.shape[1] >= _SH_BLOCK * (deg_t + 1):
        sh = torch.cat([sh[:, k * _SH_BLOCK: k * _SH_BLOCK + n_sh] for k in range(deg_t + 1)], dim=1)
    else:
        # no temporal blocks stored (force_sh_3d, or sh_degree_t = 0): colour is constant in time
        if sh.shape[1] < n_sh:
            raise CheckpointError(f"{path}: active_sh_degree={deg} needs {n_sh} colour coefficients, the "
                                  f"features hold {sh.shape[1]}")
        deg_t, sh = 0, sh[:, :n_sh]

    if time_duration is None:
        time_duration = DEFAULT_TIME_DURATION
    try:
        t0, t1 = (float(v) for v in time_duration)
    except (TypeError, ValueError):
        raise CheckpointError(f"{path}: time_duration should be (t0, t1), got {time_duration!r}") from None
    if not (math.isfinite(t0) and math.isfinite(t1) and t1 > t0):
        raise CheckpointError(f"{path}: time_duration should be (t0, t1) with t1 > t0, got {time_duration!r}")

    return Gaussian4DScene(
        means=xyz, times=t[:, 0], scales=torch.cat([torch.exp(scaling), scales_t], dim=1),
        quats_l=quats_l.contiguous(), quats_r=quats_r.contiguous(), opacities=torch.sigmoid(opacity[:, 0]),
        sh=sh.contiguous(), sh_degree_t=deg_t, time_duration=(t0, t1),
    )


def _read_sidecar(path: Path) -> tuple[float, float] | None:
    side = sidecar_path(path)
    if not side.is_file():
        return None
    try:
        meta = json.loads(side.read_text())
        t0, t1 = meta["time_duration"]
        return float(t0), float(t1)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{side}: expected JSON with \"time_duration\": [t0, t1] "
                              f"({type(exc).__name__}: {exc})") from None


# ----------------------------------------------------------------------------
# Saving
# ----------------------------------------------------------------------------
def _logit(p: Tensor) -> Tensor:
    p = p.clamp(1e-6, 1 - 1e-6)
    return torch.log(p / (1 - p))


def save_checkpoint(
    scene: Gaussian4DScene, path: PathLike, *, iteration: int = 0, sh_degree_t_max: int | None = None,
    sidecar: bool = True,
) -> Path:
    """Write ``scene`` as a fudan-zvg checkpoint ``(GaussianModel.capture(), iteration)``, with ``rot_4d=True``.

    Pre-activation values are stored: log scales, logit opacity, unit quaternions. Features are in their layout:
    ``[N, 1, 3]`` + ``[N, K - 1, 3]``. With ``sh_degree_t > 0``, temporal blocks are 16 wide. So SH degree 3 is
    stored, zero-padded. Training statistics are zeros. The optimizer state is an empty Adam ``state_dict`` with
    their parameter groups. So their ``GaussianModel.restore`` accepts the file. With ``sidecar``, the scene's
    ``time_duration`` goes to ``<name>.json``. Returns ``path``.
    """
    path = Path(path)
    s = scene.to("cpu", torch.float32)
    n, deg, deg_t = s.n, s.sh_degree, s.sh_degree_t
    if deg_t > 0:  # their layout: block k at 16 k, spatial degree 3
        sh = torch.zeros(n, _SH_BLOCK * (max(deg_t, sh_degree_t_max or 0) + 1), 3)
        n_sh = (deg + 1) ** 2
        for k in range(deg_t + 1):
            sh[:, k * _SH_BLOCK: k * _SH_BLOCK + n_sh] = s.sh[:, k * n_sh:(k + 1) * n_sh]
        active_deg = 3
    else:
        sh, active_deg = s.sh.clone(), deg
    P = torch.nn.Parameter
    params = {
        "xyz": P(s.means.clone()), "f_dc": P(sh[:, :1].contiguous()), "f_rest": P(sh[:, 1:].contiguous()),
        "opacity": P(_logit(s.opacities)[:, None]), "scaling": P(torch.log(s.scales[:, :3])),
        "rotation": P(s.quats_l.clone()), "t": P(s.times[:, None].clone()),
        "scaling_t": P(torch.log(s.scales[:, 3:])), "rotation_r": P(s.quats_r.clone()),
    }
    groups = [{"params": [p], "lr": 0.0, "name": name} for name, p in params.items()]
    optimizer_state = torch.optim.Adam(groups, lr=0.0, eps=1e-15).state_dict()
    zeros = lambda *shape: torch.zeros(*shape)  # noqa: E731
    capture = (
        active_deg, params["xyz"], params["f_dc"], params["f_rest"], params["scaling"], params["rotation"],
        params["opacity"], zeros(n), zeros(n, 1), zeros(n, 1), zeros(n, 1), optimizer_state, 1.0,
        params["t"], params["scaling_t"], params["rotation_r"], True, None, deg_t,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(path) as tmp:
        torch.save((capture, int(iteration)), tmp)
    if sidecar:
        meta = {"format": SIDECAR_FORMAT, "time_duration": list(s.time_duration), "n_gaussians": n,
                "sh_degree": deg, "sh_degree_t": deg_t}
        write_json(sidecar_path(path), meta)
    return path
