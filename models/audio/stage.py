"""``AudioFeatures``: the avatar pipeline's audio stage.

    AudioFileSource / PushAudioSource ──audio int16 [320]──▶ AudioFeatures ──features float32 [D]──▶ ...
                                                                         └──state float32 [4]─────▶ ...

Per 20 ms audio chunk in, zero or more video frames come out, one per ``1 / fps``.
A frame leaves as soon as its audio plus look-ahead has arrived. It goes out on both outputs.
Its pts is ``clock.ticks_from_frame(k, fps)``: video time derived from audio sample counts.
``"state"`` is :func:`~.frontend.state_vector`: one-hot idle / speaking / listening, then the VAD speech probability.

Each chunk's sample position comes from its pts.
So if chunks were dropped upstream, the gap is filled with silence. Video frames stay on the audio timeline.
A stream's last chunk is the one with ``length < chunk``.
Then the stage emits the frames still waiting for look-ahead, their look-ahead filled with silence.
It does the same whenever the stream ends, in the runtime's ``flush`` hook.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from framegraph.stream import Flag, PortSpec, Stage

from .encoder import AudioEncoder, default_encoder
from .frontend import STATE_DIM, AudioFrontEnd, FrameOutput, state_vector
from .vad import SileroVAD, VoiceActivity, check_hysteresis


class AudioFeatures(Stage):
    """Audio in as 16 kHz mono PCM16 chunks; per-video-frame features and speaking state out.

    Args:
        model: an :class:`AudioEncoder`, a folder saved with ``save_pretrained``, or None. None is an untrained
            encoder with seeded weights.
        fps: video frame rate of the outputs.
        vad: use Silero VAD for the speaking state. False gives idle / listening only.
        on_threshold / off_threshold / min_silence_ms: VAD hysteresis; see :class:`VoiceActivity`.
        chunk: samples per input chunk. 320 is 20 ms at 16 kHz.
        torch_threads: intra-op threads for this stage's worker thread. Per-chunk work is tiny and other stages run in
            parallel. None leaves torch's setting alone.
        engine: what runs the encoder's conv stack, its runtime; see :mod:`framegraph.models.runtime`.
            ``engine(model)`` → a function ``log_mel float32 [1, n_mels, T] → [1, D, T - R + 1]``. Defaults to the
            torch model itself. The STFT and the VAD stay in torch.

    Ports: in ``"audio"`` ``int16 [chunk]``. Out ``"features"`` ``float32 [feature_dim]`` and ``"state"`` ``float32
    [4]``, on ``device``.
    The stage computes on the CPU whatever ``device``.
    The audio arrives there, the VAD runs there, and the encoder is small.
    Its outputs are uploaded. So no GPU work waits on it, and it never reads a value back from a device.

    ``reset()`` is for barge-in; the graph calls it between frames.
    It clears the audio context and the VAD. The next frame out carries ``Flag.INTERRUPTED``.
    :meth:`set_listening` may be called from any thread. It shows from the next frame out.
    """

    def __init__(self, model: AudioEncoder | str | None = None, *, fps: float = 25.0, vad: bool = True,
                 on_threshold: float = 0.5, off_threshold: float = 0.35, min_silence_ms: float = 64.0,
                 chunk: int = 320, device: str = "cpu", torch_threads: int | None = 1,
                 engine: Callable[[AudioEncoder], Callable[[torch.Tensor], torch.Tensor]] | None = None,
                 name: str = "audio_features"):
        super().__init__(name)
        if isinstance(model, AudioEncoder):
            self.model = model
        elif model is None:
            self.model = default_encoder()
        else:
            self.model = AudioEncoder.from_pretrained(model, low_cpu_mem_usage=False)
        self.model = self.model.to("cpu").eval()  # the audio and the VAD are on the CPU: so is the encoder
        self.fps = fps
        self.sample_rate = self.model.config.sample_rate
        self.chunk = chunk
        self.use_vad = vad
        self._vad_args = dict(on_threshold=on_threshold, off_threshold=off_threshold, min_silence_ms=min_silence_ms)
        check_hysteresis(on_threshold, off_threshold, min_silence_ms)  # now, not in the worker thread
        self.torch_threads = torch_threads
        self.inputs = {"audio": PortSpec((chunk,), torch.int16, "cpu")}
        self.outputs = {"features": PortSpec((self.model.feature_dim,), torch.float32, device),
                        "state": PortSpec((STATE_DIM,), torch.float32, device)}
        self.front: AudioFrontEnd | None = None
        self.encode = self.model if engine is None else engine(self.model)
        self._listening = False
        self._lock = threading.Lock()
        self.frames_out = 0
        self.gap_samples = 0

    # ---- control (any thread) -----------------------------------------------------------------
    def set_listening(self, listening: bool) -> None:
        """The app's listening flag: the avatar listens to the user. Applies from the next frame."""
        with self._lock:
            self._listening = bool(listening)

    def reset(self) -> None:
        if self.front is not None:
            self.front.reset()

    # ---- life cycle ---------------------------------------------------------------------------
    def setup(self, ctx):
        super().setup(ctx)
        vad = VoiceActivity(vad=SileroVAD(), **self._vad_args) if self.use_vad else None
        self.front = AudioFrontEnd(self.model, self.fps, vad, encode=self.encode)
        self._samples = 0
        self._state = torch.zeros(STATE_DIM)
        self.frames_out = self.gap_samples = 0

    def process(self, inputs, out):
        frame = inputs["audio"]
        with self._lock:
            self.front.listening = self._listening
        ready: list[FrameOutput] = []
        position = frame.pts * self.sample_rate // self.ctx.clock.ticks_per_second
        if position > self._samples:  # chunks were dropped upstream: keep the timeline with silence
            gap = position - self._samples
            self.gap_samples += gap
            ready += self.front.push(torch.zeros(gap, dtype=torch.int16))
            self._samples = position
        ready += self.front.push(frame.valid)
        self._samples += frame.length
        if frame.length < self.chunk:
            ready += self.front.flush()
        for r in ready:
            self._emit(out, r)

    def flush(self, out):
        for r in self.front.flush():
            self._emit(out, r)

    def _emit(self, out, r: FrameOutput) -> None:
        self._send(out, r, r.features)

    def _send(self, out, r: FrameOutput, features: torch.Tensor) -> None:
        """Frame ``r`` out: ``features`` and its state, at its pts."""
        pts = self.ctx.clock.ticks_from_frame(r.index, self.fps)
        f = out.write("features")
        f.data.copy_(features)
        f.pts = pts
        if r.interrupted:
            f.flags |= Flag.INTERRUPTED
        s = out.write("state")
        s.data.copy_(state_vector(r.state, r.probability, self._state))
        s.pts = pts
        s.flags = f.flags
        self.frames_out += 1
