"""int8 versions of an export's ONNX files, made with ``onnxruntime.quantization``.

:func:`quantize_file` writes the int8 version of one float32 file. The file's ONNX metadata holds the hash of
the models it came from, under :data:`~.manifest.BUNDLE_KEY`. So a file of other models copied into an export
folder is refused by :func:`~.manifest.check_int8_file`. Which files an export keeps in int8, and how they are
calibrated, is the model's business. The avatar's choice is in :mod:`framegraph.models.avatar.int8`.

Only the weight-heavy ops are quantized: ``Conv``, ``MatMul`` and ``Gemm``. The elementwise maths and the
norms stay float32. There are two modes:

- ``dynamic``, with :func:`onnxruntime.quantization.quantize_dynamic`. Weights are int8. Activations are
  quantized per call from their own range, as ``ConvInteger`` / ``MatMulInteger``. It needs no data.
- ``static``, with :func:`onnxruntime.quantization.quantize_static`. It writes QDQ with per-channel weights.
  Activation ranges are calibrated as min / max on real inputs. Those inputs are what a session read at each
  call (:attr:`~.session.OrtGraph.record`), served by a :class:`FeedReader`.
"""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile

import numpy as np

from .manifest import BUNDLE_KEY

MODES = ("dynamic", "static")
OPS = ["Conv", "MatMul", "Gemm"]  # what is quantized; everything else stays float32
CALIBRATION_FEEDS = 48  # calls per part used for the static calibration (evenly spread over the recording)


def int8_file(part_file: str) -> str:
    """``dit_velocity.onnx`` → ``dit_velocity.int8.onnx``."""
    root, ext = os.path.splitext(part_file)
    return f"{root}.int8{ext}"


class FeedReader:
    """A calibration data reader over recorded feeds.

    It has ``get_next`` and ``rewind``, which ``quantize_static`` asks for. It yields at most ``limit`` feeds,
    taken evenly over the recording."""

    def __init__(self, feeds: list[dict], limit: int = CALIBRATION_FEEDS):
        if not feeds:
            raise ValueError("FeedReader: no recorded calls to calibrate on (was the clip long enough?)")
        idx = np.unique(np.linspace(0, len(feeds) - 1, min(limit, len(feeds))).round().astype(int))
        self.feeds = [feeds[i] for i in idx]
        self.i = 0

    def get_next(self):
        if self.i >= len(self.feeds):
            return None
        self.i += 1
        return self.feeds[self.i - 1]

    def rewind(self):
        self.i = 0


@contextlib.contextmanager
def _quiet_preprocess_hint():
    """Drop onnxruntime.quantization's root-logger hint to run its pre-processing.

    That pre-processing is shape inference and fusions. These graphs are traced with fixed shapes. They are
    optimised when the session loads."""

    class Hint(logging.Filter):
        def filter(self, record):
            return "pre-processing before quantization" not in record.getMessage()

    root, hint = logging.getLogger(), Hint()
    root.addFilter(hint)
    try:
        yield
    finally:
        root.removeFilter(hint)


def quantize_file(src: str, dst: str, mode: str, bundle_hash: str, feeds: list[dict] | None = None) -> None:
    """Write the int8 version of ``src`` to ``dst``, with ``bundle_hash`` in its metadata.

    ``mode`` is one of the modes in the module docstring. ``static`` needs ``feeds``, the part's recorded
    inputs."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    if mode not in MODES:
        raise ValueError(f"int8 mode {mode!r}; expected one of {MODES}")
    with tempfile.TemporaryDirectory(prefix="fg-int8-") as tmp, _quiet_preprocess_hint():
        out = os.path.join(tmp, "q.onnx")
        if mode == "dynamic":
            quantize_dynamic(src, out, op_types_to_quantize=OPS, weight_type=QuantType.QInt8, per_channel=False)
        else:

            class Reader(FeedReader, CalibrationDataReader):
                pass

            quantize_static(
                src,
                out,
                Reader(feeds or []),
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=OPS,
                per_channel=True,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                extra_options={"CalibTensorRangeSymmetric": False},
            )
        model = onnx.load(out)
        meta = {p.key: p.value for p in model.metadata_props}
        meta.update({BUNDLE_KEY: bundle_hash, "framegraph.int8": mode, "framegraph.source": os.path.basename(src)})
        del model.metadata_props[:]
        for k, v in meta.items():
            model.metadata_props.add(key=k, value=v)
        onnx.save(model, dst)


__all__ = ["MODES", "OPS", "CALIBRATION_FEEDS", "int8_file", "FeedReader", "quantize_file"]
