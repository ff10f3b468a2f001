"""Autoscaling on live sessions: the Ray Serve policy the replica deployment runs with.

Each replica reports its sessions: :meth:`~.replica.Replica.record_autoscaling_stats`.
The policy asks for ``ceil(total sessions / (sessions_per_replica × target_fill))`` replicas, within the bounds.
Serve then adds replicas, or stops some.
A stopped replica drains: :meth:`~.replica.Replica.drain`.
"""
from __future__ import annotations

import math


def wanted_replicas(sessions: float, sessions_per_replica: int, target_fill: float, lo: int, hi: int) -> int:
    """Replicas for ``sessions`` live sessions, so that each is about ``target_fill`` full, in [lo, hi]."""
    need = math.ceil(sessions / (sessions_per_replica * target_fill) - 1e-9) if sessions > 0 else lo
    return max(lo, min(hi, need))


class SessionPolicy:
    """Serve's ``policy_function``.

    It is a class. Serve builds it with ``policy_kwargs``.
    Serve calls it with its ``AutoscalingContext`` on every tick.
    It returns the replica count and the policy state.
    """

    def __init__(self, sessions_per_replica: int, target_fill: float):
        self.sessions_per_replica, self.target_fill = sessions_per_replica, target_fill

    def __call__(self, ctx) -> tuple[int, dict]:
        per_replica = (ctx.aggregated_metrics or {}).get("sessions", {})
        sessions = sum(per_replica.values())
        want = wanted_replicas(sessions, self.sessions_per_replica, self.target_fill,
                               ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas)
        return want, {"sessions": sessions}
