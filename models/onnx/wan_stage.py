"""The generate pipeline's causal VAE decoder stage on ONNX Runtime (kept apart from :mod:`.stages`, the
avatar's, so that the avatar's ONNX backend does not import diffusers)."""
from __future__ import annotations

import torch

from framegraph.models.generate.stages import CausalVAEDecode

from .stages import default_threads
from .wan_vae import WanVAEExport


class OnnxCausalVAEDecode(CausalVAEDecode):
    """:class:`~framegraph.models.generate.stages.CausalVAEDecode` decoding on ORT (float32, CPU) from the
    export in ``export_dir`` (:func:`~.wan_vae.export_wan_vae` of ``vae`` at this frame size and
    ``chunk_frames``; a missing or stale one raises :class:`~.manifest.ExportError` naming the export
    command, with ``model`` as the folder in it), the decoder's cache bound in place between chunks. Same
    ports, pts, flags and counters as the torch stage; only the decode of a chunk differs."""

    def __init__(self, vae, export_dir: str, *, latent_size: tuple[int, int], chunk_frames: int, fps: float,
                 device: str = "cpu", dtype: torch.dtype = torch.float32, threads: int | None = None,
                 model: str = "MODEL_DIR", name: str = "vae_decode"):
        if dtype != torch.float32 or torch.device(device).type != "cpu":
            raise ValueError(f"OnnxCausalVAEDecode: the ONNX Runtime backend decodes float32 on the CPU; got "
                             f"{dtype} on {device} (use --device cpu, or --backend torch)")
        super().__init__(vae, latent_size=latent_size, chunk_frames=chunk_frames, fps=fps, device=device,
                         dtype=dtype, name=name)
        self.export = WanVAEExport(export_dir, vae, size=self.size, chunk_frames=chunk_frames, model=model)
        self.ort = self.export.stream(threads or default_threads())

    def setup(self, ctx):
        super().setup(ctx)
        self.ort.reset()

    def reset(self) -> None:
        super().reset()
        self.ort.reset()

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.ort.decode(latents)
