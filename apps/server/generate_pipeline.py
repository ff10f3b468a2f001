"""The ``generate`` pipeline: a causal video diffusion model (Wan 2.1 or SANA-Video) streamed live, endlessly.

    input "noise":  noise chunks (NoiseSource, at the video's pace) → CausalDenoiser → CausalVAEDecode → encode → send
    input "camera": client JPEGs → camera (CameraInput's PushSource, session size) → VAEEncode → CausalDenoiser
                    (video-to-video at ``strength``) → CausalVAEDecode → encode → send

With ``input: "camera"`` (StreamDiffusionV2-style live restyle) the client's camera pictures are the input
video: ``ready.video_in`` says what to send (:mod:`.camera`), ``strength`` (required; the meaning of
``framegraph generate --strength``, :data:`~framegraph.models.generate.STRENGTH_MEANING`) how much of it to change.
The stream is paced by the pictures: nothing is generated until the first one arrives (the session waits; no
noise or black input is made up), a chunk goes out once its pictures are in (``1 + 4 (F - 1)`` for the first,
``4 F`` after: ``ready.video_in.pictures_per_chunk``), and when pictures stop the stream pauses. A chunk's
frames leave the decoder at once; the session's video outbox holds a whole chunk (``Pipeline.video_burst``).

Models are found by *name* in the server's model folder, ``$FRAMEGRAPH_MODELS`` (diffusers folders as
``framegraph generate --model`` takes them; a client never sends a path). Options: ``model`` (default: the
folder's first model in name order), ``prompt`` (text; needs the model's text encoder) or ``prompt_embeds``
(the name of a ``.safetensors`` file in the model folder), ``timesteps`` (list, default
``[1000, 750, 500, 250]``), ``shift`` (flow shift they are warped with, default 5), ``chunk_frames``
(1–8, default 3), ``attention`` (Wan: ``sdpa`` | ``monarch``), ``backend`` (``torch`` | ``onnx``: the VAE
decoder on ONNX Runtime, CPU, from ``MODEL/onnx/vae_<H>x<W>_f<N>``, made by ``framegraph export --generate``;
a missing or stale export refuses the start),
``seed``, ``input`` (``noise`` | ``camera``), ``strength`` (with ``camera``: a number in (0, 1]), and the common
``size`` (multiples of 16) and ``fps`` (default the model's 16; with ``camera`` also the most pictures a second the
client may send).

Live (``config``): ``prompt`` or ``prompt_embeds`` — encoded at once (cached per prompt) and used from the
next chunk the denoiser starts; no restart. ``interrupt`` restarts the stream (empty past).
Loaded lazily (see ``pipelines.LAZY``), so diffusers' video models are imported on first use only.
"""
from __future__ import annotations

import os

import torch

from framegraph.models.generate import (
    STRENGTH_MEANING,
    build_generate_graph,
    check_strength,
    default_dtype,
    load_generate_model,
)
from framegraph.models.generate.onnx import default_wan_onnx_dir
from framegraph.models.runtime import default_runtime
from framegraph.stream import Clock

from .camera import CameraInput
from .pipelines import Options, Pipeline, add_video_out, register, video_options
from .protocol import ErrorCode, ProtocolError


def models_dir() -> str | None:
    """The server's model folder: ``$FRAMEGRAPH_MODELS`` (None when unset)."""
    return os.environ.get("FRAMEGRAPH_MODELS") or None


def _model_path(opts: Options) -> str:
    root = models_dir()
    if root is None or not os.path.isdir(root):
        raise ProtocolError(ErrorCode.BAD_OPTION, "generate: this server has no model folder; start it with "
                                                  "FRAMEGRAPH_MODELS=DIR (a folder of diffusers model folders)")
    names = sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, "model_index.json")))
    name = opts._get("model")
    if name is None and names:
        name = names[0]
    if name not in names:
        raise opts._bad("model", name, f"one of the server's models {names}")
    return os.path.join(root, name)


def _embeds_file(opts: Options, folder: str, value) -> str:
    path = os.path.join(folder, value) if isinstance(value, str) else None
    if path is None or os.path.basename(value) != value or not value.endswith(".safetensors") \
            or not os.path.isfile(path):
        files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
        raise opts._bad("prompt_embeds", value, f"the name of a .safetensors file in the model folder {files}")
    return path


def _timesteps(opts: Options) -> list[float]:
    value = opts._get("timesteps")
    if value is None:
        return [1000.0, 750.0, 500.0, 250.0]
    ok = isinstance(value, list) and 0 < len(value) <= 8 and all(
        isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t <= 1000 for t in value)
    if not ok or any(a <= b for a, b in zip(value, value[1:])):
        raise opts._bad("timesteps", value, "a strictly decreasing list of 1-8 numbers in (0, 1000]")
    return [float(t) for t in value]


