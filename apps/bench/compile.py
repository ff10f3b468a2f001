"""``framegraph bench compile``: every Triton kernel, compiled offline for the GPUs we target.

:func:`registry` is the one registry of the project's Triton kernels. It covers attention, modulation, rope,
3DGS forward and backward, 4DGS slice, NeRF hash encoding and MLP. Each comes in its production configurations
for one target. Where a launcher picks its tiles per architecture, the registry asks the launcher's own
function. Each kernel is compiled with Triton's bundled ptxas, so no GPU is needed. It is compiled for every
target in :data:`TARGETS`: sm_89 RTX 4090, sm_90 H100, sm_120 RTX 5090.

The JSON records, per kernel and architecture, the registers per thread and the spilled bytes. Spills are
ptxas' spill stores and loads. It also records the stack frame and shared memory. Shared memory is checked
against the architecture's per-block limit. A kernel that spills or does not fit is a failure. The command
then exits 1.

Triton's interpreter cannot compile, so the command refuses to run with ``TRITON_INTERPRET=1``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib
import io
import re
import time
from dataclasses import dataclass, field

import torch
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from framegraph.kernels.backend import triton_installed, triton_interpret_enabled
from framegraph.renderers.nerf.field import SH_DIMS
from framegraph.renderers.nerf.model import NerfConfig

from ..commands.bench.compile import TARGETS, Target
from .meta import bench_metadata, write_result


@dataclass(frozen=True)
class Kernel:
    """One Triton kernel in one production configuration.

    ``module`` is under ``framegraph.``. ``pointers`` maps an argument-name prefix to its pointer type. Other
    ``*_ptr`` arguments get ``dtype``. ``floats`` are the fp32 scalar arguments; the others are i32.
    """

    module: str
    name: str
    constexprs: dict
    num_warps: int
    dtype: str = "*fp32"
    pointers: dict = field(default_factory=dict)
    floats: tuple = ()
    num_stages: int = 3  # Triton's default


    @property
    def label(self) -> str:
        return (f"{self.module}.{self.name} {self.dtype[1:]} {self.constexprs} warps={self.num_warps} "
                f"stages={self.num_stages}")


_ATTN_DTYPES = (("*bf16", "tf32"), ("*fp32", "ieee"))  # half-precision models, and float32 ones
_ATTN_FP32 = {p: "*fp32" for p in ("kv", "ksum", "gkv", "gksum", "rope")}  # state and tables stay fp32
_MOD_FP32 = {p: "*fp32" for p in ("dscale", "dw", "dg")}  # parameter gradients accumulate in fp32


def _dedup(kernels: list[Kernel]) -> list[Kernel]:
    unique = []
    for k in kernels:
        if k not in unique:
            unique.append(k)
    return unique


def registry(capability: int) -> list[Kernel]:
    """Every Triton kernel of framegraph, in each production configuration, for 128-wide attention heads.

    These are the configurations it is launched with on a GPU of compute ``capability``. 89 is sm_89."""
    from framegraph.kernels.block_linear_attention import triton as bla_tri  # heavy: the Triton kernels
    from framegraph.kernels.monarch_attention import triton as monarch_tri  # heavy
    from framegraph.renderers.gaussians import triton as gs  # heavy
    from framegraph.renderers.gaussians4d import triton as gs4d  # heavy
    from framegraph.renderers.nerf.hash_encoding import triton as hash_tri  # heavy
    from framegraph.renderers.nerf.mlp import triton as mlp_tri  # heavy

    attn = "kernels.block_linear_attention.triton"
    monarch = "kernels.monarch_attention.triton"
    monarch_bwd = "kernels.monarch_attention.triton_backward"
    head = dict(SCALE=128 ** -0.5, BD=128)
    torch_dtype = {"*bf16": torch.bfloat16, "*fp32": torch.float32}
    kernels = []
    bla_names = dict(sums="_block_sums_kernel", output="_block_output_kernel", query_grad="_query_grad_kernel",
                     query_state_grad="_query_state_grad_kernel", key_grad="_key_grad_kernel")
    for dtype, _ in _ATTN_DTYPES:
        configs = bla_tri.launch_configs(128, 128, 1024, torch_dtype[dtype], capability)
        for role, name in bla_names.items():
            cfg = dict(configs[role])
            warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
            kernels.append(Kernel(attn, name, dict(cfg, ROPE=True), warps, dtype, _ATTN_FP32, num_stages=stages))
    video = (21, 16, 64)  # (frames, height, width) of the latent grid: every tile at its cap
    for dtype, _ in _ATTN_DTYPES:
        fwd = monarch_tri.tiles(128, 128, torch_dtype[dtype], video, capability)
        bwd = monarch_tri.tiles(128, 128, torch_dtype[dtype], video, capability, backward=True)
        for module, name, cfg, consts in (
                (monarch, "_row_step_kernel", fwd, dict(BJ=fwd["BJ"], BI=fwd["BI"], BV=128, HAS_C=True, WITH_V=True)),
                (monarch, "_row_step_kernel", bwd, dict(BJ=bwd["BJ"], BI=bwd["BI"], BV=128, HAS_C=True, WITH_V=True)),
                (monarch, "_column_lse_kernel", fwd,
                 dict(BL=fwd["BL"], BK=fwd["BK"], BV=128, CAUSAL=True, OUTPUT=True)),
                (monarch, "_column_sum_kernel", fwd, dict(BK=fwd["BK"], BL=fwd["BL"], CAUSAL=True)),
                (monarch_bwd, "_column_grad_query_kernel", bwd,
                 dict(BL=bwd["BL"], BK=bwd["BK"], BG=128, CAUSAL=True, OUTPUT_STEP=False)),
                (monarch_bwd, "_column_grad_key_kernel", bwd,
                 dict(BK=bwd["BK"], BL=bwd["BL"], BG=128, CAUSAL=True, OUTPUT_STEP=True)),
                (monarch_bwd, "_row_grad_kernel", bwd,
                 dict(BJ=bwd["BJ"], BI=bwd["BI"], BV=128, HAS_C=True, WITH_V=True)),
                (monarch_bwd, "_row_key_grad_kernel", bwd,
                 dict(BI=bwd["BI"], BJ=bwd["BJ"], BV=128, HAS_C=True, WITH_V=True))):
            kernels.append(Kernel(module, name, dict(consts, **head, PRECISION=cfg["PRECISION"]), cfg["num_warps"],
                                  dtype, num_stages=cfg["num_stages"]))
    kernels = _dedup(kernels)  # the backward's R step may use the forward's tiles
    kernels += [
        Kernel("kernels.modulation.triton", "_norm_modulate_kernel", dict(BC=4096, RMS=False, HAS_W=True), 16,
               "*bf16", _MOD_FP32, ("eps",)),
        Kernel("kernels.modulation.triton", "_norm_modulate_backward_kernel", dict(BC=4096, RMS=True, HAS_W=True),
               16, "*bf16", _MOD_FP32, ("eps",)),
        Kernel("kernels.modulation.triton", "_gate_residual_kernel", dict(BC=1024), 4, "*bf16", _MOD_FP32),
        Kernel("kernels.modulation.triton", "_gate_residual_backward_kernel", dict(BC=1024), 4, "*bf16", _MOD_FP32),
        Kernel("kernels.rope.triton", "_rope_kernel", dict(BR=32, BK=128, SIGN=1.0), 4, "*bf16", _ATTN_FP32),
    ]
    # Renderers: float32 throughout; the launchers' own constants are the configuration.
    tiles = {"offsets": "*i32", "ids": "*i32"}
    fwd_batch, fwd_warps = gs.forward_config(capability)
    kernels += [
        Kernel("renderers.gaussians.triton", "_rasterize_fwd_kernel",
               dict(TILE=16, BATCH=fwd_batch, D=3, DP=4), fwd_warps, pointers=tiles, floats=("alpha_cap",)),
        Kernel("renderers.gaussians.triton", "_rasterize_bwd_kernel",
               dict(TILE=16, BATCH=gs.BWD_BATCH, D=3, DP=4), gs.BWD_WARPS, pointers=tiles, floats=("alpha_cap",)),
        Kernel("renderers.gaussians4d.triton", "_slice_kernel", dict(BLOCK=gs4d.BLOCK), gs4d.WARPS,
               pointers={"out_keep": "*i8"}, floats=("t", "cull_threshold")),
    ]
    nerf = NerfConfig(aabb=[-1, -1, -1, 1, 1, 1])
    grid = nerf.grid
    hash_consts = dict(L=grid.n_levels, F=grid.n_features, BLOCK=hash_tri.BLOCK)
    kernels += [Kernel("renderers.nerf.hash_encoding.triton", name, hash_consts, 4, pointers={"meta": "*i64"})
                for name in ("_hash_encode_fwd_kernel", "_hash_encode_bwd_kernel")]
    H = nerf.hidden
    for n_in, n_mid, n_out, sigmoid in ((grid.n_output_dims, 0, 1 + nerf.n_geo_features, False),  # density
                                        (SH_DIMS + nerf.n_geo_features, 1, 3, True)):  # colour
        consts = dict(IN_P=max(16, 1 << (n_in - 1).bit_length()), H=H, OUT_P=max(16, 1 << (n_out - 1).bit_length()),
                      N_MID=n_mid, SIGMOID=sigmoid, BLOCK=mlp_tri.BLOCK)
        kernels.append(Kernel("renderers.nerf.mlp.triton", "_fused_mlp_kernel", consts, mlp_tri.WARPS))
    return kernels


_PTXAS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
                    r".*?Used (\d+) registers", re.S)


def compile_kernel(k: Kernel, target: Target) -> dict:
    """Compile ``k`` for ``target`` with ptxas; registers, spills and shared memory from its report."""
    import triton  # heavy: Triton's compiler

    fn = getattr(importlib.import_module(f"framegraph.{k.module}"), k.name)
    signature = {}
    for arg in fn.arg_names:
        if arg in k.constexprs:
            signature[arg] = "constexpr"
        elif arg.endswith("_ptr"):
            signature[arg] = next((t for p, t in k.pointers.items() if arg.startswith(p)), k.dtype)
        else:
            signature[arg] = "fp32" if arg in k.floats else "i32"
    log = io.StringIO()
    with knobs.nvidia.scope(), knobs.compilation.scope(), contextlib.redirect_stdout(log):
        knobs.nvidia.dump_ptxas_log = True  # ptxas -v: registers, stack frame and spills
        knobs.compilation.always_compile = True  # a cached kernel would print no report
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=k.constexprs),
                                  target=GPUTarget("cuda", target.capability, 32),
                                  options={"num_warps": k.num_warps, "num_stages": k.num_stages})
    found = _PTXAS.search(log.getvalue())
    if found is None:
        raise RuntimeError(f"no ptxas report for {k.label} on sm_{target.capability}: {log.getvalue()[-2000:]!r}")
    stack, spill_stores, spill_loads, registers = map(int, found.groups())
    shared = int(compiled.metadata.shared)
    return {
        "kernel": f"{k.module}.{k.name}", "dtype": k.dtype[1:], "num_warps": k.num_warps,
        "num_stages": k.num_stages,
        "constexprs": {n: v for n, v in k.constexprs.items()},
        "arch": f"sm_{target.capability}", "gpu": target.gpu,
        "registers": registers, "spill_store_bytes": spill_stores, "spill_load_bytes": spill_loads,
        "stack_frame_bytes": stack, "shared_bytes": shared, "shared_limit_bytes": target.shared_limit_bytes,
        "spills": spill_stores + spill_loads > 0, "fits": shared <= target.shared_limit_bytes,
    }


def _compile_job(job: tuple[Kernel, Target]) -> dict:
    return compile_kernel(*job)


def run(args: argparse.Namespace) -> int:
    if not triton_installed():
        raise ValueError("triton is not installed; `framegraph bench compile` compiles Triton kernels")
    if triton_interpret_enabled():
        raise ValueError("TRITON_INTERPRET=1 is set; Triton's interpreter cannot compile kernels — run with "
                         "TRITON_INTERPRET=0")
    targets = [t for t in TARGETS if t.capability in args.arch]
    jobs = [(k, target) for target in targets for k in registry(target.capability)]
    t0 = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(_compile_job, jobs))
    for r in results:
        bad = ("SPILLS " if r["spills"] else "") + ("DOES NOT FIT " if not r["fits"] else "")
        print(f"{r['arch']:>6} {r['kernel']} {r['dtype']}: {r['registers']} registers, "
              f"{r['spill_store_bytes']}+{r['spill_load_bytes']} B spilled, {r['shared_bytes']} B shared {bad}")
    failures = [r for r in results if r["spills"] or not r["fits"]]
    report = {**bench_metadata("compile"),
              "targets": [vars(t) for t in targets], "seconds": round(time.perf_counter() - t0, 1),
              "kernels": results, "failures": len(failures)}
    png = write_result(report, args.out, figure)
    print(f"{len(results)} compilations, {len(failures)} spill or do not fit; wrote {args.out} and {png}")
    return 1 if failures else 0


def figure(data: dict, plt):
    """Registers per thread of every kernel on every target; a kernel that spills or does not fit is red."""
    kernels = data["kernels"]
    archs = sorted({r["arch"] for r in kernels})
    names = sorted({f"{r['kernel']} {r['dtype']}" for r in kernels})
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(names) * len(archs) + 1.5))
    height = 0.8 / max(1, len(archs))
    for j, arch in enumerate(archs):
        by_name = {f"{r['kernel']} {r['dtype']}": r for r in kernels if r["arch"] == arch}
        for i, name in enumerate(names):
            r = by_name.get(name)
            if r is None:
                continue
            bad = r["spills"] or not r["fits"]
            ax.barh(i + j * height, r["registers"], height, color="tab:red" if bad else f"C{j}",
                    label=arch if i == 0 else None)
    ax.set_yticks([i + height * (len(archs) - 1) / 2 for i in range(len(names))], names, fontsize=7)
    ax.set_xlabel("registers per thread (red: spills or does not fit in shared memory)")
    ax.set_title(f"Triton kernels compiled offline: {data['failures']} of {len(kernels)} compilations fail")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
