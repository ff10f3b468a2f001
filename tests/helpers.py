"""Small stages the runtime tests build graphs from, and the talking-video makers of the avatar tests."""
from __future__ import annotations

import json
import threading
import time
import wave
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from framegraph.stream import PortSpec, RecordingSink, Stage

REPO = Path(__file__).resolve().parents[1]  # the checkout
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # where kernel tests run (Triton's interpreter on CPU)


class AddOne(Stage):
    def __init__(self, name="add", shape=(4,), delay_s: float = 0.0):
        super().__init__(name)
        self.inputs = {"x": PortSpec(shape)}
        self.outputs = {"x": PortSpec(shape)}
        self.delay_s = delay_s
        self.resets = 0

    def process(self, inputs, out):
        if self.delay_s:
            time.sleep(self.delay_s)  # stands for heavy compute
        f = out.write("x")
        torch.add(inputs["x"].data, 1, out=f.data)

    def reset(self):
        self.resets += 1


class Collect(RecordingSink):
    """The runtime tests' sink: a :class:`RecordingSink` of ``float32 shape`` ports that also counts its
    set-ups and teardowns; ``got`` lists ``(port, data[0], seq, pts, flags)`` per frame."""

    def __init__(self, name="sink", shape=(4,), delay_s: float = 0.0, ports=("x",)):
        super().__init__({p: PortSpec(shape) for p in ports}, name=name, delay_s=delay_s)
        self.torn_down = 0
        self.set_up = 0

    def setup(self, ctx):
        super().setup(ctx)
        self.set_up += 1

    def teardown(self):
        self.torn_down += 1

    @property
    def got(self) -> list[tuple]:
        return [(r.port, float(r.data[0]), r.seq, r.pts, r.flags) for r in self.records]

    def values(self, port="x"):
        return [float(r.data[0]) for r in self.of(port)]


class Boom(Stage):
    """Raises on frame ``at``."""

    def __init__(self, at: int = 3, name="boom", shape=(4,)):
        super().__init__(name)
        self.inputs = {"x": PortSpec(shape)}
        self.outputs = {"x": PortSpec(shape)}
        self.at, self.seen = at, 0

    def process(self, inputs, out):
        self.seen += 1
        if self.seen > self.at:
            raise RuntimeError(f"kaboom at frame {self.seen}")
        out.write("x").data.copy_(inputs["x"].data)


class BargeIn(Stage):
    """Audio pass-through that asks its ``graph`` (set after adding it) for a barge-in at chunk ``after``."""

    def __init__(self, after: int = 30, chunk: int = 320):
        super().__init__("barge")
        self.inputs = {"audio": PortSpec((chunk,), torch.int16)}
        self.outputs = {"audio": PortSpec((chunk,), torch.int16)}
        self.after, self.n, self.graph = after, 0, None

    def process(self, inputs, out):
        self.n += 1
        if self.n == self.after:
            self.graph.reset()
        f = out.write("audio")
        f.data.copy_(inputs["audio"].data)
        f.length = inputs["audio"].length


def wait_for(predicate, timeout_s: float, what: str) -> None:
    """Poll ``predicate`` every 20 ms; fail the test naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def avatar_session(avatar, audio: np.ndarray, settings=None):
    """An avatar graph (not started) that speaks ``audio`` (int16 at 16 kHz, pushed whole) into a recording sink of
    its video: ``(graph, sink)``; ``settings``: the run's ``RunSettings``, given whole to ``build_avatar_graph``."""
    from framegraph.models.avatar import build_avatar_graph
    from framegraph.stream.media import SAMPLE_RATE, PushAudioSource

    src = PushAudioSource(max_buffer_ms=int(1000 * len(audio) / SAMPLE_RATE) + 100)
    ag = build_avatar_graph(avatar, src, audio_sink=None, settings=settings)
    sink = ag.graph.add(RecordingSink({"video": PortSpec((avatar.height, avatar.width, 3), torch.uint8)}))
    ag.graph.connect(ag.video, sink, "video", capacity=4)
    src.push(audio)
    src.close()
    return ag.graph, sink


def sessions_frames(avatar, audios, settings=None, timeout_s: float = 300) -> list[np.ndarray]:
    """Avatar sessions of ``audios`` run at once (:func:`avatar_session` each, with ``settings``): each one's video
    frames, ``uint8 [N, H, W, 3]``."""
    runs = [avatar_session(avatar, audio, settings) for audio in audios]
    for g, _ in runs:
        g.start()
    for g, _ in runs:
        g.join(timeout_s)
    return [torch.stack(sink.data()).numpy() for _, sink in runs]


def framegraph_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("framegraph:")]


# ---- tiny video-model folders (stock diffusers classes, random weights) for the generate tests --------------
GEN_TEXT_DIM = 16  # the tiny models' prompt-embedding width


