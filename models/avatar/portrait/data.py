"""Training data of the denoiser: clips → face-region latents, audio features and state labels.

It reads each ``clip_NNNNN.mp4`` + ``.json`` of a folder. That is ``framegraph avatar synth`` output. It may also be a
user's video with a JSON of the same form.

- The frames are cut to the face region by :func:`framegraph.models.vae.load_face_clips`. The folder has one crop box.
  The trained VAE encodes them **once**. It streams them in chunks with the encoder cache. That is exactly as a live
  stream would. The result is ``latents float32 [C, T, h, w]``, normalised to ~unit variance.
- The audio track, 16 kHz mono, goes through the **offline** path of :mod:`framegraph.models.audio`. That is
  :func:`~framegraph.models.audio.extract`. It gives features and a Silero-VAD state per video frame. They are the same
  numbers the ``AudioFeatures`` stage produces. There the audio streams in chunk by chunk.
- The state label per frame is what the stage would emit. That is the VAD's idle / speaking one-hot and
  speech probability. It is ``listening`` where the ground truth says the avatar listens. The app sets that
  live.

Everything is cached in one ``.pt`` file. Its key is a fingerprint. It covers the VAE weights, the audio encoder and the
clip files. So later phases and resumed runs do not recompute it.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from framegraph.models.audio import LISTENING, SileroVAD, VoiceActivity, extract, state_vector
from framegraph.models.vae import load_face_clips, uint8_to_frames
from framegraph.stream.files import written_whole
from framegraph.stream.media import SAMPLE_RATE, MediaError, decode_audio, read_video

from ..clips.io import align_audio


@dataclass
class ClipData:
    """One clip's training tensors, for ``T`` video frames."""

    name: str
    latents: torch.Tensor  # float32 [C, T, h, w]
    audio: torch.Tensor  # float32 [T, F]
    labels: torch.Tensor  # float32 [T, 4]
    jaw: torch.Tensor  # float32 [T] ground-truth jaw opening (for evaluation / weighting)

    @property
    def frames(self) -> int:
        return int(self.latents.shape[1])


def clip_audio(path) -> np.ndarray:
    """The clip's audio as int16 mono 16 kHz samples. Sample 0 is at video time 0."""


    info = read_video(path)
    audio = info["audio"]
    if audio is None:
        raise MediaError(path, "has no audio track; the avatar learns from the clip's speech")
    if info["audio_rate"] != SAMPLE_RATE or audio.dtype != np.int16 or audio.ndim != 1:
        audio = decode_audio(path)
    return np.ascontiguousarray(align_audio(audio, info["audio_start_s"] or 0.0, 0.0), dtype=np.int16)


def state_labels(outputs, truth_frames: list[dict] | None, n: int) -> torch.Tensor:
    """``float32 [n, 4]`` from the front end's per-frame outputs, ``listening`` from the ground truth."""

    rows = []
    for k in range(n):
        o = outputs[min(k, len(outputs) - 1)]
        state = o.state
        if truth_frames and k < len(truth_frames) and truth_frames[k].get("state") == "listening":
            state = LISTENING
        rows.append(state_vector(state, o.probability))
    return torch.stack(rows)


