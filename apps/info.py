"""``framegraph info``'s implementation: versions, devices and backends available on this machine.

It is also the machine description every benchmark JSON starts with."""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys

import av
import onnxruntime
import torch

from framegraph.kernels.backend import triton_available, triton_installed
from framegraph.stream.media import encoder_opens


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def collect() -> dict:
    """Everything a bug report or a benchmark JSON needs to say about the machine."""
    devices = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devices.append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                            "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count})
    encoders = {codec: encoder_opens(codec) for codec in ("libx264", "h264_nvenc", "aac", "mjpeg")}
    ort = onnxruntime.get_available_providers()
    return {
        "framegraph": _version("framegraph"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "versions": {d: _version(d) for d in ("torch", "triton", "av", "numpy", "diffusers", "gradio",
                                               "websockets", "onnxruntime", "onnxruntime-gpu")},
        "ffmpeg_libavcodec": ".".join(map(str, av.library_versions.get("libavcodec", ()))),
        "cuda": {"available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda, "devices": devices},
        "backends": {"triton_kernels": triton_available("cuda"),
                     "triton_interpreter": triton_installed(), "torch_reference": True,
                     "onnxruntime_providers": ort, "encoders": encoders},
    }


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def run(args: argparse.Namespace) -> int:
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"framegraph {info['framegraph']}  python {info['python']}  {info['platform']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v))
    print(f"ffmpeg libavcodec {info['ffmpeg_libavcodec']}")
    if info["cuda"]["devices"]:
        for d in info["cuda"]["devices"]:
            print(f"cuda:{d['index']} {d['name']} {d['memory_gib']} GiB (sm {d['capability']})")
    else:
        print(f"no CUDA device: CPU only ({info['cpu_count']} cores); kernels use their torch references")
    b = info["backends"]
    print(f"backends: triton kernels {'yes' if b['triton_kernels'] else 'no'}, triton interpreter "
          f"{'yes' if b['triton_interpreter'] else 'no'}, "
          f"onnxruntime {', '.join(b['onnxruntime_providers']) or 'none'}")
    print("encoders: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in b["encoders"].items()))
    return 0