def psnr_per_frame(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """PSNR (dB) of each frame of ``b`` against ``a``: uint8 ``[N, H, W, 3]`` videos of one shape."""
    from framegraph.stream.quality import psnr

    return np.array([psnr(y, x, 255.0) for x, y in zip(a, b, strict=True)])


def tiny_generate_folder(folder, family: str = "wan", text_encoder: bool = False, **transformer_config) -> Path:
    """Save a diffusers folder (model_index.json, transformer/, vae/, scheduler/; with ``text_encoder``: a tiny
    UMT5 encoder and a word-level tokenizer built offline) of a tiny random ``family`` model; returns it."""
    import json

    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        SanaVideoTransformer3DModel,
        WanTransformer3DModel,
    )

    folder = Path(folder)
    torch.manual_seed(0)
    if family == "wan":
        model = WanTransformer3DModel(**(dict(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=16, out_channels=16,
            text_dim=GEN_TEXT_DIM, freq_dim=32, ffn_dim=32, num_layers=2, rope_max_seq_len=64) | transformer_config))
        pipeline = "WanPipeline"
    else:
        model = SanaVideoTransformer3DModel(**(dict(
            in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=12, num_layers=2,
            num_cross_attention_heads=2, cross_attention_head_dim=12, cross_attention_dim=24,
            caption_channels=GEN_TEXT_DIM, sample_size=4, patch_size=(1, 2, 2), rope_max_seq_len=64)
            | transformer_config))
        pipeline = "SanaVideoPipeline"
    with torch.no_grad():  # the stock init zeroes the output projection: make the picture depend on the model
        for p in model.parameters():
            if p.dim() >= 2 and float(p.abs().max()) == 0:
                p.normal_(0, 0.2)
    model.save_pretrained(folder / "transformer")
    AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                     temperal_downsample=[False, True, True]).save_pretrained(folder / "vae")
    FlowMatchEulerDiscreteScheduler(shift=3.0).save_pretrained(folder / "scheduler")
    index = {"_class_name": pipeline, "_diffusers_version": "0.36.0",
             "transformer": ["diffusers", type(model).__name__],
             "vae": ["diffusers", "AutoencoderKLWan"], "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]}
    if text_encoder:
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

        words = ["<pad>", "</s>", "<unk>", "a", "fox", "cat", "in", "the", "snow", "river", "red", "blue", "sky"]
        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                unk_token="<unk>").save_pretrained(folder / "tokenizer")
        UMT5EncoderModel(UMT5Config(vocab_size=len(words), d_model=GEN_TEXT_DIM, d_kv=8, d_ff=32, num_layers=1,
                                    num_heads=2)).save_pretrained(folder / "text_encoder")
        index |= {"text_encoder": ["transformers", "UMT5EncoderModel"],
                  "tokenizer": ["transformers", "PreTrainedTokenizerFast"]}
    (folder / "model_index.json").write_text(json.dumps(index, indent=1))
    return folder


def tiny_prompt_embeds(path, tokens: int = 6, seed: int = 0) -> Path:
    """A ``prompt_embeds [tokens, GEN_TEXT_DIM]`` safetensors file for the tiny models."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    save_file({"prompt_embeds": torch.randn(tokens, GEN_TEXT_DIM, generator=g)}, str(path))
    return Path(path)


# ---- talking-video fixtures (tests/models/test_avatar_video*.py) -----------------------------------------
SR = 16_000


def write_video(path, frames: np.ndarray, fps: int, audio: np.ndarray | None = None, *, audio_rate: int = SR,
                out_rate: int | None = None, layout: str = "mono", rotation: int | None = None) -> str:
    """An MP4 (H.264, and AAC when ``audio`` int16 mono at ``audio_rate`` is given; re-sampled to
    ``out_rate`` / ``layout`` as a camera would record it)."""
    import av

    c = av.open(str(path), "w", format="mp4")
    vs = c.add_stream("libx264", rate=fps)
    vs.width, vs.height, vs.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
    vs.codec_context.options = {"preset": "ultrafast"}
    if rotation is not None:
        vs.set_display_rotation(rotation)
    if audio is not None:
        a = c.add_stream("aac", rate=out_rate or audio_rate)
        a.layout = layout
        res = av.AudioResampler(format="fltp", layout=layout, rate=out_rate or audio_rate)
        af = av.AudioFrame.from_ndarray(audio.reshape(1, -1).astype(np.int16), format="s16", layout="mono")
        af.sample_rate, af.pts, af.time_base = audio_rate, 0, Fraction(1, audio_rate)
        for o in res.resample(af) + res.resample(None):
            c.mux(a.encode(o))
        c.mux(a.encode(None))
    for i, f in enumerate(frames):
        vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")
        vf.pts = i
        c.mux(vs.encode(vf))
    c.mux(vs.encode(None))
    c.close()
    return str(path)


def write_wav(path, samples: np.ndarray) -> str:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SR)
        w.writeframes(samples.astype(np.int16).tobytes())
    return str(path)


def tone(seconds: float, amplitude: float = 8000.0) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (amplitude * np.sin(2 * np.pi * 220 * t) * (np.sin(2 * np.pi * 2 * t) > 0)).astype(np.int16)


def still(image: np.ndarray, seconds: float, fps: int = 10) -> np.ndarray:
    return np.repeat(image[None], int(round(seconds * fps)), axis=0)


def astronaut() -> np.ndarray:
    from framegraph.models.synth import astronaut_portrait

    return np.array(astronaut_portrait().image, copy=True)


# ---- the portrait avatar's engines, eager and compiled, for the compiled-runtime tests ------------------------
def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative L2 error of ``a`` against ``b`` (in float32)."""
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def random_portrait_avatar(generator: torch.Generator | None = None):
    """A 64² random portrait avatar (reference skip and warp in its VAE) whose DiT head has weights (a zero head
    would make every output the same), drawn from ``generator`` (default: torch's global one)."""
    from framegraph.models.avatar import random_avatar

    avatar = random_avatar(region_size=64, vae_config={"reference_skip": True, "reference_warp": True})
    with torch.no_grad():
        avatar.dit.final_proj.weight.normal_(0, 0.05, generator=generator)
    return avatar


