"""The ``generate`` pipeline: a causal video diffusion model, Wan 2.1 or SANA-Video, streamed live, endlessly.

The graph, by input::

    input "noise":  noise chunks (NoiseSource, at the video's pace) → CausalDenoiser → CausalVAEDecode → encode → send
    input "camera": client JPEGs → camera (CameraInput's PushSource, session size) → VAEEncode → CausalDenoiser
                    (video-to-video at ``strength``) → CausalVAEDecode → encode → send

``input: "camera"`` is a live restyle in the style of StreamDiffusionV2.
The client's camera pictures are the input video.
``ready.video_in`` says what to send. See :mod:`..camera`.
``strength`` is required. It says how much of the input to change.
The pictures pace the stream:

- Nothing is generated until the first picture arrives. The session waits.
  No noise or black input is made up.
- A chunk goes out once its pictures are in.
  That is ``1 + 4 (F - 1)`` for the first chunk and ``4 F`` after: ``ready.video_in.pictures_per_chunk``.
- When pictures stop, the stream pauses.

A chunk's frames leave the decoder at once.
The session's video outbox holds a whole chunk: ``Pipeline.video_burst``.

On a server with ``batching`` on, sessions of one model folder share one loaded model and its lane.
Each keeps its own past (:mod:`framegraph.models.generate.batch`). Wan with Monarch attention runs alone.

Models are found by *name* in the server's model folder, ``$FRAMEGRAPH_MODELS``.
They are diffusers folders, as ``framegraph generate --model`` takes them.
A client never sends a path. The options are :class:`GenerateOptions`.
Live ``config`` takes ``prompt`` or ``prompt_embeds``.
It is encoded at once, cached per prompt, and used from the next chunk the denoiser starts.
There is no restart.
``interrupt`` restarts the stream with an empty past.

Some refusals have the server as their cause.
Examples are a model that does not load, an ONNX export missing or stale, a text encoder that does not load.
Such a refusal tells the client what it may send instead.
The cause goes to the server's log, with paths and the command that fixes it.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from framegraph.apps.argtypes import VAE_RUNTIMES
from framegraph.models import runtime as models_runtime
from framegraph.models.runtime import default_device, default_runtime
from framegraph.stream import Clock
from framegraph.stream.batching import Full

from ..camera import CameraInput
from ..protocol import ErrorCode, ProtocolError
from .base import FULL_RETRY_S, ModelPool, Pipeline, PipelineSpec, Unavailable, add_video_out, model_service
from .options import (
    Choice,
    Decreasing,
    FileName,
    Integer,
    Number,
    Size,
    Text,
    VideoOptions,
    bad_option,
    option,
)

log = logging.getLogger("framegraph.server")
# loaded models, one per running session, kept for the next (a model holds its stream's state: never two sessions);
# batched sessions share one (MODELS.shared): their pasts are their own
MODELS = ModelPool()
STRENGTH = ("how much of the input video to change: the noise level it is taken to, in (0, 1] (small: close to the "
            "input; 1: nothing of it is kept)")


def models_dir() -> str | None:
    """The server's model folder: ``$FRAMEGRAPH_MODELS``. None when unset."""
    return os.environ.get("FRAMEGRAPH_MODELS") or None


def model_names() -> list[str]:
    """The diffusers folders, with a ``model_index.json``, in the server's model folder, in name order."""
    root = models_dir()
    if root is None or not os.path.isdir(root):
        return []
    return sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, "model_index.json")))


def unavailable() -> Unavailable | None:
    if model_names():
        return None
    return Unavailable("it has no video model (the server is started with FRAMEGRAPH_MODELS=DIR, a folder of "
                       "diffusers model folders, to have some)",
                       f"no diffusers model folder (with a model_index.json) in FRAMEGRAPH_MODELS={models_dir()!r}")


