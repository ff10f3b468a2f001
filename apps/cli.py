"""The ``framegraph`` command line.

    framegraph render --testcard --seconds 5 --fps 25 --size 640x360 --out out/testcard.mp4
    framegraph generate --model Wan2.1-Self-Forcing-Diffusers --prompt "a fox in the snow" --out fox.mp4
    framegraph bench runtime --out benchmarks/results/cpu/runtime.json
    framegraph serve --port 8765
    framegraph client --url ws://127.0.0.1:8765/ws --pipeline scope --audio speech.wav --out take.mp4
    framegraph info

How a command is laid out. This is the one rule for imports in apps/:

- A command has a **front**: the module :data:`COMMANDS` names, in ``apps/commands/``. It declares the command's
  options, ``add_arguments(parser)``. It names its implementation, ``IMPLEMENTATION``. At its top it imports only the
  standard library and light modules of apps/. Those are ``argtypes``, and the settings dataclasses whose defaults its
  options show. ``server/config.py`` is one. The server, demo and cluster packages export their names on first use. So
  such a module loads alone. A front never imports torch, a model or a renderer. So ``framegraph --help`` and
  ``framegraph CMD --help`` answer at once. ``fit-nerf`` and ``bench nerf_fit`` take the NeRF's own options from
  ``renderers/nerf_options.py``. That module is torch-free for this reason.
- Its **implementation** has ``run(args) -> int``. Examples are ``apps/render.py``, ``apps/server/cli.py`` and
  ``apps/bench/kernels.py``. It imports what it needs at its top: torch, the models, the renderers. It also
  imports its front when it shares a declaration. That may be a list of choices or a default. A front never imports
  its implementation. The CLI does, by name, only to run the command. Dependencies point one way:
  implementation → front.
- A front may list ``SUBCOMMANDS`` instead: name → (front module, help, description). ``framegraph bench`` does,
  with one front per bench. The CLI builds only the chosen command's parser. Below it, it builds only the chosen
  subcommand's.
- Server pipelines live in ``apps/server/pipelines/``. A pipeline's module declares its options with light
  imports. Its ``build`` starts by importing the models or renderers it runs. So a server loads them on a
  pipeline's first use.

Elsewhere in apps/, imports sit at the top of the module. Some are left inside functions, each with a comment
saying which:

- those of the rule above. That means a pipeline's models. ``render`` loads the renderers or the avatar only for
  a scene or an avatar.
- optional extras, where a missing one is a message, not a crash. They are ray and Serve's fastapi ingress, and
  aiortc and what imports it. They are pipecat and uvicorn, fla and gsplat.
- Triton, for ``bench compile``.
- matplotlib, in ``bench/meta.py``'s ``pyplot``. Its backend is chosen before pyplot loads.
"""
from __future__ import annotations

import argparse
import functools
import gc
import importlib
import os
import re
import sys
import threading

