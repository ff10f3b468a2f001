"""MuseTalk 1.5, the field's open lip-sync model, run from the user's own files (nothing downloaded).

- :mod:`.files`: its released layout (the UNet's ``musetalk.json`` and ``unet.pth``, ``sd-vae/``, ``whisper/``),
  found, checked and loaded into the stock diffusers / transformers classes.
- :mod:`.audio`: Whisper's every-layer features at 50 Hz and the 10-row window each video frame attends to.
- :mod:`.hearing`: the same windows live — Whisper on a sliding window, each frame's context as its audio arrives.
- :mod:`.step`: one frame — the masked and whole face's latents, the UNet at timestep 0, the VAE decode.
- :mod:`.face`: MuseTalk 1.5's face box on the face mesh, the 256² crop, the blend mask, the paste back.
- :mod:`.prepare` / :mod:`.bundle`: a person prepared once (``framegraph avatar prepare --musetalk``): the loop
  frames, their boxes, masks and latents, and where the model files are; the bundle streams like every bundle.
- :mod:`.stages` / :mod:`.engines`: the face stage (the shown loop frame redrawn for its context) and the models it
  calls on a runtime (torch: float32 on a CPU, float16 on a GPU), loaded once per bundle and device.
"""
