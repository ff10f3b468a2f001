"""Neural renderers: 3D/4D Gaussian splatting, NeRF, cameras."""
