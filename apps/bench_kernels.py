"""``framegraph bench kernels``: time framegraph's kernels against a peer in the same process.

For each op the median time of framegraph's implementation (``backend="auto"``: Triton on CUDA, the torch
reference elsewhere) is compared with peers run on the same inputs:

- ``block_linear_attention``: the naive torch reference, and fla's ``chunk_linear_attn`` when ``fla``
  imports (token-causal rather than block-causal, so a speed peer, not an equivalent);
- ``norm_modulate``, ``gate_residual``, ``apply_rope``: the unfused torch sequence diffusers runs.

Writes JSON (device, versions, the exact command line, git commit, shapes, median ms, ratio to each
peer, achieved TB/s and TFLOP/s with the fraction of the device's peak) and a PNG plot beside it.
CUDA timings use CUDA events after warm-up; CPU timings use ``perf_counter`` (small shapes with
``--tiny``), so the command runs, honestly labelled, anywhere.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

OPS = ("block_linear_attention", "norm_modulate", "gate_residual", "apply_rope")

# Dense peaks of the devices we report against: (TB/s, bf16 TFLOP/s).
PEAKS = {"H200": (4.8, 989.0), "H100": (3.35, 989.0)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("benchmarks/kernels.json"), help="JSON file to write (PNG beside it)")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                        help="input dtype (default: bfloat16 on CUDA, float32 on CPU)")
    parser.add_argument("--iters", type=int, default=100, help="timed iterations per measurement (median reported)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--backward", action="store_true", help="also time forward+backward")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke test)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=20)
    parser.add_argument("--head-dim", type=int, default=112)
    parser.add_argument("--frames", type=int, default=8, help="latent frames (tokens = frames * block size)")
    parser.add_argument("--block-size", type=int, default=1560, help="tokens per block (480p Sana-Video frame: 30x52)")
    parser.add_argument("--channels", type=int, default=2240, help="model width for the elementwise ops")


def run(args: argparse.Namespace) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.tiny:
        args.batch, args.heads, args.head_dim, args.frames, args.block_size, args.channels = 1, 2, 16, 4, 16, 64
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    timer = _cuda_timer if device.type == "cuda" else _cpu_timer

    results = []
    for op in args.ops:
        for backward in (False, True) if args.backward else (False,):
            results.append(BENCHES[op](args, device, dtype, backward, timer))

    report = {
        "device": _device_name(device),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "python": platform.python_version(),
        "command": list(sys.argv),
        "git_commit": _git_commit(),
        "dtype": str(dtype).replace("torch.", ""),
        "iters": args.iters,
        "warmup": args.warmup,
        "timer": "cuda events" if device.type == "cuda" else "perf_counter",
        "peak": _peak(device),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    plot = args.out.with_suffix(".png")
    _plot(report, plot)
    for r in results:
        peers = ", ".join(f"{name} {ms:.3f} ms" for name, ms in r["peers_ms"].items())
        print(f"{r['op']:>24} {r['pass']:<16} {r['median_ms']:.3f} ms ({r['implementation']}) | {peers}")
    print(f"wrote {args.out} and {plot}")
    return 0


# ----------------------------------------------------------------------------- timing


def _cuda_timer(fn: Callable[[], object], iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _cpu_timer(fn: Callable[[], object], iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _with_backward(fn: Callable[[], torch.Tensor | tuple], leaves: list[torch.Tensor]) -> Callable[[], None]:
    def step():
        out = fn()
        out = out[0] if isinstance(out, tuple) else out
        torch.autograd.grad(out.float().sum(), leaves)

    return step


def _measure(args, timer, ours, peers: dict, leaves, backward: bool, bytes_moved: float, flops: float, shapes: dict, op: str):
    if backward:
        ours = _with_backward(ours, leaves)
        peers = {name: _with_backward(fn, leaves) for name, fn in peers.items()}
        bytes_moved, flops = 2.5 * bytes_moved, 3.0 * flops  # forward + backward, rough minimums
    median = timer(ours, args.iters, args.warmup)
    peers_ms = {name: timer(fn, args.iters, args.warmup) for name, fn in peers.items()}
    device = leaves[0].device
    peak_tb_s, peak_tflop_s = _peak(device) or (None, None)
    tb_s = bytes_moved / (median * 1e-3) / 1e12
    tflop_s = flops / (median * 1e-3) / 1e12
    return {
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


def bench_block_linear_attention(args, device, dtype, backward, timer):
    from framegraph.kernels.block_linear_attention import block_linear_attention

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
        from fla.ops.linear_attn import chunk_linear_attn

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
    return _measure(args, timer, ours, peers, [q, k, v], backward, bytes_moved, flops, shapes, "block_linear_attention")


def bench_norm_modulate(args, device, dtype, backward, timer):
    from framegraph.kernels.modulation import norm_modulate

    B, N, C = args.batch, args.frames * args.block_size, args.channels
    x = _leaf((B, N, C), device, dtype, backward)
    scale, shift = (_leaf((B, 1, C), device, dtype, backward) for _ in range(2))

    def ours():
        return norm_modulate(x, scale, shift, norm="layer", eps=1e-6)

    def unfused():  # SanaVideoTransformerBlock: norm1(x) * (1 + scale_msa) + shift_msa
        return F.layer_norm(x, (C,), eps=1e-6) * (1 + scale) + shift

    bytes_moved = 2 * B * N * C * x.element_size()
    shapes = {"x": [B, N, C], "scale": [B, 1, C], "shift": [B, 1, C], "norm": "layer"}
    return _measure(args, timer, ours, {"torch_unfused": unfused}, [x, scale, shift], backward, bytes_moved,
                    8 * B * N * C, shapes, "norm_modulate")


def bench_gate_residual(args, device, dtype, backward, timer):
    from framegraph.kernels.modulation import gate_residual

    B, N, C = args.batch, args.frames * args.block_size, args.channels
    x, y = (_leaf((B, N, C), device, dtype, backward) for _ in range(2))
    gate = _leaf((B, 1, C), device, dtype, backward)

    def ours():
        return gate_residual(x, y, gate)

    def unfused():
        return x + gate * y

    shapes = {"x": [B, N, C], "y": [B, N, C], "gate": [B, 1, C]}
    return _measure(args, timer, ours, {"torch_unfused": unfused}, [x, y, gate], backward,
                    3 * B * N * C * x.element_size(), 2 * B * N * C, shapes, "gate_residual")


def bench_apply_rope(args, device, dtype, backward, timer):
    from framegraph.kernels.rope import apply_rope

    B, H, D, N = args.batch, args.heads, args.head_dim, args.frames * args.block_size
    x = _leaf((B, N, H, D), device, dtype, backward)  # diffusers' layout
    angles = torch.randn(1, N, 1, D // 2, device=device).repeat_interleave(2, -1)
    cos, sin = angles.cos(), angles.sin()

    def ours():
        return apply_rope(x, cos, sin)

    def diffusers_style():  # apply_rotary_emb of SanaLinearAttnProcessor3_0
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        c, s = cos[..., 0::2], sin[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x1 * c - x2 * s
        out[..., 1::2] = x1 * s + x2 * c
        return out

    shapes = {"x": [B, N, H, D], "cos": [1, N, 1, D]}
    return _measure(args, timer, ours, {"torch_unfused": diffusers_style}, [x], backward,
                    2 * B * N * H * D * x.element_size(), 3 * B * N * H * D, shapes, "apply_rope")


BENCHES = {
    "block_linear_attention": bench_block_linear_attention,
    "norm_modulate": bench_norm_modulate,
    "gate_residual": bench_gate_residual,
    "apply_rope": bench_apply_rope,
}


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


def _triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).resolve().parent
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
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
    ax.set_title(f"{report['device']} — {report['dtype']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
