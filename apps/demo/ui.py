"""The Gradio page: the live player and the demo's controls.

The player is an iframe of ``apps/web/player.html``. Gradio's own streaming video goes through HLS segments,
with seconds of delay. So the picture is our WebSocket player. It draws JPEG frames on a canvas as they arrive.
It schedules returned audio by pts. The controls talk to it in two ways:

- in the browser, through the player's ``window.fg``, same origin. ``prepare`` runs inside the click: it
  unlocks audio and starts a session while the clip is being made. ``feed(url)`` streams a clip in real time.
  There are also ``interrupt`` and ``config({state})``.
- on the server, through the relay, :mod:`.relay`. The readout gets the take's live ``stats``. ``finish_take``
  gives the MP4.

The API, for ``gradio_client``:

- ``/take``: text or an audio file → a recorded take. It streams through a fresh session in real time. It
  returns the MP4 and a summary.
- ``/speak`` and ``/load_file``: a clip for the page's player.
- ``/stop_take``: the page's live take → its MP4. A warning when there is none.
"""
from __future__ import annotations

import asyncio
import html
from types import SimpleNamespace

import gradio as gr
import numpy as np

from framegraph.apps.client import ClientError, stream_session
from framegraph.models.avatar.base import STATE_MODES

from . import clips
from .context import STATE_OPTION, DemoContext, portraits

CSS = """
#fg-player iframe { width: 100%; height: 620px; border: 0; border-radius: 8px; background: #111; display: block; }
#fg-readout { font-family: ui-monospace, monospace; font-size: 12.5px; }
"""

NO_TAKE = "No take recorded yet: start one (microphone, Speak or Play) first."

# JavaScript run in the Gradio page. The player is a same-origin iframe; its window.fg is the API.
_PLAYER = "document.querySelector('#fg-player iframe')?.contentWindow?.fg"
JS_PREPARE = f"(...args) => {{ {_PLAYER}?.prepare(); return args; }}"
JS_FEED = f"(url) => {{ if (url) {_PLAYER}?.feed(new URL(url, location.href).href); }}"
JS_INTERRUPT = f"() => {{ {_PLAYER}?.interrupt(); }}"
JS_STATE = f"(state) => {{ {_PLAYER}?.config({{ {STATE_OPTION}: state }}); }}"


def player_html(ctx: DemoContext, tab: str, portrait: str | None = None) -> str:
    src = html.escape(ctx.player_src(tab, portrait), quote=True)
    return (f'<iframe src="{src}" allow="microphone; autoplay" title="framegraph live player" '
            f'data-tab="{tab}"></iframe>')


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def _readout(take_summary: dict | None, ctx: DemoContext) -> str:
    if take_summary is None:
        return f"`{ctx.choice.name}` · no take running"
    s = take_summary
    e2e = s.get("end_to_end_ms") or {}
    dropped = s.get("dropped") or {}
    fps = s.get("server_fps")
    lines = [f"`{s['pipeline'] or ctx.choice.name}` · take {s['take']} · "
             f"{'live' if s['live'] else 'ended (' + str(s['ended']) + ')'} · {s['seconds']:.0f} s",
             f"server: **{fps if fps is not None else '-'} fps** sent · graph latency p50 "
             f"{e2e.get('p50', '-')} / p95 {e2e.get('p95', '-')} ms · first frame "
             f"{_ms(s.get('time_to_first_frame_ms'))} ms",
             f"dropped: {dropped.get('video', 0)} video, {dropped.get('source', 0)} at the source · "
             f"{s['frames_relayed']} frames relayed"]
    if s["errors"]:
        lines.append("errors: " + "; ".join(s["errors"]))
    return "  \n".join(lines)


def build_blocks(ctx: DemoContext) -> gr.Blocks:
    """The demo's Gradio page: the layout and its events, wired to the handlers.

    See :func:`_layout`, :func:`_wire` and :func:`_handlers`."""
    voice_list = clips.voices()
    portrait_list = portraits()
    handlers = _handlers(ctx)
    with gr.Blocks(title="framegraph live demo", analytics_enabled=False, fill_width=True) as blocks:
        ui = _layout(ctx, voice_list, portrait_list)
        _wire(blocks, ui, handlers)
    return blocks


