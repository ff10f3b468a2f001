"""Every refusal a client can meet speaks the protocol's language (#35): each ``bad_option`` a pipeline can
produce — every declared option of every pipeline given values of each wrong kind, the rules between options, a
``config`` with bad live options, and the refusals the server itself causes (a bundle or a model that does not
load, an ONNX export missing, no text encoder, no bundle or model at all) — and each ``bad_message`` names what the
client sent and what it may send, never a server path (a path separator outside the client's own value) nor a
command-line flag; sizes are ``WxH``, as the client sends them."""
import json
import re

import pytest
from helpers import tiny_generate_folder, tiny_prompt_embeds

from framegraph.apps.server import pipelines
from framegraph.apps.server.pipelines import options as kinds
from framegraph.apps.server.protocol import ErrorCode, ProtocolError, parse_control
from framegraph.models.avatar import random_avatar, save_avatar
from framegraph.models.avatar.video.bundle import random_video_avatar, save_video_avatar

FLAG = re.compile(r"(?<![\w-])--?[a-z][\w-]*")  # a command-line option: --prompt-embeds, -o
PATH = re.compile(r"\S[/\\]|[/\\]\S")  # a separator inside a token ("a .ply / .splat file" is prose, not a path)


def speaks_the_protocol(message: str, sent=None) -> None:
    """``message`` has no path and no flag, once the client's own value (as sent, or as its repr) is taken out."""
    text = message
    for own in ([] if sent is None else [repr(sent), json.dumps(sent), str(sent)]):
        text = text.replace(own, "")
    assert not PATH.search(text), f"a server path in: {message}"
    assert not FLAG.search(text.replace("framegraph", "")), f"a command-line flag in: {message}"


def refusal(code: ErrorCode, call, *args) -> str:
    with pytest.raises(ProtocolError) as refused:
        call(*args)
    assert refused.value.code == code, refused.value.message
    return refused.value.message


# Values of each wrong kind, per kind of option: type, range, names, paths.
BAD = {
    kinds.Number: lambda k: ["fast", True, k.lo - 1, k.hi + 1],
    kinds.Integer: lambda k: [1.5, "3", k.lo - 1, k.hi + 1],
    kinds.Flag: lambda k: ["yes", 1],
    kinds.Choice: lambda k: ["no-such", "../etc", "/etc/passwd", 3],
    kinds.Text: lambda k: [7, "x" * (k.max_chars + 1)],
    kinds.FileName: lambda k: ["../a.safetensors", "/etc/passwd", "sub/a.ply", ".hidden", 5],
    kinds.Size: lambda k: ["7x3", [16, 2], "abc", "1922x1080", "wide"],
    kinds.Decreasing: lambda k: [[250, 500], [], "1000", [0]],
    kinds.Background: lambda k: ["mauve", "#12345", "0,0,256", "/etc/passwd", 3, "missing.jpg", "../x.jpg",
                                 "sub/good.jpg"],
}


