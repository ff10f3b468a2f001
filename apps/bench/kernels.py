"""``framegraph bench kernels``: time framegraph's kernels against a peer in the same process.

For each op, framegraph's median time is compared with peers. The peers run on the same inputs. Framegraph
runs with ``backend="auto"``: Triton on CUDA, the torch reference elsewhere. The peers:

- ``block_linear_attention``: the naive torch reference, and fla's ``chunk_linear_attn`` when ``fla``
  imports. That one is token-causal, not block-causal. So it is a speed peer, not an equivalent.
- ``norm_modulate``, ``gate_residual``, ``apply_rope``: the unfused torch sequence diffusers runs.
- ``monarch_attention``: exact ``scaled_dot_product_attention``, which the op approximates. It also records
  the approximation error, relative L2 vs SDPA. That is for ``num_iters`` 1..3, on video-like and on random
  q/k/v.

It writes JSON and a PNG plot beside it. The JSON holds the device, versions and the exact command line.
It holds the git commit, shapes, median ms and the ratio to each peer. It also holds achieved TB/s and
TFLOP/s. Each is a fraction of the device's peaks, as measured in the same run. Each is also a fraction of
its datasheet's. The measured peaks are copy bandwidth and bf16 matmul throughput. See
:func:`~.timing.measure_peaks`.

Timing is :func:`~.timing.do_bench`. On CUDA it makes ≥ ``--warmup-ms`` of untimed calls, then ≥ ``--rep-ms``
of repetitions. Each repetition follows an L2 flush and sits between its own CUDA events. An op that can be
captured is also replayed from a CUDA graph. That is ``graph_ms``, with no launch overhead. On a CPU it uses
``perf_counter``, with small shapes under ``--tiny``. So the command runs anywhere, honestly labelled.
"""
from __future__ import annotations

import argparse
import platform
from collections.abc import Callable

import torch
import torch.nn.functional as F

from framegraph.kernels.block_linear_attention import block_linear_attention
from framegraph.kernels.modulation import gate_residual, norm_modulate
from framegraph.kernels.monarch_attention import monarch_attention
from framegraph.kernels.monarch_attention.reference import token_causal_mask
from framegraph.kernels.rope import apply_rope
from framegraph.kernels.rope.reference import diffusers_apply_rotary_emb
from framegraph.models.runtime import default_device
from framegraph.stream.files import write_json

from ..commands.bench.kernels import Op
from .meta import bench_metadata, write_result
from .timing import do_bench, measure_peaks

# Dense peaks of the devices we report against: (TB/s, bf16 TFLOP/s).
PEAKS = {"H200": (4.8, 989.0), "H100": (3.35, 989.0)}


def run(args: argparse.Namespace) -> int:
    device = torch.device(default_device())
    if args.tiny:
        args.batch, args.heads, args.head_dim, args.frames, args.block_size, args.channels = 1, 2, 16, 4, 16, 64
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))

    args.measured = None if args.no_peaks else measure_peaks(device)
    results = []
    meta = bench_metadata("kernels")
    for op in args.ops:
        for backward in (False, True) if args.backward else (False,):
            print(f"{op} {'forward+backward' if backward else 'forward'} ...", flush=True)  # progress
            results.append(OP_BENCHES[op](args, device, dtype, backward))
            # each case on disk at once: a run cut at a deadline (a GPU lease) keeps what it measured
            write_json(args.out, meta | {"partial": "cut before the last case", "measured_peaks": args.measured,
                                         "results": results})

    report = meta | {
        "device": _device_name(device),
        "torch": meta["versions"]["torch"],
        "triton": meta["versions"]["triton"],
        "dtype": str(dtype).replace("torch.", ""),
        "iters": args.iters,
        "warmup": args.warmup,
        "warmup_ms": args.warmup_ms,
        "rep_ms": args.rep_ms,
        "timer": ("do_bench: CUDA events per call after an L2 flush (+ CUDA-graph replay where capturable)"
                  if device.type == "cuda" else "do_bench: perf_counter per call"),
        "peak": _peak(device),
        "measured_peaks": args.measured,
        "results": results,
    }
    plot = write_result(report, args.out, figure)
    for r in results:
        peers = ", ".join(f"{name} {ms:.3f} ms" for name, ms in r["peers_ms"].items())
        print(f"{r['op']:>24} {r['pass']:<16} {r['median_ms']:.3f} ms ({r['implementation']}) | {peers}")
    print(f"wrote {args.out} and {plot}")
    return 0


