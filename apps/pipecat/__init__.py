"""framegraph in Pipecat: the open, self-hosted avatar of a voice agent.

Install it with ``pip install 'framegraph[pipecat]'``.

- :class:`FramegraphAvatar`, in :mod:`.processor`: the frame processor between the TTS and ``transport.output()``.
- :class:`EspeakTTSService`, in :mod:`.tts`: eSpeak NG as a Pipecat TTS service, for the example.
  It is local and needs no key.
- :mod:`.webrtc`: a small server for a bot on Pipecat's SmallWebRTC transport and its prebuilt browser client.
- :mod:`.cli`: ``framegraph pipecat-demo``, which runs the example agent ``examples/pipecat_avatar_bot.py``.

The two classes are imported on first use.
So ``framegraph`` itself and its CLI never import ``pipecat``.
"""
__all__ = ["FramegraphAvatar", "EspeakTTSService"]


def __getattr__(name):
    if name == "FramegraphAvatar":
        from .processor import FramegraphAvatar

        return FramegraphAvatar
    if name == "EspeakTTSService":
        from .tts import EspeakTTSService

        return EspeakTTSService
    raise AttributeError(name)
