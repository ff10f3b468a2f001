"""The audio encoder on ONNX Runtime: its export and its runner.

Every avatar kind's ONNX runtime shares them.

- ``audio.onnx`` (:func:`export_audio_encoder`): the :class:`~.encoder.AudioEncoder` conv stack, ``log_mel float32 [1,
  n_mels, T] → features [1, D, T - R + 1]``. ``T`` is dynamic. The window holds the ``R - 1`` mel frames of context,
  the encoder's streaming state. The STFT front end stays in torch.
- :class:`OrtAudioEncoder`: the runner :class:`~.stage.AudioFeatures` takes as its engine.
"""
from __future__ import annotations

import os

import torch
from torch import nn

from framegraph.models.onnx import OrtGraph
from framegraph.models.onnx.trace import export_module


class AudioGraph(nn.Module):
    """``log_mel [1, n_mels, T]`` → ``features [1, D, T - R + 1]``: the encoder's forward."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, log_mel):
        return self.encoder(log_mel)


def export_audio_encoder(enc, out_dir: str) -> dict:
    """Write ``audio.onnx`` into ``out_dir`` and return its manifest entry.

    The file holds the encoder's conv stack. The STFT front end stays in torch.
    """
    mel = enc.silence(enc.receptive_field + 3)[None]
    export_module(AudioGraph(enc), (mel,), os.path.join(out_dir, "audio.onnx"), ["log_mel"], ["features"],
            {"log_mel": {2: "T"}, "features": {2: "T_out"}})
    return {"file": "audio.onnx", "receptive_field": enc.receptive_field,
            "inputs": [{"name": "log_mel", "shape": [1, enc.config.n_mels, "T"], "dtype": "float32",
                        "meaning": "log-mel frames: R - 1 frames of context (the streaming state), then the new ones"}],
            "outputs": [{"name": "features", "shape": [1, enc.feature_dim, "T - R + 1"], "dtype": "float32",
                         "meaning": "one feature vector per new mel frame"}]}



class OrtAudioEncoder:
    """``log_mel float32 [1, n_mels, T]`` → ``features [1, D, T - R + 1]`` on ORT.

    It is the callable :class:`~framegraph.models.audio.features.StreamingFeatures` takes as ``encode``.
    Its window is a column slice of the rolling mel context. So it is made dense first: one copy of ``n_mels × T``
    floats, a few KB.
    ORT writes the output straight into the returned tensor.
    """

    def __init__(self, graph: OrtGraph, receptive_field: int, feature_dim: int):
        self.graph, self.r, self.d = graph, receptive_field, feature_dim
        self.graphs = {"audio": graph}
        self.io = graph.binding()

    def __call__(self, log_mel: torch.Tensor) -> torch.Tensor:
        log_mel = log_mel.float().contiguous()
        out = torch.empty(1, self.d, log_mel.shape[-1] - self.r + 1)
        self.graph.bind(self.io, "log_mel", log_mel)
        self.graph.bind(self.io, "features", out, output=True)
        self.graph.run(self.io)
        return out


__all__ = ["export_audio_encoder", "OrtAudioEncoder"]
