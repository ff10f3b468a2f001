"""framegraph in Pipecat (``pip install 'framegraph[pipecat]'``): the open, self-hosted avatar of a voice agent.

- :class:`FramegraphAvatar` (:mod:`.processor`): the frame processor between the TTS and ``transport.output()``.
- :class:`EspeakTTSService` (:mod:`.tts`): eSpeak NG as a Pipecat TTS service (local, no key), for the example.
- :mod:`.demo`: ``framegraph pipecat-demo`` — the example agent on Pipecat's SmallWebRTC transport.

Importing this package imports ``pipecat``; the rest of framegraph never does.
"""
from .processor import FramegraphAvatar
from .tts import EspeakTTSService

__all__ = ["FramegraphAvatar", "EspeakTTSService"]
