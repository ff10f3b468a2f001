"""The NeRF model's command-line options without torch: :func:`add_model_arguments`, the sizes' defaults per device
(:data:`DEVICE_DEFAULTS`) and :func:`resolve_defaults`. The fronts of ``framegraph fit-nerf`` and ``bench nerf_fit``
import it for their ``--help``, which then loads no torch (a module inside ``renderers/nerf/`` would load the
package, and torch with it); ``nerf/cli.py`` builds the model's config from the options.
"""
from __future__ import annotations

import argparse

# Default sizes per device. CUDA keeps instant-ngp's; the CPU ones were chosen by measurement on a real capture
# at --downscale 8 (``framegraph bench nerf_fit``, benchmarks/results/cpu/nerf_fit_fox.json): fewer levels, a
# smaller table and finest grid (images of ~240 px do not resolve more), a 64^3 occupancy grid (a full warm-up
# update is 262k density queries instead of 2M) and 128 steps across the box diagonal; the occupancy EMA
# decays faster (0.8 per update instead of 0.95) so that, in a fit of ~1000 steps rather than instant-ngp's
# 30k, cells the density has left empty are skipped after a few updates rather than after ~30.
DEVICE_DEFAULTS = {
    "cuda": {"steps": 2000, "batch_rays": 4096, "levels": 16, "log2_table": 19, "finest": 2048, "occupancy": 128,
             "steps_per_diagonal": 512, "occupancy_decay": 0.95},
    "cpu": {"steps": 400, "batch_rays": 2048, "levels": 8, "log2_table": 17, "finest": 256, "occupancy": 64,
            "steps_per_diagonal": 192, "occupancy_decay": 0.8},
}


def device_defaults(device) -> dict:
    """The default sizes of :data:`DEVICE_DEFAULTS` for ``device`` (``"cuda"`` for any CUDA device, else CPU)."""
    return dict(DEVICE_DEFAULTS["cuda" if str(device).split(":")[0] == "cuda" else "cpu"])


def resolve_defaults(args: argparse.Namespace, device) -> argparse.Namespace:
    """Fill the options left unset (None) with ``device``'s defaults, in place; returns ``args``."""
    for key, value in device_defaults(device).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def per_device_help(key: str) -> str:
    cpu, cuda = DEVICE_DEFAULTS["cpu"][key], DEVICE_DEFAULTS["cuda"][key]
    return f"default {cpu} on CPU, {cuda} on CUDA"


def add_model_arguments(p: argparse.ArgumentParser, *, levels: int | None = None, log2_table: int | None = None,
                        finest: int | None = None, occupancy: int | None = None,
                        steps_per_diagonal: int | None = None) -> None:
    """The model's size options (hash grid, occupancy grid, marching step), read back by :func:`config_from_args`.

    A default given here is fixed; one left None is the device's (:func:`resolve_defaults`, run by the command)."""

    def helptext(what: str, key: str, value) -> str:
        return f"{what} (default {value})" if value is not None else f"{what} ({per_device_help(key)})"

    p.add_argument("--levels", type=int, default=levels, help=helptext("hash grid levels", "levels", levels))
    p.add_argument("--log2-table", type=int, default=log2_table,
                   help=helptext("log2 entries per hashed level", "log2_table", log2_table))
    p.add_argument("--finest", type=int, default=finest,
                   help=helptext("finest grid resolution", "finest", finest))
    p.add_argument("--occupancy", type=int, default=occupancy,
                   help=helptext("occupancy grid resolution", "occupancy", occupancy))
    p.add_argument("--steps-per-diagonal", type=int, default=steps_per_diagonal,
                   help=helptext("marching steps across the box diagonal", "steps_per_diagonal", steps_per_diagonal))
