"""Fixtures of the app tests: one headless Chromium per test module, its fake microphone playing speech (and
Chromium's fake camera showing its test pattern); a server model folder with a tiny Wan model for ``generate``."""
import pytest
from browser_util import chromium, write_speech_wav
from helpers import tiny_generate_folder, tiny_prompt_embeds


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    wav = tmp_path_factory.mktemp("mic") / "speech.wav"
    write_speech_wav(wav)
    with chromium(wav) as b:
        yield b


@pytest.fixture(scope="module")
def generate_models(tmp_path_factory):
    """A server model folder (``FRAMEGRAPH_MODELS``) holding ``tiny-wan``: a tiny random Wan folder with a text
    encoder, and two prompt embedding files, ``a.safetensors`` and ``b.safetensors``."""
    root = tmp_path_factory.mktemp("models")
    wan = tiny_generate_folder(root / "tiny-wan", "wan", text_encoder=True)
    tiny_prompt_embeds(wan / "a.safetensors", seed=1)
    tiny_prompt_embeds(wan / "b.safetensors", seed=2)
    return root
