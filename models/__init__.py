"""Models: audio features, video VAE, linear-DiT denoiser, samplers, the avatar."""
