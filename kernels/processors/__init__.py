"""diffusers attention processors backed by framegraph kernels (swap attention without touching a model)."""
