"""Fixtures of the app tests: one headless Chromium per test module, its fake microphone playing speech."""
import pytest
from browser_util import chromium, write_speech_wav


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    wav = tmp_path_factory.mktemp("mic") / "speech.wav"
    write_speech_wav(wav)
    with chromium(wav) as b:
        yield b