def started_dit_engines(model, ref: torch.Tensor):
    """``(TorchDiT, CompiledDiT)`` of ``model``, both started on the reference latent ``ref``."""
    from framegraph.models.avatar.portrait.compiled import CompiledDiT
    from framegraph.models.dit import TorchDiT

    eager, fast = TorchDiT(model), CompiledDiT(model)
    eager.start(ref)
    fast.start(ref)
    return eager, fast


def dit_block_inputs(config, ref: torch.Tensor, generator: torch.Generator, device="cpu"):
    """One block's random ``(noise [1, C, k, h, w], audio [1, k, audio_dim], labels [1, k, state_dim])`` for a DiT
    of ``config`` (``k = frames_per_block``; ``h, w`` of the reference latent ``ref``)."""
    k = config.frames_per_block
    noise = torch.randn(1, config.latent_channels, k, *ref.shape[-2:], generator=generator, device=device)
    audio = torch.randn(1, k, config.audio_dim, generator=generator, device=device)
    labels = torch.rand(1, k, config.state_dim, generator=generator, device=device)
    return noise, audio, labels


# ---- a tiny MuseTalk (stock diffusers / transformers classes, random weights) in MuseTalk's released layout ----
MUSETALK_AUDIO_DIM = 16  # the tiny Whisper's width = the tiny UNet's cross-attention width


def tiny_musetalk_folder(root, seed: int = 0) -> Path:
    """``root/models/{musetalkV15/{musetalk.json,unet.pth},sd-vae/,whisper/}``: a UNet2DConditionModel (8 latent
    channels in, 4 out, attending to 16-wide audio), an AutoencoderKL (8× down, 4 channels) and a 2-layer
    WhisperModel, all tiny and random; returns ``root``."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import WhisperConfig, WhisperModel

    root = Path(root)
    torch.manual_seed(seed)
    unet_config = {"sample_size": 32, "in_channels": 8, "out_channels": 4, "layers_per_block": 1,
                   "block_out_channels": [16, 32], "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
                   "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"], "cross_attention_dim": MUSETALK_AUDIO_DIM,
                   "attention_head_dim": 4, "norm_num_groups": 8}
    unet = UNet2DConditionModel(**unet_config)
    (root / "models/musetalkV15").mkdir(parents=True, exist_ok=True)
    (root / "models/musetalkV15/musetalk.json").write_text(json.dumps(unet_config))
    torch.save(unet.state_dict(), root / "models/musetalkV15/unet.pth")
    vae = AutoencoderKL(block_out_channels=(8, 16, 16, 16), down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, latent_channels=4, norm_num_groups=8,
                        layers_per_block=1, sample_size=256)
    vae.save_pretrained(root / "models/sd-vae")
    whisper = WhisperModel(WhisperConfig(d_model=MUSETALK_AUDIO_DIM, encoder_layers=2, decoder_layers=1,
                                         encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                         decoder_ffn_dim=32, num_mel_bins=80, max_source_positions=1500,
                                         vocab_size=64, max_target_positions=32, pad_token_id=0, bos_token_id=1,
                                         eos_token_id=2, decoder_start_token_id=1))
    whisper.save_pretrained(root / "models/whisper")
    return root