@dataclass
class GenerateOptions(VideoOptions):
    size: tuple[int, int] | None = option((832, 480), "the video's width and height: multiples of the model's tile "
                                                      "(16 for Wan 2.1 and SANA-Video)", Size())
    fps: float | None = option(None, "video frames a second (default: the model's, 16); with input camera also the "
                                     "most pictures a second the client may send", Number(1, 60))
    model: str | None = option(None, "the model to run, by name (default: the first)",
                               Choice(model_names, "one of the server's models"))
    prompt: str | None = option(None, "the text prompt (needs the model's text encoder)", Text(2000), live=True)
    prompt_embeds: str | None = option(None, "instead of prompt: precomputed prompt embeddings",
                                       FileName("the model folder", (".safetensors",)), live=True)
    timesteps: list[float] = option([1000.0, 750.0, 500.0, 250.0], "the few-step schedule, one model call each",
                                    Decreasing(1000, 8))
    shift: float = option(5.0, "the flow shift the timesteps are warped with", Number(1.0, 20.0))
    chunk_frames: int = option(3, "latent frames per chunk", Integer(1, 8))
    seed: int = option(0, "noise seed", Integer(0, 2**31 - 1))
    attention: str = option("sdpa", "(Wan) attention over the cache: exact SDPA or Monarch",
                            Choice(("sdpa", "monarch")))
    runtime: str = option("torch", "where the VAE decoder computes: torch, or ONNX Runtime on the CPU from the "
                                   "model's export for this size and chunk_frames", Choice(VAE_RUNTIMES),
                          alias="backend")
    input: str = option("noise", "noise (text-to-video) or camera (the client's camera pictures, restyled)",
                        Choice(("noise", "camera")))
    strength: float | None = option(None, f"(with input camera, required) {STRENGTH}", Number(0, 1, lo_open=True))

    def check(self, pipeline: str) -> None:
        if self.prompt is not None and self.prompt_embeds is not None:
            raise bad_option(pipeline, "prompt_embeds", self.prompt_embeds, "either prompt or prompt_embeds, not both")
        if self.prompt is None and self.prompt_embeds is None:
            raise bad_option(pipeline, "prompt", None, "a prompt (or prompt_embeds) to start from")
        if self.input == "noise" and self.strength is not None:
            raise bad_option(pipeline, "strength", self.strength, 'no strength with input "noise" (text-to-video '
                                                                  'starts from noise); strength goes with input '
                                                                  '"camera"')
        if self.input == "camera" and self.strength is None:
            raise bad_option(pipeline, "strength", None, f'a strength with input "camera": {STRENGTH}')


def _refused(key: str, value, expected: str, exc: Exception) -> ProtocolError:
    """A refusal caused by the server, by its model or its export.

    The client hears what it may send. The cause goes to the log.
    """
    log.warning("generate: %s %r refused: %s", key, value, exc)
    return bad_option("generate", key, value, f"{expected}; the server's log says why")


def _check_size(gm, opts: GenerateOptions) -> None:
    """The model tiles the size: width and height are multiples of its tile, within its rotary table.

    These are the checks of ``GenerateModel.latent_size``, worded for the client in WxH.
    """
    s = gm.vae.config.scale_factor_spatial
    p_h, p_w = tuple(gm.transformer.config.patch_size)[1:]
    step_w, step_h = s * p_w, s * p_h
    w, h = opts.size
    if w % step_w or h % step_h:
        sides = (("width", w, step_w), ("height", h, step_h))
        wrong = " and ".join(f"the {side}, {v}, is not" for side, v, step in sides if v % step)
        tiles = f"multiples of {step_w}" if step_w == step_h else f"multiples of {step_w} (width) and {step_h} (height)"
        raise bad_option("generate", "size", f"{w}x{h}",
                         f"a WxH whose width and height are {tiles} (the model's {s}x VAE downscale times its "
                         f"{p_w}x{p_h} patches): {wrong}; e.g. {max(step_w, w // step_w * step_w)}x"
                         f"{max(step_h, h // step_h * step_h)}")
    try:
        gm.latent_size(h, w)
    except ValueError as exc:
        most = gm.transformer.config.rope_max_seq_len * min(step_w, step_h)
        raise _refused("size", f"{w}x{h}", f"at most {most} pixels on a side (the model's rotary table)", exc) from None