def _fingerprint(vae, audio_encoder, videos: list[Path], region_size: int, vad: bool) -> str:
    h = hashlib.sha1()
    for model in (vae, audio_encoder):
        for k, v in sorted(model.state_dict().items()):
            h.update(k.encode())
            h.update(v.detach().cpu().float().numpy().tobytes()[:4096])
            h.update(str(float(v.float().sum())).encode())
        config = {k: v for k, v in dict(model.config).items() if not k.startswith("_")}  # not _name_or_path...
        h.update(json.dumps(config, sort_keys=True, default=str).encode())
    for p in videos:
        st = p.stat()
        h.update(f"{p.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    h.update(f"{region_size}:{vad}".encode())
    return h.hexdigest()


@torch.no_grad()
def encode_frames(vae, frames: torch.Tensor, chunk: int = 8) -> torch.Tensor:
    """``uint8 [T, S, S, 3]`` → normalised latents ``float32 [C, T, h, w]``, streamed with the cache."""

    cache, zs = None, []
    for s in range(0, frames.shape[0], chunk):
        x = uint8_to_frames(frames[s:s + chunk]).transpose(0, 1)[None].to(vae.device)
        z, cache = vae.encode(x, cache)
        zs.append(z[0].float().cpu())
    return torch.cat(zs, dim=1)


def prepare_clips(clips_dir, vae, audio_encoder, *, region_size: int, fps: float = 25.0, vad: bool = True,
                  crop_box=None, max_clips: int | None = None, cache_path=None,
                  progress: bool = True) -> tuple[list[ClipData], tuple[int, int, int, int], dict]:
    """Encode every clip of ``clips_dir``; see the module docstring.

    Returns ``(clips, crop_box, portrait_json)``. With ``cache_path`` the result is stored there. It is reused
    while the fingerprint of the models and clip files matches."""
    from tqdm import tqdm


    folder = Path(clips_dir)
    videos = sorted(folder.glob("clip_*.mp4"))[:max_clips] if folder.is_dir() else []
    if not videos:
        raise FileNotFoundError(f"no clip_*.mp4 in {str(folder)!r}; make clips with "
                                f"`framegraph avatar synth --out {folder}`")
    key = _fingerprint(vae, audio_encoder, videos, region_size, vad)
    if cache_path is not None and Path(cache_path).is_file():
        blob = torch.load(cache_path, map_location="cpu", weights_only=False)
        if blob.get("fingerprint") == key:
            return [ClipData(**c) for c in blob["clips"]], tuple(blob["crop_box"]), blob["portrait"]
    faces = load_face_clips(folder, size=region_size, crop_box=crop_box, max_clips=max_clips)
    vae = vae.eval()
    out = []
    portrait = None
    for name, frames in tqdm(list(zip(faces.names, faces.frames)), desc="encode clips", disable=not progress,
                             dynamic_ncols=True):
        video = folder / f"{name}.mp4"
        truth = json.loads(video.with_suffix(".json").read_text())
        portrait = portrait or truth.get("portrait")
        latents = encode_frames(vae, frames)
        T = latents.shape[1]
        samples = clip_audio(video)
        need = int(np.ceil(T * SAMPLE_RATE / fps))
        if len(samples) < need:
            samples = np.concatenate([samples, np.zeros(need - len(samples), np.int16)])
        samples = samples[:need]
        voice = VoiceActivity(vad=SileroVAD()) if vad else None
        outputs = extract(audio_encoder.eval(), samples, fps, voice)
        feats = torch.stack([o.features for o in outputs])[:T]
        truth_frames = truth.get("frames") or []
        labels = state_labels(outputs, truth_frames, T)
        jaw = torch.tensor([float(truth_frames[k].get("jaw_open", 0.0)) if k < len(truth_frames) else 0.0
                            for k in range(T)], dtype=torch.float32)
        out.append(ClipData(name, latents, feats.float(), labels, jaw))
    if cache_path is not None:
        Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
        with written_whole(cache_path) as tmp:
            torch.save({"fingerprint": key, "crop_box": list(faces.crop_box), "portrait": portrait,
                        "clips": [c.__dict__ for c in out]}, tmp)
    return out, tuple(faces.crop_box), portrait


def sample_windows(clips: list[ClipData], batch: int, frames: int, gen: torch.Generator):
    """``batch`` random windows of ``frames`` consecutive frames.

    Returns ``(x0 [B, C, T, h, w], audio [B, T, F], labels [B, T, 4])``."""
    lengths = torch.tensor([c.frames for c in clips], dtype=torch.float64)
    t = int(min(frames, lengths.min().item()))
    picks = torch.multinomial(lengths, batch, replacement=True, generator=gen).tolist()
    xs, aus, las = [], [], []
    for i in picks:
        c = clips[i]
        s = int(torch.randint(0, c.frames - t + 1, (1,), generator=gen))
        xs.append(c.latents[:, s:s + t])
        aus.append(c.audio[s:s + t])
        las.append(c.labels[s:s + t])
    return torch.stack(xs), torch.stack(aus), torch.stack(las)


__all__ = ["ClipData", "clip_audio", "state_labels", "encode_frames", "prepare_clips", "sample_windows"]
