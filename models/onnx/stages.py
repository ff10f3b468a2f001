"""The avatar's stages with their compute on ONNX Runtime: same ports, same state semantics, same pts and
flags as the torch stages they extend; only the model calls go to ORT sessions bound to the stages'
tensors (see :mod:`.runtime`). Built by :func:`onnx_stages` from a checked export
(:class:`~.runtime.AvatarExport`).

Threads: each session gets ``threads`` intra-op threads; the audio stage 1 (20 ms chunks of small work),
the Denoiser and the decoder half the cores each by default — they run side by side on successive
frames, so two full-width pools would fight for the same cores.
"""
from __future__ import annotations

import os

import torch

from framegraph.models.audio import AudioFeatures
from framegraph.models.dit import Denoiser
from framegraph.models.sampler import sample_euler
from framegraph.models.vae import VAEDecode

from .runtime import AvatarExport, OrtAudioEncoder, OrtDiTStream, OrtVAEStream


def default_threads() -> int:
    """Intra-op threads for each of the two heavy stages: half the cores (at least 1)."""
    return max(1, (os.cpu_count() or 2) // 2)


class OnnxAudioFeatures(AudioFeatures):
    """:class:`AudioFeatures` with the encoder's conv stack on ORT (the STFT and the VAD as before)."""

    def __init__(self, export: AvatarExport, *, threads: int = 1, **kwargs):
        super().__init__(export.avatar.audio, **kwargs)
        self.encode = OrtAudioEncoder(export.graph("audio", threads), self.model.receptive_field,
                                      self.model.feature_dim)


class OnnxDenoiser(Denoiser):
    """:class:`Denoiser` whose denoising calls and commits run on ORT, the stream state bound in place."""

    def __init__(self, export: AvatarExport, reference: torch.Tensor, *, threads: int | None = None, **kwargs):
        super().__init__(export.avatar.dit, reference, **kwargs)
        if self.model.dtype != torch.float32:
            raise ValueError(f"OnnxDenoiser: the export is float32; the model is {self.model.dtype}")
        if str(self._device) != "cpu":
            raise ValueError(f"OnnxDenoiser: the ONNX Runtime backend runs on the CPU; got device={self._device!r}")
        n = threads or default_threads()
        self._graphs = (export.graph("dit_velocity", n), export.graph("dit_commit", n))
        self.ort: OrtDiTStream | None = None

    def setup(self, ctx):
        super().setup(ctx)  # builds the torch stream state (identity keys / values): set A of the ORT state
        self.ort = OrtDiTStream(self.model, self.stream, *self._graphs)

    def reset(self) -> None:
        super().reset()
        if self.ort is not None:
            self.ort.reset()

    def _generate(self, noise, audio, labels, steps):
        x0 = sample_euler(lambda x, t: self.ort.velocity(x, t, audio, labels), noise, steps=steps, shift=self.shift)
        self.ort.commit(x0, audio, labels)
        return x0


class OnnxVAEDecode(VAEDecode):
    """:class:`VAEDecode` decoding on ORT, the temporal cache and reference features bound in place."""

    def __init__(self, export: AvatarExport, *, threads: int | None = None, **kwargs):
        super().__init__(export.avatar.vae, **kwargs)
        if self.dtype != torch.float32 or str(kwargs.get("device", "cpu")) != "cpu":
            raise ValueError("OnnxVAEDecode: the ONNX Runtime backend decodes float32 on the CPU")
        files = export.manifest["files"]
        n = threads or default_threads()
        self.ort = OrtVAEStream(export.graph("vae_first", n), export.graph("vae_next", n), files, self.reference)

    def reset(self) -> None:
        super().reset()
        self.ort.reset()

    def setup(self, ctx):
        super().setup(ctx)
        self.ort.reset()

    def _decode(self, z):
        return self.ort.decode(z)


def onnx_stages(avatar, export_dir: str, *, fps: float, vad: bool, denoiser: dict, decode: dict,
                threads: int | None = None, int8: bool = False) -> tuple[AudioFeatures, Denoiser, VAEDecode]:
    """The three ORT stages of ``avatar`` from the export in ``export_dir`` (checked against the bundle:
    :class:`~.manifest.ExportError` when missing, stale or foreign). ``denoiser`` / ``decode``: the keyword
    arguments of :class:`Denoiser` / :class:`VAEDecode` (the models come from the export's bundle).
    ``threads``: intra-op threads of the Denoiser's and the decoder's sessions (None: :func:`default_threads`).
    ``int8``: the models the export keeps in int8 run their int8 files (:mod:`.quantize`), the others float32."""
    export = AvatarExport(export_dir, avatar, int8=int8)
    return (OnnxAudioFeatures(export, fps=fps, vad=vad),
            OnnxDenoiser(export, avatar.reference_latent(), threads=threads, **denoiser),
            OnnxVAEDecode(export, threads=threads, **decode))