def _embeds(gm, folder: str, name: str) -> str:
    """The path of the embeddings file ``name`` in the model folder, checked.

    It must exist and hold embeddings of the model's text width.
    Refusals name the file, never the folder's path.
    """
    from framegraph.models.generate import load_prompt_embeds  # heavy: the model is loaded by now anyway

    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
        raise bad_option("generate", "prompt_embeds", name,
                         f"the name of a .safetensors file in the model folder {files}")
    try:
        load_prompt_embeds(path, gm.family.text_dim(gm.transformer), gm.prompt_tokens)
    except ValueError as exc:
        raise ProtocolError(ErrorCode.BAD_OPTION, f"generate: option 'prompt_embeds' = {name!r}: "
                                                  f"{str(exc).replace(folder + os.sep, '')}") from None
    return path


def _prompt(gm, folder: str, text: str | None, embeds: str | None) -> tuple[str | None, str | None]:
    """``(prompt, embeddings path)``, checked against the model. A text prompt needs its text encoder."""
    if text is not None and gm.text_folder is None:
        files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
        raise bad_option("generate", "prompt", text, f"prompt_embeds instead (model {os.path.basename(folder)!r} has "
                                                     f"no text encoder on this server): the name of a .safetensors "
                                                     f"file in the model folder {files}")
    return text, (None if embeds is None else _embeds(gm, folder, embeds))


def build(opts: GenerateOptions) -> Pipeline:
    from framegraph.models.generate import default_dtype, load_generate_model  # heavy

    name = opts.model or model_names()[0]
    folder = os.path.join(models_dir(), name)
    device = default_device(opts.runtime)
    place, version = (os.path.abspath(folder), str(device)), _files(folder)  # a changed folder loads anew
    service = _batching(opts, folder, device)

    def load():
        return load_generate_model(folder, device=device, dtype=default_dtype(device))

    try:
        gm = MODELS.shared(place, version, load) if service is not None else MODELS.take(place, version, load)
    except (ValueError, OSError) as exc:
        raise _refused("model", name, "another of the server's models (this one does not load)", exc) from None
    if service is not None:  # the model is the lane's: the sessions' pasts are their own
        return _pipeline(opts, name, folder, device, gm, service=service, on_close=None)
    try:
        return _pipeline(opts, name, folder, device, gm, on_close=lambda: MODELS.give_back(place, version, gm))
    except BaseException:
        MODELS.give_back(place, version, gm)  # refused or failed before a session had it: the next one may use it
        raise


def _batching(opts: GenerateOptions, folder: str, device: str):
    """The model service for a session of this model on a server with ``batching`` on, where its chunk has a
    batched engine (torch; Wan with SDPA attention); else None: the session runs alone."""
    from framegraph.models.generate.checkpoint import detect_family

    service = model_service(opts)
    if service is None or not models_runtime.batches("generate-denoiser-batch", "torch", device):
        return None
    try:
        family = detect_family(folder)
    except ValueError:
        return None  # the load says what is wrong with the folder
    return service if family == "sana" or opts.attention == "sdpa" else None  # Monarch refits each stream's past


def _files(folder: str) -> tuple:
    """``(path, bytes, mtime ns)`` of every file under ``folder``: what a loaded model was loaded from."""
    found = []
    for root, _, names in os.walk(folder):
        for n in names:
            st = os.stat(os.path.join(root, n))
            found.append((os.path.relpath(os.path.join(root, n), folder), st.st_size, st.st_mtime_ns))
    return tuple(sorted(found))


