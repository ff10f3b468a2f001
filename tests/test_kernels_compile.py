"""The Triton kernels compile for a Hopper GPU (sm_90) — checked offline, without a GPU.

Triton's interpreter (used by the other kernel tests on CPU) does not lower kernels, so layout or
shared-memory problems would only show on a GPU. Triton ships ptxas, so we compile to cubins here.
The interpreter patches ``triton.language`` process-wide, so the compilation runs in a subprocess
(this file's ``__main__``) with ``TRITON_INTERPRET=0``.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

# Not imported here: Triton must first be imported after TRITON_INTERPRET is set (see the other tests).
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

SHARED_MEMORY_LIMIT = 227 * 1024  # bytes per block on H100 / H200

KERNELS = [
    # (op folder, kernel, constexprs, dtype of the activation pointers, num_warps)
    *[
        ("block_linear_attention", name, dict(BT=32, BK=128, BV=128, ROPE=True, PRECISION=precision), dtype, 8)
        for name in ("_block_sums_kernel", "_block_output_kernel", "_query_grad_kernel", "_key_grad_kernel")
        for dtype, precision in (("*bf16", "tf32"), ("*fp32", "ieee"))
    ],
    ("modulation", "_norm_modulate_kernel", dict(BC=4096, RMS=False, HAS_W=True), "*bf16", 16),
    ("modulation", "_norm_modulate_backward_kernel", dict(BC=4096, RMS=True, HAS_W=True), "*bf16", 16),
    ("modulation", "_gate_residual_kernel", dict(BC=1024), "*bf16", 4),
    ("modulation", "_gate_residual_backward_kernel", dict(BC=1024), "*bf16", 4),
    ("rope", "_rope_kernel", dict(BR=32, BK=128, SIGN=1.0), "*bf16", 4),
    *[
        ("monarch_attention", name, dict(consts, SCALE=128 ** -0.5, BD=128, PRECISION=precision), dtype, 8)
        for name, consts in (
            ("_row_step_kernel", dict(BJ=32, BI=32, BV=128, HAS_C=True, WITH_V=True)),
            ("_column_lse_kernel", dict(BL=32, BK=32, BV=128, CAUSAL=True, OUTPUT=True)),
            ("_column_sum_kernel", dict(BK=32, BL=32, CAUSAL=True)),
        )
        for dtype, precision in (("*bf16", "tf32"), ("*fp32", "ieee"))
    ],
    *[
        ("monarch_attention.triton_backward", name, dict(consts, SCALE=128 ** -0.5, BD=128, PRECISION=precision),
         dtype, 8)
        for name, consts in (
            ("_column_grad_query_kernel", dict(BL=32, BK=32, BG=128, CAUSAL=True, OUTPUT_STEP=False)),
            ("_column_grad_key_kernel", dict(BK=32, BL=32, BG=128, CAUSAL=True, OUTPUT_STEP=True)),
            ("_row_grad_kernel", dict(BJ=32, BI=32, BV=128, HAS_C=True, WITH_V=True)),
            ("_row_key_grad_kernel", dict(BI=32, BJ=32, BV=128, HAS_C=True, WITH_V=True)),
        )
        for dtype, precision in (("*bf16", "tf32"), ("*fp32", "ieee"))
    ],
]
FP32_POINTERS = ("kv", "ksum", "gkv", "gksum", "rope", "dscale", "dw", "dg")


def compile_all() -> list[dict]:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    results = []
    for op, name, consts, dtype, num_warps in KERNELS:
        module = op if "." in op else f"{op}.triton"  # "op" = the op's triton.py, else the module named
        kernel = getattr(importlib.import_module(f"framegraph.kernels.{module}"), name)
        signature = {}
        for arg in kernel.arg_names:
            if arg in consts:
                signature[arg] = "constexpr"
            elif arg.endswith("_ptr"):
                signature[arg] = "*fp32" if arg.startswith(FP32_POINTERS) else dtype
            else:
                signature[arg] = "fp32" if arg == "eps" else "i32"
        compiled = triton.compile(
            ASTSource(fn=kernel, signature=signature, constexprs=consts),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": num_warps},
        )
        results.append({"kernel": f"{op}.{name}", "dtype": dtype, "shared": compiled.metadata.shared})
    return results


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the other tests compile for the real device")
def test_triton_kernels_compile_for_sm90():
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode == 3:
        pytest.skip(proc.stdout.strip())
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == len(KERNELS)
    for r in results:
        assert r["shared"] <= SHARED_MEMORY_LIMIT, r


if __name__ == "__main__":
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as exc:
        print(f"this Triton has no offline compile API: {exc}")
        sys.exit(3)
    print(json.dumps(compile_all()))
