"""MuseTalk 1.5, the field's open lip-sync model. It runs from the user's own files; nothing is downloaded.

- :mod:`.files`: its released layout, found, checked and loaded. The UNet is ``musetalk.json`` and ``unet.pth``,
  beside ``sd-vae/`` and ``whisper/``. They load into the stock diffusers and transformers classes.
- :mod:`.audio`: Whisper's every-layer features at 50 Hz. Each video frame attends to a 10-row window of them.
- :mod:`.hearing`: the same windows, live. Whisper runs on a sliding window. Each frame's context leaves as its
  audio arrives.
- :mod:`.step`: one frame. The masked and whole face's latents go in. The UNet runs at timestep 0, then the VAE
  decodes.
- :mod:`.face`: MuseTalk 1.5's face box on the face mesh. Also the 256² crop, the blend mask and the paste back.
- :mod:`.prepare` / :mod:`.bundle`: a person prepared once, by ``framegraph avatar prepare --musetalk``. The bundle
  holds the loop frames, their boxes, masks and latents, and where the model files are. It streams like every
  bundle.
- :mod:`.stages` / :mod:`.engines`: the face stage and the models it calls on a runtime. The stage redraws the
  shown loop frame for its context. On torch the models run in float32 on a CPU, float16 on a GPU. They load once
  per bundle and device.
- :mod:`.onnx`: the export of the UNet step and the VAE decoder, and their ONNX Runtime engines.
"""
