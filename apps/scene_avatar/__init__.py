"""A talking avatar inside a live 3D scene: one graph, two branches on one clock. See :mod:`.graph`."""
from .graph import SceneAvatarGraph, build_scene_avatar_graph, check_place, placement_from, render_scene_avatar

__all__ = ["SceneAvatarGraph", "build_scene_avatar_graph", "check_place", "placement_from", "render_scene_avatar"]
