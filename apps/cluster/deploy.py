"""Deploy framegraph as a Ray Serve application: a front door and N replicas. The command is ``framegraph cluster``.

    cluster = start_cluster(ClusterSettings(replicas=2))   # a local Ray cluster (or address="auto")
    print(cluster.url)                                      # ws://127.0.0.1:8765/ws, as framegraph serve
    cluster.view(); cluster.metrics(); cluster.stop()

The application :data:`APP` has two deployments:

- ``gateway``: the front door, :mod:`.gateway`. One replica, no CPU claimed.
- ``replica``: ``cpus_per_replica`` and ``gpus_per_replica`` each. On a GPU cluster, one per GPU.
  The count is fixed, or autoscaled on live sessions with :mod:`.scaling`.

Serve restarts a replica whose process dies. Health checks run every second.
On scale-down, Serve gives the stopping replica the drain grace plus a margin before it is killed.
"""
from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.request

from ray import serve

from .gateway import Gateway
from .replica import Replica
from .scaling import SessionPolicy
from .settings import ClusterSettings

APP = "framegraph"
STOP_MARGIN_S = 15.0  # beyond the drain grace, before Serve kills a stopping replica


def application(settings: ClusterSettings):
    """The Serve application of ``settings``."""
    from ray import serve  # optional: framegraph[cluster]

    gateway = serve.deployment(Gateway, name="gateway", num_replicas=1, max_ongoing_requests=1000,
                               ray_actor_options={"num_cpus": 0})
    options = dict(name="replica", max_ongoing_requests=100,
                   ray_actor_options={"num_cpus": settings.cpus_per_replica, "num_gpus": settings.gpus_per_replica},
                   graceful_shutdown_wait_loop_s=0.2,
                   graceful_shutdown_timeout_s=settings.drain_grace_s + STOP_MARGIN_S,
                   health_check_period_s=1.0, health_check_timeout_s=10.0)
    if settings.autoscaling:
        options["autoscaling_config"] = {
            "min_replicas": settings.min_replicas or 1, "max_replicas": settings.max_replicas,
            "initial_replicas": settings.replicas, "metrics_interval_s": 0.5, "look_back_period_s": 1.0,
            "upscale_delay_s": 0.0, "downscale_delay_s": 2.0,
            "policy": {"policy_function": SessionPolicy,
                       "policy_kwargs": {"sessions_per_replica": settings.sessions_per_replica,
                                         "target_fill": settings.target_fill}}}
    else:
        options["num_replicas"] = settings.replicas
    return serve.deployment(Replica, **options).bind(gateway.bind(settings), settings)


class Cluster:
    """A deployed cluster, seen from the process that deployed it."""

    def __init__(self, settings: ClusterSettings, gateway, url: str, own_ray: bool):
        self.settings, self.gateway, self.url, self._own_ray = settings, gateway, url, own_ray

    @property
    def http_url(self) -> str:
        return self.url.replace("ws://", "http://", 1).removesuffix("/ws") + "/"

    def view(self) -> dict:
        """The front door's view, ``GET /cluster``: every replica's state."""
        return json.loads(self._get("cluster"))

    def live(self) -> list[dict]:
        return [r for r in self.view()["replicas"] if r["alive"] and not r["draining"]]

    def wait_for_replicas(self, n: int, timeout_s: float = 120.0) -> list[dict]:
        """Wait until ``n`` replicas report in alive and not draining. Others may still be stopping."""
        deadline = time.monotonic() + timeout_s
        while True:
            live = self.live()
            if len(live) >= n:
                return live
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(live)} of {n} replicas up after {timeout_s:g} s: {self.view()}")
            time.sleep(0.2)

    def metrics(self) -> str:
        """The cluster's Prometheus text, ``GET /metrics``."""
        return self._get("metrics")

    def _get(self, path: str) -> str:
        headers = {"Authorization": f"Bearer {self.settings.token}"} if self.settings.token else {}
        with urllib.request.urlopen(urllib.request.Request(self.http_url + path, headers=headers), timeout=10) as r:
            return r.read().decode()

    def stop(self) -> None:
        """Delete the application, and stop Ray if we started it. Replicas drain with the settings' grace."""
        import ray  # optional: framegraph[cluster]

        serve.delete(APP)
        if self._own_ray:
            serve.shutdown()
            ray.shutdown()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_cluster(settings: ClusterSettings, address: str | None = None, *, num_cpus: int | None = None,
                  wait_s: float = 180.0) -> Cluster:
    """Deploy on a Ray cluster and wait until the starting replicas report in.

    With ``address`` it uses the Ray cluster there.
    ``"auto"`` is the one ``ray start --head`` started here.
    Without it, it starts a new local one. ``num_cpus`` is its size, by default the machine's.
    """
    import ray  # optional: framegraph[cluster]

    settings.validate()
    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(address=address, num_cpus=None if address else num_cpus, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    serve.start(proxy_location="Disabled")  # the front door listens itself; no Serve HTTP proxy
    serve.run(application(settings), name=APP, route_prefix=None, blocking=False)
    gateway = serve.get_deployment_handle("gateway", app_name=APP)
    url = None
    deadline = time.monotonic() + wait_s
    while url is None:
        try:
            url = _off_loop(lambda: gateway.view.remote().result(timeout_s=5))["url"]
        except Exception:  # noqa: BLE001 - the front door is still starting
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    cluster = Cluster(settings, gateway, url, own_ray)
    cluster.wait_for_replicas(settings.replicas, timeout_s=max(1.0, deadline - time.monotonic()))
    return cluster


def _off_loop(call):
    """``call()`` on a short-lived thread.

    Serve's blocking ``.result()`` refuses to run on a thread that has an asyncio loop running.
    Examples are a Jupyter cell and Playwright's sync API. The caller may be one.
    """
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def describe(view: dict) -> str:
    """One line per replica, for the CLI."""
    lines = []
    for r in view["replicas"]:
        lines.append(json.dumps({k: r[k] for k in ("id", "url", "sessions", "capacity", "alive", "draining", "pid")}))
    return "\n".join(lines)
