"""The NeRF model's command-line options, without torch.

It holds :func:`add_model_arguments`, the per-device default sizes (:data:`DEVICE_DEFAULTS`) and
:func:`resolve_defaults`. The fronts of ``framegraph fit-nerf`` and ``bench nerf_fit`` import it for their
``--help``. That ``--help`` then loads no torch. A module inside ``renderers/nerf/`` would load the package, and
torch with it. ``nerf/cli.py`` builds the model's config from the options.
"""
from __future__ import annotations

import argparse

# Default sizes per device. CUDA keeps instant-ngp's. The CPU ones are smaller: fewer levels, a smaller table
# and finest grid, a 64^3 occupancy grid, fewer steps across the box diagonal and a faster occupancy EMA decay.
# docs/renderers.md says why.
DEVICE_DEFAULTS = {
    "cuda": {"steps": 2000, "batch_rays": 4096, "levels": 16, "log2_table": 19, "finest": 2048, "occupancy": 128,
             "steps_per_diagonal": 512, "occupancy_decay": 0.95},
    "cpu": {"steps": 400, "batch_rays": 2048, "levels": 8, "log2_table": 17, "finest": 256, "occupancy": 64,
            "steps_per_diagonal": 192, "occupancy_decay": 0.8},
}


def device_defaults(device) -> dict:
    """The default sizes of :data:`DEVICE_DEFAULTS` for ``device``. Any CUDA device gets ``"cuda"``, else CPU."""
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
    """The model's size options: hash grid, occupancy grid, marching step. :func:`config_from_args` reads them.

    A default given here is fixed. One left None is the device's; the command runs :func:`resolve_defaults`."""

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
