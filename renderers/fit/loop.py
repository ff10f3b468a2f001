"""What every fit shares: the step loop with its progress bar, checkpoint files, Ctrl-C, resume checks.

:class:`TrainingRun` is the base of :class:`~framegraph.renderers.fit.Fitter` for 3D Gaussians. It is also the
base of :class:`~framegraph.renderers.nerf.NerfFitter` for NeRF. A subclass keeps ``step``, the steps done. It
also keeps ``wall_s`` and ``history``. It gives :meth:`~TrainingRun.train_step` and :meth:`~TrainingRun.save`.
:meth:`~TrainingRun.run` is the one loop:

- a tqdm bar with steps, rate and ETA. It shows the mean PSNR of the last 50 training batches.
- a checkpoint every ``checkpoint_every`` steps and at the end.
- Ctrl-C lets the step in flight finish. It saves a checkpoint, when one is named. Then it raises
  ``KeyboardInterrupt``. So the saved state is exactly that of a step boundary. ``--resume`` continues as if
  never stopped. A second Ctrl-C interrupts at once, and nothing more is saved.

A checkpoint ``PREFIX`` is two files. :func:`write_checkpoint` writes them and :func:`read_checkpoint` reads them.

- ``PREFIX.fit.json``: format, version, step, config, data fingerprint, history. Written last.
- ``PREFIX.fit.safetensors``: the tensors. Parameters, Adam moments, anything else the fit needs to continue
  bit for bit.
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from framegraph.stream.files import write_json, written_whole
from framegraph.stream.progress import finish_step_on_interrupt

from ..posed_images import PosedImages


class CheckpointError(ValueError):
    """A fit checkpoint that can't be resumed. The message names the file and the problem."""


class TrainingRun:
    """A fit in progress, driven by :meth:`run`.

    Subclasses set ``train``, the training data. They also set ``step``, ``wall_s``, ``history`` and
    ``total_steps``. They implement :meth:`train_step` and :meth:`save`."""

    train: PosedImages
    step: int = 0
    wall_s: float = 0.0
    history: list[dict[str, Any]]
    total_steps: int = 0

    def checkpoint_doc(self, fmt: str, version: int, **fields: Any) -> dict[str, Any]:
        """A checkpoint's JSON. It holds ``format`` and ``version`` and the progress: ``step``, ``wall_s``,
        ``history``. It holds the fingerprint of the training data, ``data``, and the fit's own ``fields``."""
        return {"format": fmt, "version": version, "step": self.step, "wall_s": round(self.wall_s, 3),
                "data": data_fingerprint(self.train), "history": self.history, **fields}

    def resume_progress(self, doc: dict[str, Any]) -> None:
        """Take ``step``, ``wall_s`` and ``history`` from a checkpoint's JSON; see :meth:`checkpoint_doc`."""
        self.step, self.wall_s = int(doc["step"]), float(doc.get("wall_s", 0.0))
        self.history = list(doc.get("history", []))

    def train_step(self) -> dict[str, float]:
        """One optimisation step. Returns at least ``{"loss", "psnr"}`` of the step's batch."""
        raise NotImplementedError

    def save(self, prefix: str) -> dict[str, str]:
        """Write the checkpoint ``prefix`` and the usable result. Returns the paths written."""
        raise NotImplementedError

    def progress_postfix(self) -> dict[str, Any]:
        """Extra fields for the progress bar, e.g. the number of Gaussians."""
        return {}

    def run(self, steps: int | None = None, *, progress: bool = True, checkpoint_every: int | None = None,
            checkpoint: str | None = None, desc: str = "fit") -> None:
        """Train until step ``steps``, default :attr:`total_steps`. A progress bar shows steps/s, ETA and PSNR.

        With ``checkpoint``, a path prefix, it saves every ``checkpoint_every`` steps and at the end. On Ctrl-C,
        the step in flight finishes. The checkpoint, when given, is saved. ``KeyboardInterrupt`` is raised.
        """
        from tqdm import tqdm

        end = self.total_steps if steps is None else steps
        bar = tqdm(total=end, initial=self.step, desc=desc, disable=not progress, dynamic_ncols=True, unit="step")
        recent: list[float] = []
        t0 = time.perf_counter()
        with finish_step_on_interrupt() as interrupted:
            try:
                while self.step < end and not interrupted.is_set():
                    out = self.train_step()
                    recent = (recent + [out["psnr"]])[-50:]
                    bar.set_postfix(psnr=f"{sum(recent) / len(recent):.2f}", **self.progress_postfix(), refresh=False)
                    bar.update(1)
                    if self.step % 100 == 0:
                        self.history.append({"step": self.step, "event": "train",
                                             "psnr": round(sum(recent) / len(recent), 3),
                                             "loss": round(out["loss"], 5), **self.progress_postfix()})
                    if checkpoint and checkpoint_every and self.step % checkpoint_every == 0 and self.step < end:
                        self.wall_s += time.perf_counter() - t0
                        t0 = time.perf_counter()
                        self.save(checkpoint)
            finally:
                self.wall_s += time.perf_counter() - t0
                bar.close()
            if interrupted.is_set():
                if checkpoint:
                    self.save(checkpoint)
                    print(f"interrupted at step {self.step}: saved the checkpoint {checkpoint} (continue with "
                          "--resume)", file=sys.stderr)
                raise KeyboardInterrupt
        if checkpoint:
            self.save(checkpoint)