def _handlers(ctx: DemoContext) -> SimpleNamespace:
    """The page's event handlers, by name.

    They cover the player per tab: load, unload, portrait. They cover the clips for the page's player:
    ``speak``, ``load_file``. They cover the take: ``stop_take`` and the readout's ``refresh``. And the API's
    ``take``."""
    choice = ctx.choice

    def on_load(request: gr.Request):
        tab = ctx.tab_for(request.session_hash)
        return player_html(ctx, tab)

    def on_unload(request: gr.Request):
        tab = ctx.tab_by_session.pop(request.session_hash or "-", None)
        if tab is not None:
            ctx.relay.forget_tab(tab)

    def change_portrait(portrait: str, request: gr.Request):
        return player_html(ctx, ctx.tab_for(request.session_hash), portrait)  # a new player, a new session

    def speak(text: str, voice: str) -> str:
        """Speak ``text`` with eSpeak NG. Returns the clip's URL for the player, relative to the page."""
        try:
            samples = clips.speak(text, voice)
        except clips.ClipError as exc:
            raise gr.Error(str(exc)) from None
        return f"fg/clip/{ctx.clips.put(samples)}"

    def load_file(path: str | None) -> str:
        """Decode an audio file to 16 kHz PCM. Returns the clip's URL for the player."""
        try:
            samples = clips.load(path)
        except clips.ClipError as exc:
            raise gr.Error(str(exc)) from None
        return f"fg/clip/{ctx.clips.put(samples)}"

    async def stop_take(request: gr.Request):
        """End this page's live take and return its MP4: what the player showed, with its audio.

        With no take yet, it shows a warning in the page, :data:`NO_TAKE`, and returns nothing."""
        take = await ctx.relay.finish_take(ctx.tab_for(request.session_hash))
        if take is None:  # a message in the page (gr.Error would also print a traceback in the terminal)
            gr.Warning(NO_TAKE)
            return gr.skip(), gr.skip(), gr.skip()
        return take.saved, _readout(take.summary(), ctx), take.saved

    def refresh(shown: str | None, request: gr.Request):
        tab = ctx.relay.tab(ctx.tab_for(request.session_hash))
        take = tab.live or (tab.finished[-1] if tab.finished else None)
        text = _readout(take.summary() if take else None, ctx)
        newest = tab.finished[-1].saved if tab.finished else None
        if newest and newest != shown:  # a take ended by itself (Stop in the player): offer its MP4
            return text, newest, newest
        return text, gr.skip(), shown

    async def take(text: str, voice: str, audio_file: str | None, portrait: str):
        """A headless take: text or an audio file → a fresh session, streamed in real time → MP4."""
        try:
            samples = await asyncio.to_thread(lambda: clips.load(audio_file) if audio_file
                                              else clips.speak(text, voice))
        except clips.ClipError as exc:
            raise gr.Error(str(exc)) from None
        samples = np.concatenate([samples, np.zeros(clips.SAMPLE_RATE * 3 // 10, np.int16)])  # 0.3 s tail
        out = ctx.next_api_take_path()
        options = choice.start_options(ctx.config.video, portrait, ctx.config.runtime)
        session = stream_session(ctx.server_url, choice.name, options, audio=samples, out=out)
        try:  # on its own thread and event loop: the demo's loop keeps relaying the live players meanwhile
            summary = await asyncio.to_thread(asyncio.run, session)
        except ClientError as exc:
            raise gr.Error(str(exc)) from None
        brief = {k: summary[k] for k in ("pipeline", "session", "video_frames", "audio_messages_received",
                                         "time_to_first_frame_ms", "fps", "glass_to_glass", "server", "ended",
                                         "recorded_frames", "record_drops")}
        brief["audio_seconds"] = round(len(samples) / clips.SAMPLE_RATE, 3)
        brief["errors"] = [f"{e.get('code')}: {e.get('message')}" for e in summary["errors"]]
        return out, brief

    return SimpleNamespace(on_load=on_load, on_unload=on_unload, change_portrait=change_portrait, speak=speak,
                           load_file=load_file, stop_take=stop_take, refresh=refresh, take=take)


def _layout(ctx: DemoContext, voice_list: list[str], portrait_list: list[str]) -> SimpleNamespace:
    """The page's components, made inside its ``gr.Blocks``, returned by name.

    They are the player and readout, the controls, and the hidden ones the events pass values through."""
    choice = ctx.choice
    gr.Markdown("## framegraph · live demo\nSpeak into the microphone, type text, or play a file: the "
                "picture comes back over a WebSocket at sub-second delay (the readout on the picture "
                "measures it), and every take is recorded to MP4.")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=420):
            player = gr.HTML("<p>starting the player…</p>", elem_id="fg-player", js_on_load=None)
            readout = gr.Markdown(_readout(None, ctx), elem_id="fg-readout", label="readout")
        with gr.Column(scale=2, min_width=320):
            gr.Markdown(choice.note, elem_id="fg-pipeline-note")
            with gr.Tab("Say text"):
                text = gr.Textbox(label="text (spoken by eSpeak NG)", lines=3,
                                  value="Hello! I am a real-time avatar, streamed at sub-second latency.",
                                  elem_id="fg-text")
                voice = gr.Dropdown(voice_list, value=voice_list[0], label="voice", elem_id="fg-voice")
                speak_btn = gr.Button("Speak", variant="primary", elem_id="fg-speak")
            with gr.Tab("Play a file"):
                audio_file = gr.Audio(sources=["upload"], type="filepath", label="audio file",
                                      elem_id="fg-audio-file")
                play_btn = gr.Button("Play into the take", variant="primary", elem_id="fg-play-file")
            portrait = gr.Dropdown(portrait_list, value=portrait_list[0], label="portrait / avatar",
                                   interactive=choice.avatar, elem_id="fg-portrait")
            state = gr.Radio(list(STATE_MODES), value="auto", label="state (auto: from voice activity)",
                             interactive=choice.avatar, elem_id="fg-state",
                             info=None if choice.avatar else f"the {choice.name} pipeline has no state")
            with gr.Row():
                interrupt_btn = gr.Button("Interrupt", variant="stop", elem_id="fg-interrupt")
                stop_btn = gr.Button("Stop take → MP4", elem_id="fg-stop")
            take_file = gr.File(label="take (MP4)", interactive=False, elem_id="fg-take")
    clip_url = gr.Textbox(visible=False, label="clip_url")
    shown = gr.State(None)
    take_summary = gr.JSON(visible=False, label="summary")
    api_take_btn = gr.Button(visible=False)
    timer = gr.Timer(1.0)
    return SimpleNamespace(player=player, readout=readout, text=text, voice=voice, speak_btn=speak_btn,
                           audio_file=audio_file, play_btn=play_btn, portrait=portrait, state=state,
                           interrupt_btn=interrupt_btn, stop_btn=stop_btn, take_file=take_file, clip_url=clip_url,
                           shown=shown, take_summary=take_summary, api_take_btn=api_take_btn, timer=timer)


def _wire(blocks: gr.Blocks, ui: SimpleNamespace, h: SimpleNamespace) -> None:
    """The page's events: each control of ``ui`` to its handler in ``h``, or to the player's JavaScript."""
    blocks.load(h.on_load, outputs=ui.player, api_visibility="private")
    blocks.unload(h.on_unload)
    ui.portrait.change(h.change_portrait, inputs=ui.portrait, outputs=ui.player, api_visibility="private")
    ui.speak_btn.click(h.speak, inputs=[ui.text, ui.voice], outputs=ui.clip_url, js=JS_PREPARE, api_name="speak",
                       concurrency_limit=None).success(None, inputs=ui.clip_url, js=JS_FEED)
    ui.play_btn.click(h.load_file, inputs=ui.audio_file, outputs=ui.clip_url, js=JS_PREPARE, api_name="load_file",
                      concurrency_limit=None).success(None, inputs=ui.clip_url, js=JS_FEED)
    ui.interrupt_btn.click(None, js=JS_INTERRUPT)
    ui.state.change(None, inputs=ui.state, js=JS_STATE)
    ui.stop_btn.click(h.stop_take, outputs=[ui.take_file, ui.readout, ui.shown], api_name="stop_take",
                      concurrency_limit=None)
    ui.timer.tick(h.refresh, inputs=ui.shown, outputs=[ui.readout, ui.take_file, ui.shown], api_visibility="private",
                  concurrency_limit=None, show_progress="hidden")
    ui.api_take_btn.click(h.take, inputs=[ui.text, ui.voice, ui.audio_file, ui.portrait],
                          outputs=[ui.take_file, ui.take_summary], api_name="take", concurrency_limit=None)
