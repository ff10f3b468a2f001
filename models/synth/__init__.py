"""Synthetic training data for the talking avatar: a portrait animated by eSpeak NG speech.

    from framegraph.models.synth import load_portrait, make_clip
    job = make_clip("out/synth", 0, seconds=4, fps=25, portrait=load_portrait(), seed=1)

- :mod:`.espeak`: speech + timed phoneme / word events from libespeak-ng, through ctypes.
- :mod:`.visemes`: phoneme → mouth shape table and coarticulation.
- :mod:`.portrait`: the shipped portrait or a user's, with lip line and mouth / eye boxes from face landmarks.
- :mod:`.render`: mouth, teeth, blink and head-motion warps of the portrait, in torch.
- :mod:`.plan` / :mod:`.clip`: a clip's schedule and ground truth. MP4 + JSON come out through a stage graph.
- :mod:`.truth`: a clip's frames redrawn from its JSON, without the codec. These are clean training targets.
- :mod:`.resample`: band-limited resampling of int16 audio.
"""
from .clip import ArrayAudioSource, ClipJob, FaceSource, clip_seed, make_clip, prepare_clip
from .espeak import EspeakError, EspeakNotFound, PhonemeEvent, Speech, espeak_available, synthesize
from .plan import VOICES, ClipPlan, Segment, make_sentence, plan_clip
from .portrait import Portrait, PortraitError, astronaut_portrait, detect_face_regions, load_portrait, parse_box
from .render import FaceParams, PortraitRenderer
from .resample import resample
from .truth import PORTRAIT_PNG, can_render_truth, clips_portrait, face_params, render_truth, save_portrait_image
from .visemes import PARAMS, VISEMES, Viseme, mouth_curves, viseme_for

__all__ = [
    "PORTRAIT_PNG", "can_render_truth", "clips_portrait", "face_params", "render_truth", "save_portrait_image",
    "ArrayAudioSource", "ClipJob", "FaceSource", "clip_seed", "make_clip", "prepare_clip", "EspeakError",
    "EspeakNotFound", "PhonemeEvent", "Speech", "espeak_available", "synthesize", "VOICES", "ClipPlan", "Segment",
    "make_sentence", "plan_clip", "Portrait", "PortraitError", "astronaut_portrait", "detect_face_regions",
    "load_portrait", "parse_box", "FaceParams", "PortraitRenderer", "resample", "PARAMS", "VISEMES", "Viseme",
    "mouth_curves", "viseme_for",
]
