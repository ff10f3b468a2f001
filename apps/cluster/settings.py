"""Everything ``framegraph cluster`` can set, in one dataclass shared by the front door and the replicas."""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from framegraph.apps.server.config import is_loopback


@dataclass
class ClusterSettings:
    """How the cluster is laid out and how its parts behave.

    Attributes:
        host / port: where the front door listens. Clients connect to ``ws://host:port/ws``.
        token: required from clients at the front door when set. Mandatory off loopback.
        replicas: fixed replica count when ``max_replicas`` is None. Else the starting count.
        min_replicas / max_replicas: autoscaling bounds on live sessions. Both None: no autoscaling.
        sessions_per_replica: capacity of one replica: a GPU, or ``cpus_per_replica`` cores on CPU.
        target_fill: autoscaling aims at this fraction of the replicas' capacity in use.
        cpus_per_replica / gpus_per_replica: Ray resources each replica claims.
        max_bundles: avatar bundles a replica keeps loaded. The least recently used ones beyond it go.
        drain_grace_s: on scale-down, how long a replica's sessions may run on before they are closed.
            They close with code 1001 and a reason.
        heartbeat_s: how often a replica reports its state to the front door.
        dead_after_s: a replica not heard from for this long gets no new sessions.
            One late by more than two heartbeats is probed first. A dead process refuses at once.
        stats_interval_s: the replicas' per-session ``stats`` period, as for ``framegraph serve``.
        allowed_origins: browser origins allowed besides the front door's own.
        batching: each replica's ``ServerConfig.batching``. A replica whose model is full sends a session on.
        secret: signs admission tickets. It is generated per cluster and never sent to clients.
    """

    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None
    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    sessions_per_replica: int = 3
    target_fill: float = 0.75
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    max_bundles: int = 4
    drain_grace_s: float = 30.0
    heartbeat_s: float = 0.25
    dead_after_s: float = 5.0
    stats_interval_s: float = 1.0
    allowed_origins: tuple[str, ...] = ()
    batching: bool = False
    secret: str = field(default_factory=lambda: secrets.token_hex(16))

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas is not None

    def validate(self) -> None:
        """Refuse impossible or unsafe settings with a sentence that says what to change."""
        if not is_loopback(self.host) and not self.token:
            raise ValueError(f"binding {self.host!r} exposes the cluster beyond this machine: set a token "
                             f"(--token or FRAMEGRAPH_TOKEN), or bind 127.0.0.1")
        if self.replicas < 1 or self.sessions_per_replica < 1 or self.max_bundles < 1:
            raise ValueError("replicas, sessions per replica and bundles per replica must be at least 1")
        if self.autoscaling:
            lo = self.min_replicas if self.min_replicas is not None else 1
            if not 1 <= lo <= self.max_replicas:
                raise ValueError(f"autoscaling needs 1 <= min_replicas <= max_replicas, got {lo} and "
                                 f"{self.max_replicas}")
            if not lo <= self.replicas <= self.max_replicas:
                raise ValueError(f"the starting replica count {self.replicas} is outside [{lo}, {self.max_replicas}]")
        if not 0 < self.target_fill <= 1:
            raise ValueError(f"target_fill must be in (0, 1], got {self.target_fill}")
        for name in ("drain_grace_s", "heartbeat_s", "dead_after_s", "stats_interval_s", "cpus_per_replica"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.gpus_per_replica < 0:
            raise ValueError(f"gpus_per_replica must be >= 0, got {self.gpus_per_replica}")
