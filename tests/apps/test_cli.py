"""The command line's shape: ``--help`` answers without torch (#35), only the chosen command's parser is built
(and below ``bench``, only the chosen bench's), ``--runtime`` with its old name ``--backend`` still working, and the
runtime names the command line offers are the models' own."""
import json
import subprocess
import sys

import pytest

from framegraph.apps.argtypes import AVATAR_RUNTIMES, INT8_DEFAULT_MODE, INT8_MODES, VAE_RUNTIMES
from framegraph.apps.cli import COMMANDS, build_parser
from framegraph.apps.commands.bench import BENCHES

PY = sys.executable


def loaded_after(argv_lines: list[list[str]], prefixes: tuple[str, ...]) -> list[list[str]]:
    """For each command line, in a fresh interpreter: the modules starting with ``prefixes`` loaded once its parser
    is built and its ``--help`` printed."""
    code = ("import contextlib, io, json, sys\nfrom framegraph.apps.cli import build_parser\nout = []\n"
            f"for argv in {argv_lines!r}:\n"
            "    try:\n        with contextlib.redirect_stdout(io.StringIO()):\n"
            "            build_parser(argv).parse_args(argv)\n    except SystemExit:\n        pass\n"
            f"    out.append(sorted(m for m in sys.modules if m.startswith({prefixes!r})))\n"
            "print(json.dumps(out))")
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_framegraph_help_does_not_import_torch():
    code = ("import sys\nfrom framegraph.apps.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n"
            "    pass\nprint('torch' in sys.modules, 'numpy' in sys.modules)")
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split()[-2:] == ["False", "False"], done.stdout


def test_no_commands_help_imports_torch_a_model_or_a_renderer():
    lines = [[name, "--help"] for name in COMMANDS]  # fit-nerf among them: its NeRF options are torch-free too
    lines += [["bench", name, "--help"] for name in BENCHES]
    heavy = ("torch", "framegraph.models", "framegraph.renderers", "framegraph.stream", "diffusers", "gradio")
    # the runtime registry's names, the NeRF's options: no torch in them
    light = {"framegraph.models", "framegraph.models.runtime", "framegraph.renderers",
             "framegraph.renderers.nerf_options"}
    for argv, loaded in zip(lines, loaded_after(lines, heavy)):
        assert [m for m in loaded if m not in light] == [], (argv, loaded)


def test_only_the_chosen_commands_and_benchs_fronts_are_imported():
    fronts = ("framegraph.apps.commands.", "framegraph.apps.bench.")
    bench_kernels, render = loaded_after([["bench", "kernels", "--help"], ["render", "--help"]], fronts)
    assert bench_kernels == ["framegraph.apps.commands.bench", "framegraph.apps.commands.bench.kernels"]
    assert render == bench_kernels + ["framegraph.apps.commands.render"]  # one interpreter: the first line's stay


@pytest.mark.parametrize("argv", [
    ["render", "--avatar", "A", "--audio", "a.wav", "--out", "o.mp4", "--backend", "onnx"],
    ["generate", "--model", "M", "--prompt", "p", "--out", "o.mp4", "--backend", "onnx"],
    ["demo", "--backend", "onnx"],
    ["avatar", "eval", "--avatar", "A", "--clip", "c.mp4", "--out", "o.json", "--backend", "onnx"],
    ["bench", "avatar", "--out", "o.json", "--backend", "torch,onnx"],
    ["bench", "generate", "--family", "wan", "--config", "tiny", "--out", "o.json", "--backend", "torch,onnx"],
])
def test_the_old_backend_option_still_sets_the_runtime_and_says_it_is_deprecated(argv, capsys):
    args = build_parser(argv).parse_args(argv)
    assert args.runtime in ("onnx", ["torch", "onnx"])
    assert "--backend is deprecated; use --runtime" in capsys.readouterr().err
    new = build_parser(argv).parse_args([("--runtime" if a == "--backend" else a) for a in argv])
    assert new.runtime == args.runtime and "deprecated" not in capsys.readouterr().err


def test_the_runtimes_the_command_line_offers_are_the_models_own():
    import framegraph.models.avatar  # noqa: F401  (a model registers its runtimes when it is imported)
    import framegraph.models.generate  # noqa: F401
    from framegraph.models import runtime
    from framegraph.models.avatar.int8 import DEFAULT_MODE
    from framegraph.models.onnx.quantize import MODES

    assert AVATAR_RUNTIMES == runtime.runtimes("avatar-portrait")
    # generate's --runtime picks the VAE's torch or onnx; --compile (default on CUDA) turns torch into compiled
    assert set(VAE_RUNTIMES) | {"compiled"} == set(runtime.runtimes("generate-vae"))
    assert INT8_MODES == MODES and INT8_DEFAULT_MODE == DEFAULT_MODE
    with pytest.raises(SystemExit):
        build_parser(["render"]).parse_args(["render", "--testcard", "--out", "o.mp4", "--runtime", "tensorrt"])


def described(argv: list[str]) -> str:
    """The description ``--help`` prints for the (sub)command ``argv``."""
    parser = build_parser([*argv, "--help"])
    for word in argv:
        parser = parser._subparsers._group_actions[0].choices[word]
    return parser.description


def test_every_commands_and_benchs_help_describes_it_in_whole_sentences():
    lines = [[name] for name in COMMANDS] + [["bench", name] for name in BENCHES]
    cut = [(argv, described(argv)[-40:]) for argv in lines if not described(argv).rstrip().endswith((".", ")"))]
    assert not cut, cut  # e.g. `bench startup`'s was its docstring's first line, cut mid-sentence


def test_avatar_help_names_every_tool():
    done = subprocess.run([PY, "-m", "framegraph.apps.cli", "avatar", "--help"], capture_output=True, text=True)
    for tool in ("synth", "train", "refine", "matte", "eval"):
        assert f"`{tool}`" in done.stdout, tool
    listed = subprocess.run([PY, "-m", "framegraph.apps.cli", "--help"], capture_output=True, text=True).stdout
    assert "(matte)" in listed
