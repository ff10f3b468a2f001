"""Audio for the avatar.

It holds log-mel features, a causal conv encoder and the ``AudioFeatures`` stage.
:mod:`.whisper` and :mod:`.whisper_stream` run Whisper's encoder over a sliding window.
Silero gives voice activity. :mod:`.per_frame` gives speech and loudness per video frame.

    from framegraph.models.audio import AudioFeatures, AudioEncoder, extract_features
"""
from .encoder import MAX_LOOKAHEAD_MS, AudioEncoder, default_encoder
from .features import FrameTiming, StreamingFeatures, as_float_audio, extract_features
from .frontend import STATE_DIM, AudioFrontEnd, FrameOutput, decode_state, extract, state_vector
from .mel import LogMel, hz_to_mel, mel_center_frequencies, mel_filterbank, mel_to_hz
from .stage import AudioFeatures
from .vad import IDLE, LISTENING, SPEAKING, STATE_NAMES, SileroVAD, VoiceActivity, check_hysteresis, silero_model_path
from .whisper import WhisperEncoderEngine, WhisperModelError
from .whisper_stage import WhisperFeatures
from .whisper_stream import StreamingWhisperFeatures, WhisperWindows, per_video_frame, whisper_features

__all__ = [
    "MAX_LOOKAHEAD_MS", "AudioEncoder", "default_encoder", "FrameTiming", "StreamingFeatures", "as_float_audio",
    "extract_features", "STATE_DIM", "AudioFrontEnd", "FrameOutput", "decode_state", "extract", "state_vector",
    "LogMel", "hz_to_mel", "mel_center_frequencies", "mel_filterbank", "mel_to_hz", "AudioFeatures", "IDLE",
    "LISTENING", "SPEAKING", "STATE_NAMES", "SileroVAD", "VoiceActivity", "check_hysteresis", "silero_model_path",
    "WhisperEncoderEngine", "WhisperModelError", "WhisperFeatures", "StreamingWhisperFeatures", "WhisperWindows",
    "per_video_frame", "whisper_features",
]