@pytest.fixture(scope="module")
def server_folders(tmp_path_factory):
    """The server's folders, each holding a good item and a broken one: avatars (a portrait, a video avatar, a
    bundle whose avatar.json is not JSON), models (a tiny Wan with prompt embeddings and a broken embeddings file, one
    without a text encoder, one whose weights are missing), scenes (a file that is no scene), backgrounds (a picture;
    one that does not decode is refused by a bundle with a matte: test_scene_avatar_pipeline)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("server")
    avatars, models, scenes, backgrounds = root / "avatars", root / "models", root / "scenes", root / "backgrounds"
    save_avatar(avatars / "astronaut", random_avatar())
    save_video_avatar(avatars / "me", random_video_avatar())
    (avatars / "broken").mkdir()
    (avatars / "broken" / "avatar.json").write_text("{not json")
    wan = tiny_generate_folder(models / "tiny-wan", "wan")
    tiny_prompt_embeds(wan / "a.safetensors", seed=1)
    (wan / "bad.safetensors").write_bytes(b"not a safetensors file")
    (models / "unloadable").mkdir()
    (models / "unloadable" / "model_index.json").write_text("{}")
    scenes.mkdir()
    (scenes / "broken.ply").write_text("ply\nnot a scene\n")
    backgrounds.mkdir()
    Image.new("RGB", (32, 32), (0, 90, 200)).save(backgrounds / "good.jpg")
    mp = pytest.MonkeyPatch()
    for var, folder in (("FRAMEGRAPH_AVATARS", avatars), ("FRAMEGRAPH_MODELS", models), ("FRAMEGRAPH_SCENES", scenes),
                        ("FRAMEGRAPH_BACKGROUNDS", backgrounds)):
        mp.setenv(var, str(folder))
    yield root
    mp.undo()


def test_every_declared_option_refuses_every_wrong_kind_of_value_in_the_clients_terms(server_folders):
    walked = 0
    for name in pipelines.available():
        spec = pipelines.spec(name)
        speaks_the_protocol(refusal(ErrorCode.BAD_OPTION, pipelines.build, name, {"colour": "red"}))
        for key, schema in spec.options.schema().items():
            kind = spec.options.__dataclass_fields__[key].metadata["kind"]
            for bad in BAD[type(kind)](kind):
                for sent_as in [key] + ([schema["alias"]] if "alias" in schema else []):
                    message = refusal(ErrorCode.BAD_OPTION, pipelines.build, name, {sent_as: bad})
                    assert f"option {sent_as!r}" in message and "expected" in message, message
                    speaks_the_protocol(message, bad)
                    walked += 1
    assert set(pipelines.available()) >= {"testcard", "scope", "scene", "avatar", "generate"}
    assert walked > 200


SERVER_SIDE = [  # (pipeline, options, what the message must say)
    ("avatar", {"portrait": "broken"}, "another of the server's avatars (this one cannot be loaded"),
    ("avatar", {"size": "320x240"}, "option 'size' = '320x240'; expected the avatar's size 256x256"),
    ("avatar", {"fps": 30}, "the avatar's frame rate 25"),
    ("avatar", {"runtime": "onnx"}, "expected 'torch' (avatar 'astronaut' has no up-to-date onnx export"),
    ("avatar", {"backend": "onnx-int8"}, "expected 'torch' (avatar 'astronaut' has no up-to-date onnx-int8 export"),
    ("avatar", {"portrait": "me", "runtime": "onnx"}, "expected 'torch' (avatar 'me' has no up-to-date onnx export"),
    ("avatar", {"portrait": "me", "runtime": "onnx-int8"},
     "one of torch, compiled, onnx (avatar 'me' is a video avatar)"),
    ("avatar", {"background": "missing.jpg"}, "or a picture: good.jpg"),
    ("generate", {"model": "unloadable", "prompt": "a fox"}, "another of the server's models (this one does not load"),
    ("generate", {"prompt": "a fox", "size": "72x64"}, "the width, 72, is not; e.g. 64x64"),
    ("generate", {"prompt": "a fox", "size": "1040x64"}, "at most 1024 pixels on a side"),
    ("generate", {"prompt": "a fox"}, "prompt_embeds instead (model 'tiny-wan' has no text encoder"),
    ("generate", {"prompt_embeds": "missing.safetensors"}, "['a.safetensors', 'bad.safetensors']"),
    ("generate", {"prompt_embeds": "bad.safetensors"}, "prompt embeddings bad.safetensors: not a readable"),
    ("generate", {"prompt_embeds": "a.safetensors", "runtime": "onnx"},
     "(model 'tiny-wan' has no up-to-date ONNX export of its VAE decoder for size 832x480 and chunk_frames 3"),
    ("generate", {"prompt": "a", "prompt_embeds": "a.safetensors"}, "either prompt or prompt_embeds, not both"),
    ("generate", {}, "a prompt (or prompt_embeds) to start from"),
    ("generate", {"prompt_embeds": "a.safetensors", "strength": 0.5}, 'strength goes with input "camera"'),
    ("generate", {"prompt_embeds": "a.safetensors", "input": "camera"}, 'a strength with input "camera"'),
    ("scene", {"scene": "missing.ply"}, "that exists"),
    ("scene", {"ply": "broken.ply"}, "another of the server's scenes (this one cannot be opened"),
]


@pytest.mark.parametrize("name, options, says", SERVER_SIDE, ids=[f"{n}-{'-'.join(o)}" for n, o, _ in SERVER_SIDE])
def test_refusals_the_server_causes_say_what_the_client_may_send_instead(server_folders, name, options, says, caplog):
    message = refusal(ErrorCode.BAD_OPTION, pipelines.build, name, options)
    assert says in message, message
    speaks_the_protocol(message, list(options.values())[0] if options else None)
    assert str(server_folders) not in message


def test_a_server_without_a_bundle_or_a_model_folder_says_which_it_lacks(server_folders, tmp_path, monkeypatch):
    monkeypatch.setenv("FRAMEGRAPH_AVATARS", str(tmp_path))
    monkeypatch.delenv("FRAMEGRAPH_MODELS")
    for name, lacks in (("avatar", "it has no avatar bundle"), ("generate", "it has no video model")):
        message = refusal(ErrorCode.UNKNOWN_PIPELINE, pipelines.build, name, {})
        assert f"pipeline {name!r} is not available on this server: {lacks}" in message
        speaks_the_protocol(message)
    speaks_the_protocol(refusal(ErrorCode.UNKNOWN_PIPELINE, pipelines.build, "../nope", {}), "../nope")


def test_live_options_are_checked_against_the_same_declarations(server_folders):
    scope = pipelines.build("scope", {"size": "64x48"})
    for bad in ({"gain": "x"}, {"gain": 1e9}, {"colour": 1}, {"quality": 500}, {"window_ms": 10}):
        speaks_the_protocol(refusal(ErrorCode.BAD_OPTION, scope.apply_config, bad), list(bad.values())[0])
    assert scope.apply_config({"gain": 2.0, "stats_interval_ms": 500}) == {"gain": 2.0, "stats_interval_ms": 500}
    generate = pipelines.build("generate", {"prompt_embeds": "a.safetensors", "size": "48x32", "chunk_frames": 1})
    for bad, says in (({"prompt_embeds": "../a.safetensors"}, "the name of a .safetensors file in the model folder"),
                      ({"prompt_embeds": "bad.safetensors"}, "not a readable safetensors file"),
                      ({"prompt": "a red fox"}, "has no text encoder"),
                      ({"prompt": "a", "prompt_embeds": "a.safetensors"}, "not both")):
        message = refusal(ErrorCode.BAD_OPTION, generate.apply_config, bad)
        assert says in message, message
        speaks_the_protocol(message, list(bad.values())[0])


MALFORMED = ["{not json", "[1, 2]", json.dumps({"type": 7}), json.dumps({"type": "dance"}),
             json.dumps({"type": "start"}),
             json.dumps({"type": "start", "pipeline": "scope", "options": [1]}),
             json.dumps({"type": "start", "pipeline": "scope", "version": 2}),
             json.dumps({"type": "config", "options": "gain=2"}),
             json.dumps({"type": "pose", "matrix": [[1, 0], [0, 1]]}),
             json.dumps({"type": "pose", "matrix": [[1, 0, 0, 0]] * 4}),
             json.dumps({"type": "pose", "matrix": [[1, 0, 0, 0]] * 3 + [[0, 0, 0, 1]], "pts": "now"})]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_control_messages_are_refused_in_the_protocols_terms(text):
    with pytest.raises(ProtocolError) as refused:
        parse_control(text)
    assert refused.value.code in (ErrorCode.BAD_JSON, ErrorCode.BAD_MESSAGE, ErrorCode.UNKNOWN_TYPE)
    speaks_the_protocol(refused.value.message)
