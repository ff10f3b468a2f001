"""What the demo's parts share: its configuration, the pipeline it runs, and the per-process context.

The Gradio handlers, :mod:`.ui`, and the routes, :mod:`.app`, both use that context."""
from __future__ import annotations

import io
import json
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from urllib.parse import urlencode

from PIL import Image

from framegraph import assets
from framegraph.apps.bundles import available_avatars, default_avatar, load_bundle
from framegraph.apps.server import pipelines
from framegraph.apps.server.protocol import ProtocolError

from .clips import ClipStore
from .config import DemoConfig
from .relay import Relay

log = logging.getLogger("framegraph.demo")

PORTRAITS_DIR = str(assets.path("portraits"))
DEFAULT_PORTRAIT = "astronaut"
# The avatar pipeline's options the demo sets: start option PORTRAIT_OPTION (an avatar bundle's name in the
# server's avatar folder, sent only when it is not the default) and live option STATE_OPTION (``config``).
PORTRAIT_OPTION = "avatar"
STATE_OPTION = "state"


@dataclass
class PipelineChoice:
    """The pipeline the demo runs, and what the page says about it."""

    name: str
    note: str
    avatar: bool  # takes a portrait and the speaking / listening / idle state

    def start_options(self, video: dict, portrait: str | None = None, runtime: str = "torch") -> dict:
        options = dict(video)
        if self.avatar and runtime != "torch":
            options["runtime"] = runtime
        if not self.avatar and "size" not in options:
            options["size"] = "320x240"  # the scope: small and cheap on a CPU
        if self.avatar and portrait and portrait != DEFAULT_PORTRAIT:
            options[PORTRAIT_OPTION] = portrait
        return options

    def warm_up(self) -> None:
        """Load what the first session would otherwise wait for.

        That is the avatar's default bundle, shared by every session. It is most of a cold first frame's
        delay."""
        if self.name == "avatar":
            try:
                load_bundle(default_avatar())
            except Exception as exc:  # noqa: BLE001 - the first session reports it to the page
                log.warning("the avatar could not be loaded ahead of the first take: %s", exc)


def pipeline_available(name: str) -> tuple[bool, str]:
    """Whether the server can run ``name``, and why not.

    The reason says what fixes it, since the demo runs on this machine."""
    try:
        spec = pipelines.spec(name)
    except ProtocolError:
        return False, f"no {name!r} pipeline on this server"
    why = spec.unavailable() if spec.unavailable is not None else None
    return (True, "") if why is None else (False, f"{why.fix}")


def choose_pipeline(requested: str = "auto") -> PipelineChoice:
    """Pick the pipeline the demo runs.

    ``auto`` picks the avatar when it is available, else the microphone scope. A note says which runs and why. A
    named pipeline must be available."""
    if requested == "auto":
        ok, why = pipeline_available("avatar")
        if ok:
            return PipelineChoice("avatar", "Pipeline **avatar**: the talking portrait, driven by the audio "
                                            "you stream.", True)
        return PipelineChoice("scope", f"Pipeline **scope** (fallback): {why}, so the live picture is the "
                                       f"audio scope (waveform + level) instead of a talking portrait. Portrait "
                                       f"and state have no effect on it.", False)
    ok, why = pipeline_available(requested)
    if not ok:
        raise ValueError(f"pipeline {requested!r} is not available: {why}; this server has "
                         f"{sorted(pipelines.available())}")
    avatar = requested == "avatar"
    return PipelineChoice(requested, f"Pipeline **{requested}** (chosen with --pipeline).", avatar)


def portraits() -> list[str]:
    """The names the avatar picker offers, the default first.

    They are the server's avatar bundles, from ``$FRAMEGRAPH_AVATARS`` or assets/avatars. Still portraits and
    video avatars made with ``framegraph avatar train --video`` count alike. Without any bundle, they are the
    portraits shipped in assets/portraits."""
    bundles = available_avatars()
    if bundles:
        return bundles  # the default first
    try:
        names = sorted({os.path.splitext(f)[0] for f in os.listdir(PORTRAITS_DIR)
                        if f.lower().endswith((".png", ".jpg", ".jpeg"))})
    except FileNotFoundError:
        names = []
    return [DEFAULT_PORTRAIT] + [n for n in names if n != DEFAULT_PORTRAIT]


class DemoContext:
    """What the Gradio handlers and the routes share: the server, the relay, the clips, the choice."""

    def __init__(self, config: DemoConfig, server_url: str, choice: PipelineChoice):
        self.config = config
        self.server_url = server_url
        self.choice = choice
        self.takes_dir = config.takes_dir or tempfile.mkdtemp(prefix="framegraph-demo-")
        self.relay = Relay(server_url, self.takes_dir, bind_host=config.host)
        self.clips = ClipStore()
        self.tab_by_session: dict[str, str] = {}
        self.api_takes = 0
        self.idle_faces: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def tab_for(self, session_hash: str | None) -> str:
        """The relay tab of one Gradio page, by its session hash. Made on first use."""
        key = session_hash or "-"
        with self._lock:
            tab = self.tab_by_session.get(key)
            if tab is None or self.relay.tab(tab) is None:
                tab = self.tab_by_session[key] = self.relay.new_tab()
            return tab

    def player_src(self, tab: str, portrait: str | None = None) -> str:
        """The player iframe's URL for ``tab``, relative to the Gradio page."""
        query = {"url": f"ws?tab={tab}", "pipeline": self.choice.name,
                 "options": json.dumps(self.choice.start_options(self.config.video, portrait,
                                                                                 self.config.runtime))}
        if self.choice.name == "avatar":
            query["poster"] = f"idle/{portrait or DEFAULT_PORTRAIT}.png"
        if self.config.transport != "webrtc":
            query["transport"] = self.config.transport
        return "fg/player.html?" + urlencode(query)

    def idle_face_png(self, portrait: str) -> bytes | None:
        """PNG of the avatar ``portrait`` at rest. None when the server has no such avatar.

        It is its bundle's portrait, the picture its frames are drawn into."""
        if self.choice.name != "avatar":
            return None
        if portrait not in available_avatars():
            return None
        with self._lock:
            if portrait not in self.idle_faces:
                buf = io.BytesIO()
                Image.fromarray(load_bundle(portrait).portrait.numpy()).save(buf, format="PNG")
                self.idle_faces[portrait] = buf.getvalue()
            return self.idle_faces[portrait]

    def next_api_take_path(self) -> str:
        with self._lock:
            self.api_takes += 1
            n = self.api_takes
        old = os.path.join(self.takes_dir, f"api-take-{n - 4}.mp4")  # Gradio has served it from its cache
        if os.path.exists(old):
            os.remove(old)
        return os.path.join(self.takes_dir, f"api-take-{n}.mp4")