# ----------------------------------------------------------------------------- timing


def _timed(fn: Callable[[], object], args, device: torch.device) -> dict:
    """:func:`~.timing.do_bench` of ``fn`` with the run's budgets. ``args.warmup`` extra untimed calls come first."""
    for _ in range(args.warmup):
        fn()
    return do_bench(fn, device, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, max_reps=args.iters)


def _with_backward(fn: Callable[[], torch.Tensor | tuple], leaves: list[torch.Tensor]) -> Callable[[], None]:
    def step():
        out = fn()
        out = out[0] if isinstance(out, tuple) else out
        torch.autograd.grad(out.float().sum(), leaves)

    return step


def _measure(args, ours, peers: dict, leaves, backward: bool, bytes_moved: float, flops: float, shapes: dict, op: Op):
    if backward:
        ours = _with_backward(ours, leaves)
        peers = {name: _with_backward(fn, leaves) for name, fn in peers.items()}
        bytes_moved, flops = 2.5 * bytes_moved, 3.0 * flops  # forward + backward, rough minimums
    device = leaves[0].device
    timing = _timed(ours, args, device)
    median = timing["median_ms"]
    peer_timing = {name: _timed(fn, args, device) for name, fn in peers.items()}
    peers_ms = {name: t["median_ms"] for name, t in peer_timing.items()}
    peak_tb_s, peak_tflop_s = _peak(device) or (None, None)
    tb_s = bytes_moved / (median * 1e-3) / 1e12
    tflop_s = flops / (median * 1e-3) / 1e12
    measured = getattr(args, "measured", None) or {}
    return {
        "timing": timing,
        "peers_graph_ms": {name: t.get("graph_ms") for name, t in peer_timing.items()},
        "fraction_of_measured_copy_bandwidth": tb_s / measured["copy_tb_s"] if measured else None,
        "fraction_of_measured_matmul": tflop_s / measured["matmul_tflop_s"] if measured else None,
        "op": op,
        "pass": "forward+backward" if backward else "forward",
        "implementation": "triton" if device.type == "cuda" else "torch reference (no CUDA)",
        "shapes": shapes,
        "median_ms": median,
        "peers_ms": peers_ms,
        "speedup_vs_peer": {name: ms / median for name, ms in peers_ms.items()},
        "bytes_moved": bytes_moved,
        "flops": flops,
        "achieved_tb_s": tb_s,
        "achieved_tflop_s": tflop_s,
        "fraction_of_peak_bandwidth": tb_s / peak_tb_s if peak_tb_s else None,
        "fraction_of_peak_flops": tflop_s / peak_tflop_s if peak_tflop_s else None,
    }


# ----------------------------------------------------------------------------- ops


def _leaf(shape, device, dtype, grad: bool) -> torch.Tensor:
    return torch.randn(shape, device=device, dtype=dtype).requires_grad_(grad)


def bench_block_linear_attention(args, device, dtype, backward):
    B, H, D = args.batch, args.heads, args.head_dim
    N, block = args.frames * args.block_size, args.block_size
    q, k, v = (_leaf((B, H, N, D), device, dtype, backward) for _ in range(3))
    angles = torch.randn(1, 1, N, D // 2, device=device).repeat_interleave(2, -1)
    rope = (angles.cos(), angles.sin())

    def ours():
        return block_linear_attention(q, k, v, block_size=block, rope=rope)

    def reference():
        return block_linear_attention(q, k, v, block_size=block, rope=rope, backend="torch")

    peers = {"torch_reference": reference}
    try:
        from fla.ops.linear_attn import chunk_linear_attn  # optional: a peer measured when installed

        if device.type == "cuda":

            def fla_chunk():  # fla's layout is [B, N, H, D]; the transposes are part of the timed call
                qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (F.relu(q), F.relu(k), v))
                return chunk_linear_attn(qt, kt, vt, scale=1.0, normalize=True)

            peers["fla_chunk_linear_attn"] = fla_chunk
    except ImportError:
        pass

    element = q.element_size()
    bytes_moved = 4 * B * H * N * D * element  # read q, k, v; write out
    flops = 4 * B * H * N * D * D  # state update + numerator (denominator is O(D))
    shapes = {"q": [B, H, N, D], "k": [B, H, N, D], "v": [B, H, N, D], "block_size": block, "rope": True}
    return _measure(args, ours, peers, [q, k, v], backward, bytes_moved, flops, shapes, "block_linear_attention")