# Commands: name → (front module: add_arguments(parser) and IMPLEMENTATION, help, description).
COMMANDS = {
    "render": ("framegraph.apps.commands.render", "render offline to an MP4 file",
               "Render offline to MP4 (H.264 + AAC) through a stage graph, with a progress bar and a time "
               "estimate from the pace measured. Ctrl-C finishes a playable file (at NAME.partial.mp4 when an "
               "earlier file is at --out: that one is never replaced by a partial render)."),
    "generate": ("framegraph.apps.commands.generate", "stream a video diffusion model (Wan 2.1, SANA-Video) to an MP4",
                 "Generate video chunk by chunk with a causal Wan 2.1 or SANA-Video model from local weights (text- or "
                 "video-to-video), to an MP4, with a progress bar. Ctrl-C finishes a playable file."),
    "export": ("framegraph.apps.commands.export", "export an avatar bundle's models, or a video model's causal VAE "
               "decoder, to ONNX (for --runtime onnx)",
               "Write the ONNX files of an avatar bundle's audio encoder, DiT and VAE decoder (--avatar; --int8 adds "
               "int8 versions for --runtime onnx-int8), or of a video model's causal VAE decoder (--generate), every "
               "stream state an explicit input/output, with a manifest tied to the weights (a stale export is "
               "refused)."),
    "fit": ("framegraph.apps.commands.fit", "fit 3D Gaussians to posed images (or a procedural scene) → INRIA .ply",
            None),
    "fit-nerf": ("framegraph.apps.commands.fit_nerf", "train an instant-ngp-style NeRF from posed images → NeRF "
                 "directory",
                 "Train a NeRF (hash grid + small MLPs + occupancy grid) from a transforms.json, with checkpoints, "
                 "--resume and Ctrl-C that saves; render the result with `framegraph render --scene OUT_DIR`."),
    "demo": ("framegraph.apps.commands.demo", "live demo in the browser (Gradio + low-latency WebSocket player)",
             "Gradio page over the streaming server: microphone, typed text or a file in; live video at sub-second "
             "delay out; each take recorded to MP4. Binds 127.0.0.1."),
    "serve": ("framegraph.apps.commands.serve", "WebSocket streaming server (+ /metrics and a browser page)",
              "Serve pipelines over WebSocket (protocol: apps/PROTOCOL.md). Binds 127.0.0.1 by default; a token is "
              "required to bind beyond it."),
    "cluster": ("framegraph.apps.commands.cluster", "serve many sessions from replicas on a Ray cluster (Ray Serve)",
                "Deploy framegraph on Ray Serve: one replica per GPU (or N CPU cores), one front door that places each "
                "session on a replica with room (clients use the same protocol as `framegraph serve`), autoscaling on "
                "live sessions, drain on scale-down, one /metrics for the cluster. Needs framegraph[cluster]."),
    "pipecat-demo": ("framegraph.apps.commands.pipecat_demo", "the example Pipecat voice agent with the avatar, in the "
                     "browser (needs framegraph[pipecat])", None),
    "client": ("framegraph.apps.commands.client", "stream to a server, record the MP4, print latency",
               "Stream audio (or nothing, for the test card) to a framegraph server, record what comes back to MP4, "
               "and measure glass-to-glass latency."),
    "avatar": ("framegraph.apps.commands.avatar",
               "talking avatar: synthetic clips (synth), training (train, refine), the person matte (matte), "
               "evaluation (eval)",
               "Talking-avatar tools. `synth` writes MP4 + per-frame JSON ground-truth clips of a portrait speaking "
               "espeak-ng sentences; `train` trains an avatar bundle (VAE, DiT, audio encoder), also from your own "
               "video; `refine` trains a bundle's decoder further (the reference warp); `matte` adds the person "
               "matte (for --alpha, a background or a scene) to a bundle made without one; `eval` measures one "
               "against ground truth."),
    "bench": ("framegraph.apps.commands.bench", "measure speed and latency; writes JSON (+ PNG)",
              "Benchmarks write JSON with the device, versions and exact command."),
    "info": ("framegraph.apps.commands.info", "versions, devices and backends available",
             "Versions, devices, kernel backends and video encoders available on this machine."),
}


def _positional(argv: list[str]) -> tuple[str | None, list[str]]:
    """The first word of ``argv`` that is not an option, and what follows it. That word is the command chosen."""
    for i, word in enumerate(argv):
        if not word.startswith("-"):
            return word, argv[i + 1:]
    return None, []


def _add_commands(sub, table: dict, argv: list[str]) -> None:
    """One parser per entry of ``table``. Only the chosen one's front is imported and its arguments built."""
    chosen, rest = _positional(argv)
    for name, (module, help_, description) in table.items():
        if name != chosen:
            sub.add_parser(name, help=help_)
            continue
        front = importlib.import_module(module)
        first_paragraph = " ".join((front.__doc__ or help_).strip().split("\n\n")[0].split())
        p = sub.add_parser(name, help=help_, description=description or first_paragraph)
        if hasattr(front, "SUBCOMMANDS"):
            _add_commands(p.add_subparsers(dest=f"{name}_command", required=True, metavar="WHAT"),
                          front.SUBCOMMANDS, rest)
        else:
            front.add_arguments(p)
            p.set_defaults(func=functools.partial(_run, front.IMPLEMENTATION))