def _strength(opts: Options, source: str) -> float | None:
    value = opts._get("strength")
    if source == "noise":
        if value is not None:
            raise opts._bad("strength", value, 'no strength with input "noise" (text-to-video starts from noise); '
                                               'strength goes with input "camera"')
        return None
    if value is None:
        raise opts._bad("strength", value, f'a strength with input "camera": {STRENGTH_MEANING}')
    try:
        return check_strength(value)
    except ValueError:
        raise opts._bad("strength", value, f"a number in (0, 1]: {STRENGTH_MEANING}") from None


def _prompt(opts: Options, folder: str) -> tuple[str | None, str | None]:
    text, embeds = opts._get("prompt"), opts._get("prompt_embeds")
    if text is not None and (not isinstance(text, str) or len(text) > 2000):
        raise opts._bad("prompt", text, "a string of at most 2000 characters")
    if text is not None and embeds is not None:
        raise opts._bad("prompt_embeds", embeds, "either prompt or prompt_embeds, not both")
    return text, (None if embeds is None else _embeds_file(opts, folder, embeds))


@register("generate", "a causal video diffusion model (Wan 2.1, SANA-Video) generating endlessly from a prompt "
                      "that can change live")
def build_generate(opts: Options) -> Pipeline:
    backend = opts.choice("backend", "torch", ("torch", "onnx"))  # where the VAE decoder computes
    device = "cuda" if torch.cuda.is_available() and backend == "torch" else "cpu"
    folder = _model_path(opts)
    try:
        gm = load_generate_model(folder, device=device, dtype=default_dtype(device))
    except (ValueError, OSError) as exc:
        raise ProtocolError(ErrorCode.BAD_OPTION, f"generate: model {os.path.basename(folder)!r}: {exc}") from None
    v = video_options(opts, size=(832, 480), fps=gm.fps)
    chunk_frames = opts.integer("chunk_frames", 3, 1, 8)
    timesteps = _timesteps(opts)
    shift = opts.number("shift", 5.0, 1.0, 20.0)
    seed = opts.integer("seed", 0, 0, 2**31 - 1)
    attention = opts.choice("attention", "sdpa", ("sdpa", "monarch"))
    text, embeds = _prompt(opts, folder)
    if text is None and embeds is None:
        raise opts._bad("prompt", None, "a prompt (or prompt_embeds) to start from")
    source = opts.choice("input", "noise", ("noise", "camera"))
    strength = _strength(opts, source)
    opts.done()
    options = {"attention": attention} if gm.family.name == "wan" else {}
    r = gm.vae.config.scale_factor_temporal  # a chunk is 1 + r (F - 1) video frames first, r F after
    camera = CameraInput(width=v.width, height=v.height, max_fps=v.fps,
                         pictures_per_chunk=(1 + r * (chunk_frames - 1), r * chunk_frames)) \
        if source == "camera" else None
    try:
        gg = build_generate_graph(gm, size=(v.height, v.width), chunks=None, prompt=text, prompt_embeds=embeds,
                                  chunk_frames=chunk_frames, timesteps=timesteps, shift=shift, seed=seed,
                                  device=device, source=None if camera is None else camera.source, strength=strength,
                                  clock=Clock("realtime"), fps=v.fps, source_in_flight=2,
                                  vae_runtime=default_runtime(device) if backend == "torch" else backend,
                                  denoiser_runtime=default_runtime(device),
                                  onnx_dir=default_wan_onnx_dir(folder, (v.height, v.width), chunk_frames), **options)
        gg.warm()  # the session's first chunk then costs what a steady one does (compiled: graphs built, cached)
    except (ValueError, OSError) as exc:
        raise ProtocolError(ErrorCode.BAD_OPTION, f"generate: {exc}") from None
    graph = gg.graph
    encoder, sink = add_video_out(graph, v)
    graph.connect(gg.decode, encoder, "video", capacity=8)  # a chunk's frames leave the decoder at once

    def configure(o: Options) -> dict:
        new_text, new_embeds = _prompt(o, folder)
        if new_text is None and new_embeds is None:
            return {}
        try:
            gg.denoiser.set_prompt(new_text, embeds_file=new_embeds)
        except (ValueError, OSError) as exc:
            raise ProtocolError(ErrorCode.BAD_OPTION, f"generate: {exc}") from None
        return {"prompt": new_text} if new_text is not None else {"prompt_embeds": os.path.basename(new_embeds)}

    return Pipeline(graph, sink, encoder=encoder, configure=configure, video_in=camera,
                    video_burst=r * chunk_frames,
                    format={"video": v.describe(), "audio_out": None, "audio_in": None, "pose_in": False,
                            "model": os.path.basename(folder), "family": gm.family.name, "input": source,
                            "strength": strength, "chunk_frames": chunk_frames, "timesteps": timesteps,
                            "device": device, "backend": backend})