def _pipeline(opts: GenerateOptions, name: str, folder: str, device: str, gm, *, on_close,
              service=None) -> Pipeline:
    """The session's graph on the loaded model ``gm``.

    ``gm`` is taken from :data:`MODELS`. ``on_close`` gives it back. With ``service`` the denoiser's chunks run
    on its lane, and ``gm`` is the one all batched sessions share.
    """
    from framegraph.models.generate import build_generate_graph
    from framegraph.models.generate.onnx import default_wan_onnx_dir
    from framegraph.models.onnx import ExportError

    opts.fps = opts.fps or gm.fps
    _check_size(gm, opts)
    text, embeds = _prompt(gm, folder, opts.prompt, opts.prompt_embeds)
    r = gm.vae.config.scale_factor_temporal  # a chunk is 1 + r (F - 1) video frames first, r F after
    camera = CameraInput(width=opts.width, height=opts.height, max_fps=opts.fps,
                         pictures_per_chunk=(1 + r * (opts.chunk_frames - 1), r * opts.chunk_frames)) \
        if opts.input == "camera" else None
    size_hw = (opts.height, opts.width)  # the models' order
    try:
        gg = build_generate_graph(gm, size=size_hw, chunks=None, prompt=text, prompt_embeds=embeds,
                                  chunk_frames=opts.chunk_frames, timesteps=opts.timesteps, shift=opts.shift,
                                  seed=opts.seed, device=device, source=None if camera is None else camera.source,
                                  strength=opts.strength, clock=Clock("realtime"), fps=opts.fps, source_in_flight=2,
                                  vae_runtime=default_runtime(device) if opts.runtime == "torch" else opts.runtime,
                                  denoiser_runtime="torch" if service is not None else default_runtime(device),
                                  onnx_dir=default_wan_onnx_dir(folder, size_hw, opts.chunk_frames),
                                  batching=service,
                                  **({"attention": opts.attention} if gm.family.name == "wan" else {}))
        gg.warm()  # the session's first chunk then costs what a steady one does (compiled: built, cached)
    except Full as exc:  # the model service's measured capacity: the sessions there keep their frame rate
        raise ProtocolError(ErrorCode.FULL, f"model {name!r} is full on this server: {exc}; try again later or "
                                            f"another server", retry_after_s=FULL_RETRY_S) from None
    except ExportError as exc:
        raise _refused(opts.key("runtime"), opts.runtime,
                       f"'torch' (model {name!r} has no up-to-date ONNX export of its VAE decoder for size "
                       f"{opts.width}x{opts.height} and chunk_frames {opts.chunk_frames} on this server)",
                       exc) from None
    except (ValueError, OSError) as exc:  # the text encoder (everything the client chose is checked above)
        raise _refused("prompt", text, f"prompt_embeds instead (model {name!r}'s text encoder cannot be loaded on "
                                       f"this server)", exc) from None
    graph = gg.graph
    encoder, sink = add_video_out(graph, opts)
    graph.connect(gg.decode, encoder, "video", capacity=8)  # a chunk's frames leave the decoder at once

    def configure(changes: dict) -> dict:
        new_text, new_embeds = changes.get("prompt"), changes.get("prompt_embeds")
        if new_text is not None and new_embeds is not None:
            raise bad_option("generate", "prompt_embeds", new_embeds, "either prompt or prompt_embeds, not both")
        new_text, path = _prompt(gm, folder, new_text, new_embeds)
        try:
            gg.denoiser.set_prompt(new_text, embeds_file=path)
        except (ValueError, OSError) as exc:  # the text encoder
            raise _refused("prompt", new_text, f"prompt_embeds instead (model {name!r}'s text encoder cannot be "
                                               f"loaded on this server)", exc) from None
        return {"prompt": new_text} if new_text is not None else {"prompt_embeds": new_embeds}

    return Pipeline(graph, sink, encoder=encoder, configure=configure, video_in=camera,
                    video_burst=r * opts.chunk_frames,
                    format={"video": opts.video_format(), "audio_out": None, "audio_in": None, "pose_in": False,
                            "model": name, "family": gm.family.name, "input": opts.input, "strength": opts.strength,
                            "chunk_frames": opts.chunk_frames, "timesteps": opts.timesteps, "device": device,
                            "runtime": opts.runtime, "backend": opts.runtime, "batched": service is not None},
                    on_close=on_close)


PIPELINE = PipelineSpec("generate", "a causal video diffusion model (Wan 2.1, SANA-Video) generating endlessly from "
                                    "a prompt that can change live", GenerateOptions, build, unavailable)
