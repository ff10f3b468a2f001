"""Every Triton kernel compiles for the GPUs we target — sm_89 (RTX 4090), sm_90 (H100), sm_120 (RTX 5090) —
checked offline, without a GPU, through ``framegraph bench compile``.

Triton's interpreter (used by the other kernel tests on CPU) does not lower kernels, so layout, register or
shared-memory problems would only show on a GPU. Triton ships ptxas (12.9 for sm_89, 13.x "ptxas-blackwell"
for sm_90a and sm_120a), so we compile to cubins here. The interpreter patches ``triton.language``
process-wide, so the command runs in a subprocess with ``TRITON_INTERPRET=0``.
"""
import ast
import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

# Not imported here: Triton must first be imported after TRITON_INTERPRET is set (see the other tests).
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]  # the checkout
ARCHS = {"sm_89", "sm_90", "sm_120"}

def _triton_kernels_in_source() -> set[str]:
    """``module.name`` of every ``@triton.jit`` function named ``*_kernel`` in the project (launched kernels;
    the other jit functions are helpers inlined into them)."""
    found = set()
    for folder in ("kernels", "renderers", "models"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and any(
                        ast.unparse(d).startswith("triton.jit") for d in node.decorator_list):
                    found.add(".".join(path.relative_to(REPO).with_suffix("").parts) + "." + node.name)
    return found


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the other tests compile for the real device")
def test_every_triton_kernel_compiles_for_every_target_gpu(tmp_path):
    out = tmp_path / "compile.json"
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    command = [sys.executable, "-m", "framegraph.apps.cli", "bench", "compile", "--out", str(out), "--jobs", "2"]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert out.exists(), proc.stderr[-4000:]
    report = json.loads(out.read_text())
    results = report["kernels"]

    # one registry holds every launched kernel, each compiled for every target (a launcher may pick other
    # tiles per architecture, so the kernels and dtypes are compared, not the configurations)
    assert {r["kernel"] for r in results} == _triton_kernels_in_source()
    per_arch = {arch: Counter((r["kernel"], r["dtype"]) for r in results if r["arch"] == arch) for arch in ARCHS}
    assert per_arch["sm_89"] == per_arch["sm_90"] == per_arch["sm_120"], per_arch
    limits = {"sm_89": 99 * 1024, "sm_90": 227 * 1024, "sm_120": 99 * 1024}
    for r in results:
        assert r["shared_limit_bytes"] == limits[r["arch"]]
        assert 0 < r["registers"] <= 255, r
        assert r["fits"] == (r["shared_bytes"] <= r["shared_limit_bytes"])
        assert r["spills"] == (r["spill_store_bytes"] + r["spill_load_bytes"] > 0)

    # no kernel spills or exceeds its architecture's per-block shared memory
    problems = [f"{r['arch']} {r['kernel']} {r['dtype']} {r['constexprs']}: {r['spill_store_bytes']} B spilled, "
                f"{r['shared_bytes']} B shared" for r in results if r["spills"] or not r["fits"]]
    assert problems == []
    assert report["failures"] == 0
    assert proc.returncode == 0, proc.stderr[-4000:]
