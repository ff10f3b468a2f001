"""Scene files: INRIA 3DGS PLY, read and write, and antimatter15 ``.splat``, read.

INRIA PLY is binary little-endian, with one ``vertex`` element of float32 properties:
``x y z nx ny nz f_dc_0..2 f_rest_0..(3(K-1)-1) opacity scale_0..2 rot_0..3``. That is 62 floats for SH degree 3.
``f_rest`` is channel-major: all red coefficients, then green, then blue. ``opacity`` is a logit. ``scale_*`` are
logs. ``rot_*`` is a quaternion, order w, x, y, z, not necessarily unit.

``.splat`` has 32 bytes per Gaussian:

- position: 3 x f32.
- linear scale: 3 x f32.
- RGBA: 4 x u8. Colour = 0.5 + SH_C0 * f_dc, alpha = opacity.
- quaternion: 4 x u8, order w, x, y, z, as ``(q - 128) / 128``.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from .reference import SH_C0
from .scene import DeviceLike, GaussianScene, SceneError, SceneTooLargeError, check_fits

__all__ = ["load_ply", "save_ply", "load_splat", "load_scene", "GaussianScene", "SceneError",
           "SceneTooLargeError", "check_fits"]

PathLike = str | os.PathLike

_PLY_TYPES = {
    "char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1",
    "short": "i2", "int16": "i2", "ushort": "u2", "uint16": "u2",
    "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
    "float": "f4", "float32": "f4", "double": "f8", "float64": "f8",
}
_MAX_HEADER_BYTES = 1 << 20
_F_REST_COUNTS = {0: 0, 9: 1, 24: 2, 45: 3}  # number of f_rest properties -> SH degree


# ----------------------------------------------------------------------------
# PLY header
# ----------------------------------------------------------------------------
class _Element:
    def __init__(self, name: str, count: int):
        self.name, self.count = name, count
        self.props: list[tuple[str, str]] = []  # (name, numpy type) ; type "list" for list props

    @property
    def fixed_size(self) -> bool:
        return all(t != "list" for _, t in self.props)

    def dtype(self, endian: str) -> np.dtype:
        return np.dtype([(name, endian + t) for name, t in self.props])


def _read_header(f, path: Path) -> tuple[str, list[_Element], int]:
    """Parse a PLY header. Returns endian '<' or '>', the elements and the header length in bytes."""
    magic = f.readline(16)
    if magic.rstrip(b"\r\n") != b"ply":
        raise SceneError(f"{path}: not a PLY file (it does not start with 'ply')")
    fmt: str | None = None
    elements: list[_Element] = []
    while True:
        line = f.readline(4096)
        if not line:
            raise SceneError(f"{path}: truncated PLY header (no 'end_header' line)")
        if f.tell() > _MAX_HEADER_BYTES:
            raise SceneError(f"{path}: PLY header longer than {_MAX_HEADER_BYTES} bytes; the file is malformed")
        try:
            words = line.decode("ascii").split()
        except UnicodeDecodeError:
            raise SceneError(f"{path}: malformed PLY header (non-ASCII bytes before 'end_header')") from None
        if not words or words[0] in ("comment", "obj_info"):
            continue
        key = words[0]
        if key == "end_header":
            break
        if key == "format":
            if len(words) != 3:
                raise SceneError(f"{path}: malformed PLY format line {line!r}")
            fmt = words[1]
        elif key == "element":
            if len(words) != 3 or not words[2].isdigit():
                raise SceneError(f"{path}: malformed PLY element line {line!r}")
            elements.append(_Element(words[1], int(words[2])))
        elif key == "property":
            if not elements:
                raise SceneError(f"{path}: PLY property before any element: {line!r}")
            if len(words) == 5 and words[1] == "list":
                elements[-1].props.append((words[4], "list"))
            elif len(words) == 3 and words[1] in _PLY_TYPES:
                elements[-1].props.append((words[2], _PLY_TYPES[words[1]]))
            else:
                raise SceneError(f"{path}: unknown PLY property line {line!r}")
        else:
            raise SceneError(f"{path}: unknown PLY header line {line!r}")
    if fmt is None:
        raise SceneError(f"{path}: PLY header has no 'format' line")
    if fmt not in ("binary_little_endian", "binary_big_endian"):
        raise SceneError(f"{path}: unsupported PLY format {fmt!r}; 3DGS scenes are binary_little_endian")
    return ("<" if fmt == "binary_little_endian" else ">"), elements, f.tell()


def _read_vertices(path: Path, device: DeviceLike | None) -> np.ndarray:
    size = path.stat().st_size
    with open(path, "rb") as f:
        endian, elements, header_len = _read_header(f, path)
        offset = header_len
        vertex = None
        for el in elements:
            if el.name == "vertex":
                vertex = el
                break
            if not el.fixed_size:
                raise SceneError(f"{path}: element {el.name!r} with list properties precedes 'vertex'; unsupported")
            offset += el.count * el.dtype(endian).itemsize
        if vertex is None:
            raise SceneError(f"{path}: PLY has no 'vertex' element")
        if not vertex.fixed_size:
            raise SceneError(f"{path}: the 'vertex' element has list properties; not a 3DGS PLY")
        dtype = vertex.dtype(endian)
        n = vertex.count
        _require_properties(path, [p for p, _ in vertex.props])
        degree = _sh_degree_of(path, [p for p, _ in vertex.props])
        check_fits(n, "cpu", degree, available=None, source=str(path))
        if device is not None and torch.device(device).type != "cpu":
            check_fits(n, device, degree, source=str(path))
        need = n * dtype.itemsize
        have = size - offset
        if have < need:
            raise SceneError(
                f"{path}: truncated: header declares {n} vertices x {dtype.itemsize} bytes = {need} bytes, "
                f"but only {have} bytes follow the header"
            )
        later = elements[elements.index(vertex) + 1:]
        if all(el.fixed_size for el in later):
            expected = need + sum(el.count * el.dtype(endian).itemsize for el in later)
            if have != expected:
                raise SceneError(
                    f"{path}: wrong vertex count: header declares {n} vertices ({expected} bytes of data) "
                    f"but {have} bytes follow the header"
                )
        f.seek(offset)
        data = np.fromfile(f, dtype=dtype, count=n)
    if data.shape[0] != n:
        raise SceneError(f"{path}: truncated: read {data.shape[0]} of {n} vertices")
    return data


def _require_properties(path: Path, names: list[str]) -> None:
    required = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity",
                "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    missing = [r for r in required if r not in names]
    if missing:
        raise SceneError(f"{path}: not a 3DGS PLY: missing vertex properties {', '.join(missing)}")


def _sh_degree_of(path: Path, names: list[str]) -> int:
    rest = sorted(int(p[len("f_rest_"):]) for p in names if p.startswith("f_rest_") and p[7:].isdigit())
    if rest != list(range(len(rest))) or len(rest) not in _F_REST_COUNTS:
        raise SceneError(
            f"{path}: {len(rest)} f_rest properties (f_rest_0..f_rest_{len(rest) - 1} expected contiguous); "
            "a 3DGS PLY has 0, 9, 24 or 45 (SH degree 0..3)"
        )
    return _F_REST_COUNTS[len(rest)]


# ----------------------------------------------------------------------------
# Activations (float64 math, float32 results: deterministic across platforms)
# ----------------------------------------------------------------------------
def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p.astype(np.float64), 1e-12, 1.0 - 1e-12)
    return np.log(p / (1.0 - p)).astype(np.float32)


def _exp(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.exp(x.astype(np.float64)).astype(np.float32)


def _log(s: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(s.astype(np.float64), 1e-30)).astype(np.float32)


def _normalize(q: np.ndarray) -> np.ndarray:
    q = q.astype(np.float64)
    return (q / np.linalg.norm(q, axis=-1, keepdims=True)).astype(np.float32)


def _check_finite(path: Path, name: str, values: np.ndarray) -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        rows = np.nonzero(bad.reshape(bad.shape[0], -1).any(axis=1))[0]
        raise SceneError(
            f"{path}: {name} has {int(bad.sum())} NaN/Inf values (first at Gaussian {int(rows[0])} of "
            f"{values.shape[0]})"
        )


# ----------------------------------------------------------------------------
# PLY
# ----------------------------------------------------------------------------
def load_ply(path: PathLike, device: DeviceLike | None = None) -> GaussianScene:
    """Read an INRIA 3DGS PLY into an activated :class:`GaussianScene`.

    Opacities get ``sigmoid`` and scales ``exp``. Quaternions are normalised. SH coefficients are reshaped to
    ``[N, K, 3]``. The degree follows from the number of ``f_rest`` properties.

    Raises :class:`SceneError` naming the file for a malformed or truncated file. So it does for missing
    properties, a wrong vertex count or NaN/Inf values. Raises :class:`SceneTooLargeError` before allocating,
    if the scene would not fit in host memory or on ``device``.
    """
    path = Path(path)
    if not path.is_file():
        raise SceneError(f"{path}: no such file")
    data = _read_vertices(path, device)
    names = data.dtype.names
    n = data.shape[0]
    n_rest = sum(1 for p in names if p.startswith("f_rest_"))
    K = n_rest // 3 + 1

    def cols(fields: list[str]) -> np.ndarray:
        return (np.stack([data[f].astype(np.float32) for f in fields], axis=-1) if fields
                else np.zeros((n, 0), np.float32))

    means = cols(["x", "y", "z"])
    f_dc = cols([f"f_dc_{i}" for i in range(3)])
    f_rest = cols([f"f_rest_{i}" for i in range(n_rest)])
    opacity_raw = data["opacity"].astype(np.float32)
    scale_raw = cols([f"scale_{i}" for i in range(3)])
    rot_raw = cols([f"rot_{i}" for i in range(4)])
    for name, values in (("position", means), ("f_dc", f_dc), ("f_rest", f_rest),
                         ("opacity", opacity_raw), ("scale", scale_raw), ("rot", rot_raw)):
        _check_finite(path, name, values)

    scales = _exp(scale_raw)
    if not np.isfinite(scales).all():
        i = int(np.nonzero(~np.isfinite(scales).all(axis=1))[0][0])
        raise SceneError(f"{path}: scale of Gaussian {i} overflows float32 after exp ({scale_raw[i].tolist()})")
    norms = np.linalg.norm(rot_raw.astype(np.float64), axis=1)
    if (norms == 0).any():
        i = int(np.nonzero(norms == 0)[0][0])
        raise SceneError(f"{path}: Gaussian {i} has a zero quaternion (rot_0..3 all 0)")

    # f_rest is channel-major: [N, 3, K-1] -> [N, K-1, 3]
    rest = f_rest.reshape(n, 3, K - 1).transpose(0, 2, 1)
    sh = np.concatenate([f_dc[:, None, :], rest], axis=1)
    normals = cols(["nx", "ny", "nz"]) if all(k in names for k in ("nx", "ny", "nz")) else None
    scene = GaussianScene(
        means=torch.from_numpy(means),
        quats=torch.from_numpy(_normalize(rot_raw)),
        scales=torch.from_numpy(scales),
        opacities=torch.from_numpy(_sigmoid(opacity_raw)),
        sh=torch.from_numpy(np.ascontiguousarray(sh)),
        raw={"opacity": opacity_raw, "scale": scale_raw, "rot": rot_raw, "normals": normals},
    )
    return scene if device is None else scene.to(device)


def _reuse_raw(raw: np.ndarray | None, current: np.ndarray, activate, invert) -> np.ndarray:
    """Encode ``current`` back to file values. It keeps the loaded bits where they still decode to it."""
    encoded = invert(current)
    if raw is None or raw.shape != current.shape:
        return encoded
    same = activate(raw) == current
    if same.ndim > 1:
        same = same.all(axis=-1, keepdims=True)
    return np.where(same, raw, encoded)


def save_ply(scene: GaussianScene, path: PathLike) -> None:
    """Write ``scene`` as an INRIA 3DGS PLY, with inverse activations and zero normals.

    Loading the result and saving again gives the same bytes. Gaussians unchanged since :func:`load_ply` keep
    their original raw values.
    """
    path = Path(path)
    n, K = scene.n, scene.sh.shape[1]

    def host(t: torch.Tensor) -> np.ndarray:
        return t.detach().to("cpu", torch.float32).numpy()

    raw = scene.raw or {}
    opacity = _reuse_raw(raw.get("opacity"), host(scene.opacities), _sigmoid, _logit)
    scale = _reuse_raw(raw.get("scale"), host(scene.scales), _exp, _log)
    rot = _reuse_raw(raw.get("rot"), host(scene.quats), _normalize, lambda q: q.astype(np.float32))
    normals = raw.get("normals")
    if normals is None or normals.shape != (n, 3):
        normals = np.zeros((n, 3), np.float32)
    sh = host(scene.sh)
    f_rest = sh[:, 1:, :].transpose(0, 2, 1).reshape(n, 3 * (K - 1))  # channel-major

    columns = ([("x", "y", "z"), ("nx", "ny", "nz"), ("f_dc_0", "f_dc_1", "f_dc_2"),
                tuple(f"f_rest_{i}" for i in range(3 * (K - 1))), ("opacity",),
                ("scale_0", "scale_1", "scale_2"), ("rot_0", "rot_1", "rot_2", "rot_3")])
    values = [host(scene.means), normals, sh[:, 0, :], f_rest, opacity[:, None], scale, rot]
    names = [name for group in columns for name in group]
    table = np.concatenate([v.reshape(n, -1).astype(np.float32) for v in values], axis=1)
    assert table.shape[1] == len(names)
    header = "ply\nformat binary_little_endian 1.0\n" f"element vertex {n}\n"
    header += "".join(f"property float {name}\n" for name in names) + "end_header\n"
    with open(path, "wb") as f:
        f.write(header.encode("ascii"))
        f.write(np.ascontiguousarray(table, dtype="<f4").tobytes())


# ----------------------------------------------------------------------------
# .splat
# ----------------------------------------------------------------------------
_SPLAT_DTYPE = np.dtype([("position", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4), ("rot", "u1", 4)])


def load_splat(path: PathLike, device: DeviceLike | None = None) -> GaussianScene:
    """Read an antimatter15 ``.splat`` file, 32 bytes per Gaussian, as an SH-degree-0 scene."""
    path = Path(path)
    if not path.is_file():
        raise SceneError(f"{path}: no such file")
    size = path.stat().st_size
    if size == 0 or size % _SPLAT_DTYPE.itemsize:
        raise SceneError(f"{path}: a .splat file holds 32-byte records; {size} bytes is not a multiple of 32")
    n = size // _SPLAT_DTYPE.itemsize
    check_fits(n, "cpu", 0, source=str(path))
    if device is not None and torch.device(device).type != "cpu":
        check_fits(n, device, 0, source=str(path))
    data = np.fromfile(path, dtype=_SPLAT_DTYPE)
    _check_finite(path, "position", data["position"])
    _check_finite(path, "scale", data["scale"])
    rgba = data["rgba"].astype(np.float32) / 255.0
    rot = (data["rot"].astype(np.float32) - 128.0) / 128.0
    if (np.linalg.norm(rot, axis=1) == 0).any():
        i = int(np.nonzero(np.linalg.norm(rot, axis=1) == 0)[0][0])
        raise SceneError(f"{path}: Gaussian {i} has a zero quaternion")
    sh_dc = (rgba[:, :3] - 0.5) / SH_C0
    scene = GaussianScene(
        means=torch.from_numpy(data["position"].astype(np.float32)),
        quats=torch.from_numpy(_normalize(rot)),
        scales=torch.from_numpy(data["scale"].astype(np.float32)),
        opacities=torch.from_numpy(rgba[:, 3].copy()),
        sh=torch.from_numpy(sh_dc[:, None, :].astype(np.float32)),
    )
    return scene if device is None else scene.to(device)


def load_scene(path: PathLike, device: DeviceLike | None = None) -> GaussianScene:
    """Load a scene by extension: ``.ply``, INRIA's, or ``.splat``."""
    suffix = Path(path).suffix.lower()
    if suffix == ".ply":
        return load_ply(path, device)
    if suffix == ".splat":
        return load_splat(path, device)
    raise SceneError(f"{path}: unknown scene format {suffix!r}; expected .ply (INRIA 3DGS) or .splat")