def _run(implementation: str, args: argparse.Namespace) -> int:
    """Run a command: import its implementation module now and call its ``run(args)``."""
    return importlib.import_module(implementation).run(args)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The CLI's parser for the command line ``argv``.

    Every command is listed, but only the chosen command's front is imported. Below ``bench``, only the chosen
    bench's is. So a command never pays for, or fails on, another's dependencies. The demo's web stack is one
    such."""
    parser = argparse.ArgumentParser(
        prog="framegraph",
        description="Real-time generative video and neural rendering: graphs of stages over preallocated "
                    "ring buffers, one clock, per-frame budgets.")
    _add_commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"), COMMANDS, argv or [])
    return parser


_command_line: list[str] | None = None


def command_line() -> str:
    """The ``framegraph`` command being run, as typed.

    ``main`` records it. So a benchmark run from Python with ``main([...])`` records its own arguments. It does not
    record the host program's."""
    if _command_line is not None:
        return " ".join(["framegraph", *_command_line])
    return " ".join([os.path.basename(sys.executable)] + sys.argv)


def _reported_errors() -> tuple[type, ...]:
    """What :func:`main` reports in one line.

    That is ValueError, which the runtime's MediaError and GraphError are. It is FileNotFoundError. It is
    StageError once a graph has run, since its module is loaded then. Importing it here would load torch for
    every command."""
    graph = sys.modules.get("framegraph.stream.graph")
    return (ValueError, FileNotFoundError) + ((graph.StageError,) if graph is not None else ())


def out_of_memory(exc: BaseException) -> str | None:
    """The sentence for an allocation that failed, else None. ``exc`` is checked, or for a stage's failure its cause."""
    for e in (exc, exc.__cause__):
        text = str(e) if e is not None else ""
        if isinstance(e, MemoryError) or "can't allocate memory" in text or "out of memory" in text.lower():
            tried = re.search(r"allocate (\d+) bytes", text)
            at_once = f" (it asked for {int(tried.group(1)) / 2**30:.1f} GiB at once)" if tried else ""
            return f"out of memory{at_once}: a smaller --size, or a machine with more free memory"
        if type(e).__name__ == "ExternalError" and "avcodec" in text:  # x264 says "malloc ... failed" just before
            return ("the video encoder (FFmpeg) failed, most likely out of memory at this size: a smaller --size, or "
                    "a machine with more free memory")
    return None


def _stop_now_if_a_stage_computes(code: int) -> None:
    """After Ctrl-C, end the process now with ``code`` if a stage's worker still computes.

    The computation may be a frame that takes minutes. Left to the interpreter's exit, that thread would be
    torn down inside torch. That aborts with ``terminate called without an active exception``, exit 134."""
    busy = [t for t in threading.enumerate() if t.name.startswith("framegraph:") and t.is_alive()]
    for t in busy:
        t.join(timeout=1.0)
    if any(t.is_alive() for t in busy):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Run one command line. ``argv`` None means this process's, which then exits."""
    global _command_line
    exiting = argv is None  # the `framegraph` script and `python -m`: the process ends with this command
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    _command_line = argv
    try:
        return int(args.func(args) or 0)
    except _reported_errors() as exc:
        print(f"framegraph {args.command}: error: {out_of_memory(exc) or exc}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as exc:  # an allocation that failed is a sentence; any other error raises
        if out_of_memory(exc) is None:
            raise
        print(f"framegraph {args.command}: error: {out_of_memory(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"framegraph {args.command}: aborted", file=sys.stderr)
        if exiting:
            _stop_now_if_a_stage_computes(130)
        return 130
    finally:
        # the interpreter's last collection need not walk torch's objects. Not once triton is loaded (torch's
        # optimizers load it): frozen objects are never freed, and its nanobind module then lists each one as
        # leaked on exit
        if exiting and "triton._C.libtriton" not in sys.modules:
            gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