def bench_norm_modulate(args, device, dtype, backward):
    B, N, C = args.batch, args.frames * args.block_size, args.channels
    x = _leaf((B, N, C), device, dtype, backward)
    scale, shift = (_leaf((B, 1, C), device, dtype, backward) for _ in range(2))

    def ours():
        return norm_modulate(x, scale, shift, norm="layer", eps=1e-6)

    def unfused():  # SanaVideoTransformerBlock: norm1(x) * (1 + scale_msa) + shift_msa
        return F.layer_norm(x, (C,), eps=1e-6) * (1 + scale) + shift

    bytes_moved = 2 * B * N * C * x.element_size()
    shapes = {"x": [B, N, C], "scale": [B, 1, C], "shift": [B, 1, C], "norm": "layer"}
    return _measure(args, ours, {"torch_unfused": unfused}, [x, scale, shift], backward, bytes_moved,
                    8 * B * N * C, shapes, "norm_modulate")


def bench_gate_residual(args, device, dtype, backward):
    B, N, C = args.batch, args.frames * args.block_size, args.channels
    x, y = (_leaf((B, N, C), device, dtype, backward) for _ in range(2))
    gate = _leaf((B, 1, C), device, dtype, backward)

    def ours():
        return gate_residual(x, y, gate)

    def unfused():
        return x + gate * y

    shapes = {"x": [B, N, C], "y": [B, N, C], "gate": [B, 1, C]}
    return _measure(args, ours, {"torch_unfused": unfused}, [x, y, gate], backward,
                    3 * B * N * C * x.element_size(), 2 * B * N * C, shapes, "gate_residual")