def progress(items: Iterable, total: int, desc: str, enabled: bool = True) -> Iterable:
    """``items`` with a tqdm bar when ``enabled``, for evaluations that take a while.

    The finished bar stays on screen. So the user sees that every item was done, and how long it took."""
    from tqdm import tqdm

    return tqdm(items, total=total, desc=desc, disable=not enabled, dynamic_ncols=True, leave=True)


# ---------------------------------------------------------------------- checkpoint files
def checkpoint_paths(prefix: str) -> tuple[Path, Path]:
    """``(PREFIX.fit.json, PREFIX.fit.safetensors)``."""
    return Path(prefix + ".fit.json"), Path(prefix + ".fit.safetensors")


def write_checkpoint(prefix: str, doc: dict[str, Any], tensors: dict[str, Tensor]) -> dict[str, str]:
    """Write ``tensors`` then ``doc`` as the checkpoint ``prefix``. Tensors must be CPU and contiguous.

    Each file is written whole by :func:`~framegraph.stream.files.written_whole`. So an interruption never leaves
    half a file."""
    from safetensors.torch import save_file

    jpath, spath = checkpoint_paths(prefix)
    jpath.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(spath) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp))
    write_json(jpath, doc, indent=1)
    return {"json": str(jpath), "state": str(spath)}


def read_checkpoint(prefix: str, fmt: str, version: int,
                    data: PosedImages | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(doc, tensors)`` of the checkpoint ``prefix``, checked to be of format ``fmt`` and ``version``.

    With ``data``, it is also checked to have been fit on that data; see :func:`check_same_data`.
    :class:`CheckpointError` names the file and the problem."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    jpath, spath = checkpoint_paths(prefix)
    if not jpath.is_file():
        raise CheckpointError(f"{jpath}: no fit checkpoint to resume (run without --resume first)")
    try:
        doc = json.loads(jpath.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{jpath}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise CheckpointError(f"{jpath}: not a {fmt} checkpoint "
                              f"(format {doc.get('format') if isinstance(doc, dict) else None!r})")
    if doc.get("version") != version:
        raise CheckpointError(f"{jpath}: checkpoint version {doc.get('version')} (expected {version})")
    if not spath.is_file():
        raise CheckpointError(f"{spath}: missing (it holds the optimizer state that goes with {jpath.name})")
    try:
        tensors = load_file(str(spath))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{spath}: cannot read ({e})") from None
    if data is not None:
        check_same_data(prefix, doc.get("data", {}), data)
    return doc, tensors


def data_fingerprint(data: PosedImages) -> dict[str, Any]:
    """What identifies the training data in a checkpoint: views, size, source, mean pixel."""
    return {"n_views": len(data), "width": data.width, "height": data.height, "source": data.source,
            "image_mean": round(float(data.images.float().mean()), 6)}


def check_same_data(prefix: str, saved: dict[str, Any], data: PosedImages) -> None:
    """Refuse to resume on data whose views or size differ from the checkpoint's. Raises :class:`CheckpointError`."""
    have = data_fingerprint(data)
    for key in ("n_views", "width", "height"):
        if saved.get(key) != have[key]:
            raise CheckpointError(f"{checkpoint_paths(prefix)[0]}: was fit on {key}={saved.get(key)}, this data has "
                                  f"{have[key]}; resume with the same images, cameras and options")


def adam_tensors(opt: torch.optim.Optimizer, names: Sequence[str], prefix: str = "adam") -> dict[str, Tensor]:
    """The Adam state of ``opt``'s parameters, as ``{f"{prefix}.{name}.{step|exp_avg|exp_avg_sq}": tensor}``.

    Parameters come in param-group order, one name each. It is empty before the first step."""
    params = [p for g in opt.param_groups for p in g["params"]]
    if len(params) != len(names):
        raise ValueError(f"adam_tensors: {len(params)} parameters but {len(names)} names")
    out = {}
    for name, p in zip(names, params):
        for key, v in opt.state.get(p, {}).items():
            v = torch.as_tensor(v).detach().cpu()
            out[f"{prefix}.{name}.{key}"] = (v.reshape(-1) if key == "step" else v).contiguous()
    return out


def load_adam_tensors(opt: torch.optim.Optimizer, names: Sequence[str], tensors: dict[str, Tensor],
                      prefix: str = "adam") -> None:
    """Inverse of :func:`adam_tensors`. Parameters without saved state keep none."""
    params = [p for g in opt.param_groups for p in g["params"]]
    for name, p in zip(names, params):
        if f"{prefix}.{name}.exp_avg" in tensors:
            opt.state[p] = {"step": tensors[f"{prefix}.{name}.step"].reshape(()).clone(),
                            "exp_avg": tensors[f"{prefix}.{name}.exp_avg"].to(p.device),
                            "exp_avg_sq": tensors[f"{prefix}.{name}.exp_avg_sq"].to(p.device)}


__all__ = ["TrainingRun", "CheckpointError", "write_checkpoint", "read_checkpoint", "checkpoint_paths",
           "data_fingerprint", "check_same_data", "adam_tensors", "load_adam_tensors", "progress"]
