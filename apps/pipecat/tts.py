"""``EspeakTTSService``: eSpeak NG as a Pipecat TTS service.

It uses ``models.synth.espeak`` through ctypes, with no network and no key.
It stands in for a real TTS in the offline example.
It speaks each text the pipeline sends, a sentence at a time, at the pipeline's output rate.
The speech comes in 20 ms ``TTSAudioRawFrame`` s between ``TTSStartedFrame`` and ``TTSStoppedFrame``.
The base ``TTSService`` pushes those two.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from pipecat.frames.frames import ErrorFrame, Frame, TTSAudioRawFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService

from framegraph.models.synth.espeak import EspeakError, EspeakNotFound, synthesize

FRAME_MS = 20


class EspeakTTSService(TTSService):
    """Speech from eSpeak NG, the system package ``espeak-ng``.

    Args:
        voice: an eSpeak NG voice, such as ``"en-us"`` or ``"en-gb+f3"``.
        rate_wpm: speaking rate, in words per minute, 80–450.
    """

    def __init__(self, *, voice: str = "en-us", rate_wpm: int = 165, **kwargs):
        super().__init__(push_start_frame=True, push_stop_frames=True,
                         settings=TTSSettings(model=None, voice=voice, language=None), **kwargs)
        self.voice, self.rate_wpm = voice, rate_wpm

    def can_generate_metrics(self) -> bool:
        return True

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame, None]:
        text = text.strip()
        if not text:
            return
        await self.start_tts_usage_metrics(text)
        try:
            speech = await asyncio.to_thread(synthesize, text, voice=self.voice, rate_wpm=self.rate_wpm,
                                             sample_rate=self.sample_rate)
        except (EspeakNotFound, EspeakError, ValueError) as exc:
            yield ErrorFrame(error=f"{self}: eSpeak NG could not speak {text[:40]!r}: {exc}")
            return
        finally:
            await self.stop_ttfb_metrics()
        step = self.sample_rate * FRAME_MS // 1000
        samples = speech.samples
        for i in range(0, len(samples), step):
            yield TTSAudioRawFrame(audio=samples[i:i + step].tobytes(), sample_rate=self.sample_rate,
                                   num_channels=1, context_id=context_id)
