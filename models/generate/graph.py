"""The generate graph, assembled: source → (VAEEncode) → CausalDenoiser → CausalVAEDecode → [the caller's sink].

    from framegraph.models.generate import build_generate_graph, load_generate_model

    gm = load_generate_model("Wan2.1-T2V-1.3B-Self-Forcing-Diffusers")
    gg = build_generate_graph(gm, size=(480, 832), chunks=10, prompt="a fox running through snow")
    sink = gg.graph.add(MP4Sink("fox.mp4", width=832, height=480, fps=gm.fps, audio_rate=None))
    gg.graph.connect(gg.decode, sink)
    gg.graph.run()
    gg.denoiser.set_prompt("the fox jumps into a river")    # any time, any thread: from the next chunk
"""
from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from framegraph.models import runtime
from framegraph.stream import Clock, Graph, Stage
from framegraph.stream.media import ScaleVideo, VideoFileSource
from framegraph.stream.memory import keep_freed_memory

from .checkpoint import GenerateModel
from .family import SHIFT
from .prompts import PromptBook
from .stages import CausalDenoiser, CausalVAEDecode, NoiseSource, VAEEncode, denoise_timesteps, video_frames

__all__ = ["GenerateGraph", "build_generate_graph"]


@dataclass
class GenerateGraph:
    """What :func:`build_generate_graph` made.

    ``decode.outputs["video"]`` is the video to connect to a sink.
    ``frames`` is the number of video frames it will write; None means endless.
    """

    graph: Graph
    source: Stage
    denoiser: CausalDenoiser
    decode: CausalVAEDecode
    frames: int | None
    fps: float

    def warm(self) -> dict:
        """Warm the model stages at this graph's shape before it starts. This is the model load's second half.

        Dummy chunks go through the denoiser, covering every state of its cache, and through the decoder.
        Compiled graphs are built and CUDA graphs captured, so the first real chunk finds everything ready.
        Each runs in a thread of its own, as in the graph, with the graph's memory policy.
        glibc gives each thread its own heap.
        So that heap is already paged in when the session's stage threads take it over.
        Returns the seconds each took.
        """
        keep_freed_memory()
        return dict(zip(("denoiser_s", "vae_decode_s"), in_threads(self.denoiser.warm, self.decode.warm)))


