"""The video VAE of the avatar, its training, and the ``VAEDecode`` stage.

The VAE is a causal autoencoder for the face region. It compresses 16× in space.

    from framegraph.models.vae import VideoVAE, VAEDecode, train_vae

- :mod:`.model`: ``VideoVAE``, a diffusers-format ``PretrainedModel``. It encodes and decodes in a stream,
  with explicit caches. It holds the identity reference and the reference warp (``with_reference_warp``).
- :mod:`.register`: batched affine registration by Lucas–Kanade. It finds the head pose of a drawn frame.
- :mod:`.losses`: SSIM, PSNR, KL, the mouth-weighted reconstruction loss.
- :mod:`.data`: synthetic clips cut to the face region, per-frame mouth boxes, redrawn targets.
- :mod:`.train`: ``train_vae`` and its settings ``VAETrainConfig``. It has checkpoints, resume and held-out
  PSNR. It can train the decoder only, and add latent noise.
- :mod:`.stage`: ``VAEDecode``. It maps latent chunks to face frames, with a pts per frame.
- :mod:`.batch`: many sessions' decoder streams, one batch per chunk, through a model service's lane.
"""
from .data import (
                   FaceClips,
                   box_to_region,
                   crop_frames,
                   face_clips_from_frames,
                   face_crop_box,
                   load_face_clips,
                   mouth_box_for_frame,
                   redrawable,
                   region_size,
)
from .losses import box_mask, kl_divergence, reconstruction_loss, ssim, ssim_map
from .model import Cache, CausalTemporalConv, VideoVAE, frames_to_uint8, uint8_to_frames, with_reference_warp
from .stage import ChunkDecodeStage, TorchVAE, VAEDecode, VAEEngine, remember_reference, stream_start
from .train import VAETrainConfig, VAETrainResult, evaluate_vae, measure_latent_stats, reference_region, train_vae

__all__ = [
    "FaceClips", "box_to_region", "crop_frames", "face_clips_from_frames", "face_crop_box", "load_face_clips",
    "redrawable", "region_size",
    "mouth_box_for_frame", "box_mask", "kl_divergence", "reconstruction_loss", "ssim", "ssim_map", "Cache",
    "CausalTemporalConv", "VideoVAE", "frames_to_uint8", "uint8_to_frames", "ChunkDecodeStage", "VAEDecode",
    "VAEEngine", "TorchVAE", "stream_start", "remember_reference",
    "VAETrainConfig", "VAETrainResult", "evaluate_vae", "measure_latent_stats", "reference_region",
    "train_vae", "with_reference_warp",
]
