"""MuseTalk 1.5, the field's open lip-sync model, run from the user's own files (nothing downloaded).

- :mod:`.files`: its released layout (the UNet's ``musetalk.json`` and ``unet.pth``, ``sd-vae/``, ``whisper/``),
  found, checked and loaded into the stock diffusers / transformers classes.
"""