def in_threads(*calls) -> list:
    """Each of ``calls`` in a thread of its own, one after the other. Returns their results in order.

    Every thread stays alive until all are done.
    So each keeps its own malloc arena for the threads that come after.
    """
    results, errors = [None] * len(calls), []
    turn = [threading.Semaphore(0) for _ in calls] + [threading.Semaphore(0)]
    done = threading.Event()

    def run(i):
        turn[i].acquire()
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - raised in the caller below
            errors.append(exc)
        turn[i + 1].release()
        done.wait()

    threads = [threading.Thread(target=run, args=(i,), name=f"framegraph-warm-{i}") for i in range(len(calls))]
    for t in threads:
        t.start()
    turn[0].release()
    turn[-1].acquire()
    done.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def build_generate_graph(
    gm: GenerateModel,
    *,
    size: tuple[int, int],
    chunks: int | None,
    prompt: str | None = None,
    prompt_embeds: str | None = None,
    chunk_frames: int = 3,
    timesteps: Sequence[float] = (1000, 750, 500, 250),
    shift: float = SHIFT,
    source: Stage | None = None,
    strength: float | None = None,
    seed: int = 0,
    clock: Clock | None = None,
    device: str = "cpu",
    fps: float | None = None,
    source_in_flight: int | None = None,
    vae_runtime: runtime.Runtime = "torch",
    onnx_dir: str | None = None,
    onnx_threads: int | None = None,
    denoiser_runtime: runtime.Runtime = "torch",
    cuda_graphs: bool | None = None,
    batching=None,
    **options,
) -> GenerateGraph:
    """Build the graph, without a sink, for ``chunks`` chunks of ``size = (height, width)`` video.

    ``chunks`` None means endless.

    - ``source``: a stage with a ``"video"`` output ``uint8 [H', W', 3]``, for video-to-video at ``strength``. It is
      scaled to ``size`` when it differs. None: text-to-video from seeded noise.
    - ``source_in_flight``: the source's ``max_in_flight``. In live streams a chunk that would run late is dropped at
      the source.
    - ``vae_runtime``: see :mod:`framegraph.models.runtime`. ``"torch"``, or ``"onnx"``: the causal VAE decoder on
      ONNX Runtime, CPU, float32. It runs the export in ``onnx_dir``, made by ``framegraph export --generate``. A
      missing or stale one raises :class:`~framegraph.models.onnx.ExportError`. ``onnx_threads`` sets its intra-op
      threads; None is half the cores. ``"compiled"`` compiles the decoder.
    - ``denoiser_runtime``: ``"torch"`` or ``"compiled"``. Compiled means the transformer's blocks are compiled. On
      CUDA its steps are also replayed from CUDA graphs, unless ``cuda_graphs=False``.
    - ``batching``: a :class:`~framegraph.stream.batching.ModelService`. The denoiser's chunks then run on its
      lane with every other session's of this model and shapes, on torch (:mod:`.batch`; Wan with SDPA). The model
      is the lane's from then on: give every batched session the same one.
    - ``options``: the family's. Wan takes ``attention``, ``cache_frames`` and ``sink_frames``. Both take ``backend``,
      the kernels' choice.
    """
    height, width = size
    latent_size = gm.latent_size(height, width)
    fps = fps or gm.fps
    r = gm.vae.config.scale_factor_temporal
    dtype = gm.vae.dtype
    graph = Graph(clock or Clock("fast"), name=f"generate-{gm.family.name}")
    prompts = PromptBook(gm.family.text_dim(gm.transformer), gm.prompt_tokens, folder=gm.text_folder or gm.source,
                         device=device, encoder_dtype=default_dtype(device))
    stream = None if batching is None else _batched_stream(
        batching, gm, device=device, latent_size=latent_size, chunk_frames=chunk_frames,
        denoiser_runtime=denoiser_runtime, timesteps=denoise_timesteps(timesteps, shift, strength),
        chunks_per_s=fps / (r * chunk_frames), **options)
    denoiser = CausalDenoiser(gm.family, gm.transformer, prompts, latent_size=latent_size, chunk_frames=chunk_frames,
                              timesteps=timesteps, shift=shift, strength=strength, seed=seed, device=device,
                              engine=None if stream is not None else
                              runtime.engines("generate-denoiser", denoiser_runtime, cuda_graphs=cuda_graphs),
                              stream=stream, **options)
    if prompt is not None or prompt_embeds is not None:
        denoiser.set_prompt(prompt, embeds_file=prompt_embeds)
    s = gm.vae.config.scale_factor_spatial
    engine = runtime.engines("generate-vae", vae_runtime, export_dir=onnx_dir, device=device, dtype=dtype,
                             size=(latent_size[0] * s, latent_size[1] * s), chunk_frames=chunk_frames,
                             threads=onnx_threads, model=gm.source if os.path.isdir(gm.source) else "BASE_DIR")
    decode = CausalVAEDecode(gm.vae, latent_size=latent_size, chunk_frames=chunk_frames, fps=fps, device=device,
                             dtype=dtype, engine=engine)
    if source is None:
        if strength is not None:
            raise ValueError(f"strength={strength} is for video-to-video; give an input video (--input)")
        first = graph.add(NoiseSource(channels=gm.transformer.config.in_channels, chunk_frames=chunk_frames,
                                      latent_size=latent_size, fps=fps, temporal_factor=r, n_chunks=chunks, seed=seed,
                                      device=device), max_in_flight=source_in_flight)
    else:
        if strength is None:
            raise ValueError("video-to-video needs a strength in (0, 1] (how far the input is noised)")
        graph.add(source, max_in_flight=source_in_flight)
        video = source
        src_h, src_w = source.outputs["video"].shape[:2]
        if (src_h, src_w) != (height, width):
            video = graph.add(ScaleVideo(src_size=(src_w, src_h), size=(width, height)))
            graph.connect(source, video, "video", capacity=8)
        encode = graph.add(VAEEncode(gm.vae, size=size, chunk_frames=chunk_frames, device=device, dtype=dtype))
        graph.connect(video, encode, "video")
        first = encode
    graph.add(denoiser)
    graph.add(decode)
    graph.connect(first, denoiser, "latent", capacity=1)
    graph.connect(denoiser, decode, "latent", capacity=1)
    frames = None if chunks is None else video_frames(chunks, chunk_frames, r)
    return GenerateGraph(graph, source or first, denoiser, decode, frames, fps)


def _batched_stream(service, gm, *, device, latent_size, chunk_frames, denoiser_runtime, timesteps, chunks_per_s,
                    **options):
    """The denoiser's stream on ``service``'s lane; a ValueError for what has no batched engine."""
    from .batch import batched_stream

    runtime.check_batched("generate-denoiser-batch", denoiser_runtime, device)
    return batched_stream(service, gm.family.name, gm.transformer, device=device, latent_size=latent_size,
                          chunk_frames=chunk_frames, timesteps=timesteps, renoise=True, prompt_tokens=gm.prompt_tokens,
                          chunks_per_s=chunks_per_s, **options)


def file_source(path: str, frames: int | None, fps: float) -> VideoFileSource:
    """A video file as the video-to-video input, looped to ``frames`` frames at ``fps``."""
    return VideoFileSource(path, fps=fps, loop=True, n_frames=frames)


def default_dtype(device: str) -> torch.dtype:
    """bf16 on CUDA, the Triton kernels' and the released checkpoints' precision. fp32 on the CPU."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
