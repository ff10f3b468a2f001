"""The ``framegraph`` command line.

    framegraph render --testcard --seconds 5 --fps 25 --size 640x360 --out out/testcard.mp4
    framegraph generate --model Wan2.1-Self-Forcing-Diffusers --prompt "a fox in the snow" --out fox.mp4
    framegraph bench runtime --out benchmarks/results/cpu/runtime.json
    framegraph serve --port 8765
    framegraph client --url ws://127.0.0.1:8765/ws --pipeline scope --audio speech.wav --out take.mp4
    framegraph info

Building the parser loads every command's module (for its ``add_arguments``), so a command module imports
the model and renderer stacks it runs (diffusers, the avatar, the renderers) inside its ``run``, not at its
top: ``framegraph --help`` answers in about two seconds instead of four. Elsewhere, framegraph's own
imports sit at the top of each module; the few left inside functions load Triton kernels lazily.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .bench import BENCHES, REPORT


def _bench_parsers(sub) -> None:
    """``framegraph bench NAME``: one subcommand per bench of ``bench.BENCHES``, and ``report``."""
    bench = sub.add_parser("bench", help=COMMANDS["bench"][1],
                           description="Benchmarks write JSON with the device, versions and exact command.")
    kinds = bench.add_subparsers(dest="bench", required=True, metavar="WHAT")
    for name, (module, help_) in {**BENCHES, "report": REPORT}.items():
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            if exc.name != module:  # the module exists but something it needs is missing
                raise
            continue
        p = kinds.add_parser(name, help=help_, description=(mod.__doc__ or help_).strip().splitlines()[0])
        mod.add_arguments(p)
        p.set_defaults(func=mod.run)


# Commands: name → (module with add_arguments(parser) and run(args) -> int, help, description).
COMMANDS = {
    "render": ("framegraph.apps.render", "render offline to an MP4 file",
               "Render offline to MP4 (H.264 + AAC) through a stage graph, with a progress bar. Ctrl-C finishes "
               "a playable file."),
    "generate": ("framegraph.apps.generate", "stream a video diffusion model (Wan 2.1, SANA-Video) to an MP4",
                 "Generate video chunk by chunk with a causal Wan 2.1 or SANA-Video model from local weights (text- or "
                 "video-to-video), to an MP4, with a progress bar. Ctrl-C finishes a playable file."),
    "export": ("framegraph.apps.export", "export an avatar bundle's models, or a video model's causal VAE decoder, "
               "to ONNX (for --backend onnx)",
               "Write the ONNX files of an avatar bundle's audio encoder, DiT and VAE decoder (--avatar; --int8 adds "
               "int8 versions for --backend onnx-int8), or of a video model's causal VAE decoder (--generate), every "
               "stream state an explicit input/output, with a manifest tied to the weights (a stale export is "
               "refused)."),
    "fit": ("framegraph.apps.fit", "fit 3D Gaussians to posed images (or a procedural scene) → INRIA .ply", None),
    "fit-nerf": ("framegraph.apps.fit_nerf", "train an instant-ngp-style NeRF from posed images → NeRF directory",
                 "Train a NeRF (hash grid + small MLPs + occupancy grid) from a transforms.json, with checkpoints, "
                 "--resume and Ctrl-C that saves; render the result with `framegraph render --scene OUT_DIR`."),
    "demo": ("framegraph.apps.demo", "live demo in the browser (Gradio + low-latency WebSocket player)",
             "Gradio page over the streaming server: microphone, typed text or a file in; live video at sub-second "
             "delay out; each take recorded to MP4. Binds 127.0.0.1."),
    "serve": ("framegraph.apps.server.cli", "WebSocket streaming server (+ /metrics and a browser page)",
              "Serve pipelines over WebSocket (protocol: apps/PROTOCOL.md). Binds 127.0.0.1 by default; a token is "
              "required to bind beyond it."),
    "cluster": ("framegraph.apps.cluster.cli", "serve many sessions from replicas on a Ray cluster (Ray Serve)",
                "Deploy framegraph on Ray Serve: one replica per GPU (or N CPU cores), one front door that places each "
                "session on a replica with room (clients use the same protocol as `framegraph serve`), autoscaling on "
                "live sessions, drain on scale-down, one /metrics for the cluster. Needs framegraph[cluster]."),
    "client": ("framegraph.apps.client_webrtc", "stream to a server, record the MP4, print latency",
               "Stream audio (or nothing, for the test card) to a framegraph server, record what comes back to MP4, "
               "and measure glass-to-glass latency."),
    "avatar": ("framegraph.apps.avatar",
               "talking avatar: synthetic clips (synth), training (train, refine), evaluation (eval)",
               "Talking-avatar tools. `synth` writes MP4 + per-frame JSON ground-truth clips of a portrait speaking "
               "espeak-ng sentences; `train` trains an avatar bundle (VAE, DiT, audio encoder), also from your own "
               "video; `refine` trains a bundle's decoder further (the reference warp); `eval` measures one "
               "against ground truth."),
    "bench": (None, "measure speed and latency; writes JSON (+ PNG)", None),  # its kinds: bench.BENCHES
    "info": ("framegraph.apps.info", "versions, devices and backends available",
             "Versions, devices, kernel backends and video encoders available on this machine."),
}


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser. With ``chosen`` (the command on the line), only that command's module is imported,
    so a command never pays for (or fails on) another's dependencies: the demo's web stack, say."""
    parser = argparse.ArgumentParser(
        prog="framegraph",
        description="Real-time generative video and neural rendering: graphs of stages over preallocated "
                    "ring buffers, one clock, per-frame budgets.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_, description) in COMMANDS.items():
        if module is None:
            _bench_parsers(sub)
            continue
        if chosen is not None and name != chosen:
            sub.add_parser(name, help=help_)
            continue
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_, description=description or (mod.__doc__ or help_).strip().splitlines()[0])
        mod.add_arguments(p)
        p.set_defaults(func=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from framegraph.stream import GraphError, StageError
    from framegraph.stream.media import MediaError

    from .bench import meta as benchmeta

    argv = sys.argv[1:] if argv is None else list(argv)
    benchmeta.set_command(argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(chosen if chosen in COMMANDS else None).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (MediaError, GraphError, StageError, ValueError, FileNotFoundError) as exc:
        print(f"framegraph {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"framegraph {args.command}: aborted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
