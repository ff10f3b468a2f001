"""``framegraph bench scene_avatar``: the talking avatar inside a 3D scene. It runs each branch alone and the composite.
It records FPS, per-branch work p50 and the first frame."""
from __future__ import annotations

from framegraph.apps.argtypes import SIZE_LIMIT, placement, positive_float, positive_int, video_size

from . import add_out_argument

IMPLEMENTATION = "framegraph.apps.bench.scene_avatar"  # its run(args) and figure(data, plt)
DEFAULT_PLACE = (-0.6, -0.8, 0.0)  # the toy scene's free ground in front of the box and the big ball


def add_arguments(p) -> None:
    add_out_argument(p)
    p.add_argument("--scene", default=None, help="the scene (default: the shipped assets/scenes/toy.ply)")
    p.add_argument("--avatar", default=None, help="the avatar bundle (default: the shipped assets/avatars/astronaut)")
    p.add_argument("--place", type=placement, default=DEFAULT_PLACE, metavar="X,Y,Z[,YAW,HEIGHT]",
                   help="where the avatar stands (default -0.6,-0.8,0 in the toy scene; write --place=-1,0,0 for a "
                        "value that starts with a minus)")
    p.add_argument("--size", type=video_size, default=(320, 180),
                   help=f"the scene's WIDTHxHEIGHT (default 320x180; {SIZE_LIMIT})")
    p.add_argument("--seconds", type=positive_float, default=6.0, help="seconds of speech per run (default 6)")
    p.add_argument("--device", default=None, help="where the scene renders (default: cuda when available)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch CPU threads per process (default 1 on CPU: each branch has its own worker thread, "
                        "so the two branches use two cores)")
    p.add_argument("--quick", action="store_true", help="tiny run (a smoke test, not a measurement)")