def bench_apply_rope(args, device, dtype, backward):
    B, H, D, N = args.batch, args.heads, args.head_dim, args.frames * args.block_size
    x = _leaf((B, N, H, D), device, dtype, backward)  # diffusers' layout
    angles = torch.randn(1, N, 1, D // 2, device=device).repeat_interleave(2, -1)
    cos, sin = angles.cos(), angles.sin()

    def ours():
        return apply_rope(x, cos, sin)

    def diffusers_style():  # apply_rotary_emb of SanaLinearAttnProcessor3_0
        return diffusers_apply_rotary_emb(x, cos, sin)

    shapes = {"x": [B, N, H, D], "cos": [1, N, 1, D]}
    return _measure(args, ours, {"torch_unfused": diffusers_style}, [x], backward,
                    2 * B * N * H * D * x.element_size(), 3 * B * N * H * D, shapes, "apply_rope")


OP_BENCHES = {
    "block_linear_attention": bench_block_linear_attention,
    "norm_modulate": bench_norm_modulate,
    "gate_residual": bench_gate_residual,
    "apply_rope": bench_apply_rope,
}


# ----------------------------------------------------------------------------- Monarch attention
# Time vs exact SDPA in the same process, and how well the Monarch fit approximates softmax attention on
# video-like q/k/v (smooth in space and time) and on i.i.d. noise, for num_iters 1..3.

MONARCH_TINY_GRID = (4, 8, 16)


def video_like_qkv(shape, grid, generator, sharpness: float = 2.0, noise: float = 0.3):
    """q, k, v ``[B, H, N, D]`` from one low-frequency random field over ``(f, y, x)`` plus noise.

    The field is trilinear-upsampled Gaussian noise. It has about one control point per 2 frames and per 4 rows
    or columns. The q and k are the field seen through nearby random projections. So tokens attend to tokens
    with similar content. Those are mostly their neighbours in space and time, as in video DiTs. The v is its
    own smooth field.
    ``sharpness`` scales q and k, for peakier attention.
    """
    B, H, N, D = shape
    frames, height, width = grid
    coarse = [max(2, frames // 2), max(2, height // 4), max(2, width // 4)]

    def field():
        x = torch.randn(B * H, D, *coarse, generator=generator)
        x = F.interpolate(x, size=(frames, height, width), mode="trilinear", align_corners=True)
        x = x / x.std()
        return x.flatten(2).transpose(1, 2).reshape(B, H, N, D)

    base = field()
    proj = torch.eye(D) + 0.3 * torch.randn(D, D, generator=generator)
    q = sharpness * (base @ proj + noise * torch.randn(B, H, N, D, generator=generator))
    k = sharpness * (base @ proj + noise * torch.randn(B, H, N, D, generator=generator))
    v = field() + 0.1 * torch.randn(B, H, N, D, generator=generator)
    return q, k, v


def monarch_approximation_errors(shape, grid, device, dtype, block_causal: bool = False) -> dict:
    """Relative L2 error ``|monarch - sdpa| / |sdpa|`` per input kind and ``num_iters`` (1..3)."""
    g = torch.Generator().manual_seed(0)
    kinds = {
        "video_like": video_like_qkv(shape, grid, g),
        "random": tuple(torch.randn(shape, generator=g) for _ in range(3)),
    }
    mask = token_causal_mask(grid, device) if block_causal else None
    errors = {}
    with torch.no_grad():
        for kind, tensors in kinds.items():
            q, k, v = (t.to(device, dtype) for t in tensors)
            exact = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).float()
            errors[kind] = {
                str(n): ((monarch_attention(q, k, v, grid=grid, num_iters=n, block_causal=block_causal).float()
                          - exact).norm() / exact.norm()).item()
                for n in (1, 2, 3)
            }
    return errors


def bench_monarch_attention(args, device, dtype, backward):
    grid = MONARCH_TINY_GRID if args.tiny else tuple(args.monarch_grid)
    B, H, D = args.batch, args.heads, args.head_dim
    N = grid[0] * grid[1] * grid[2]
    rows, width = grid[0] * grid[1], grid[2]
    q, k, v = (_leaf((B, H, N, D), device, dtype, backward) for _ in range(3))
    iters = args.monarch_iters

    def ours():
        return monarch_attention(q, k, v, grid=grid, num_iters=iters)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v)

    element = q.element_size()
    # q, k, v in, out; per iteration fp32 intermediates a_L, a_R, y (~N D each) written and read back
    bytes_moved = B * H * N * D * (4 * element + iters * 3 * 2 * 4)
    # per iteration: row step 4 N Ww D (scores + weighted keys), column steps 6 N (F Hh) D; output ~2 N (F Hh + Ww) D
    flops = B * H * N * D * (iters * (4 * width + 6 * rows) + 2 * (rows + width))
    shapes = {"q": [B, H, N, D], "k": [B, H, N, D], "v": [B, H, N, D], "grid": list(grid), "num_iters": iters,
              "block_causal": False}
    result = _measure(args, ours, {"sdpa_exact": sdpa}, [q, k, v], backward, bytes_moved, flops, shapes,
                      "monarch_attention")
    result["flops_note"] = "approximate count of the Monarch fit; SDPA does 4 N^2 D per head"
    if not backward:  # accuracy does not depend on the pass; measured once, on fresh inputs of the same shape
        approx_grid = grid if N <= 8192 or device.type == "cuda" else MONARCH_TINY_GRID
        approx_shape = (1, min(H, 4), approx_grid[0] * approx_grid[1] * approx_grid[2], D)
        result["approximation"] = {
            "metric": "relative L2 error of the output vs scaled_dot_product_attention, per num_iters",
            "shape": list(approx_shape),
            "grid": list(approx_grid),
            "bidirectional": monarch_approximation_errors(approx_shape, approx_grid, device, dtype),
            "block_causal": monarch_approximation_errors(approx_shape, approx_grid, device, dtype, block_causal=True),
        }
        for mode in ("bidirectional", "block_causal"):
            for kind, errs in result["approximation"][mode].items():
                print(f"{'monarch_attention':>24} rel. L2 error vs SDPA, {mode}, {kind:<10} "
                      + ", ".join(f"iters={n}: {e:.4f}" for n, e in errs.items()))
    return result


OP_BENCHES["monarch_attention"] = bench_monarch_attention


# ----------------------------------------------------------------------------- report helpers


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _peak(device: torch.device):
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAKS.items():
        if key in name:
            return list(peak)
    return None


def figure(data: dict, plt):
    """Median ms of framegraph's implementation and of each peer, per op and pass (log scale)."""
    results = data["results"]
    labels = [f"{r['op']}\n{r['pass']}" for r in results]
    names = ["framegraph"] + sorted({name for r in results for name in r["peers_ms"]})
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(results)), 4))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [r["median_ms"] if name == "framegraph" else r["peers_ms"].get(name, 0.0) for r in results]
        ax.bar([j + i * width for j in range(len(results))], values, width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(results))], labels, fontsize=8)
    ax.set_ylabel("median ms (lower is better)")
    ax.set_yscale("log")
    ax.set_title(f"{data['device']} — {data['dtype']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
