"""Each package's face: its ``__init__`` is an index of its public names (``__all__``, pinned here: a name that
joins or leaves the public API does so on purpose), or, for a package of modules, a docstring that names every one
of its modules. Every pinned name resolves."""
import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("stream", "models", "kernels", "renderers")

PUBLIC = {
    "kernels": [
        "backend", "block_linear_attention", "modulation", "monarch_attention", "processors", "rope"
    ],
    "kernels.block_linear_attention": [
        "LinearAttentionState", "block_linear_attention", "zero_state"
    ],
    "kernels.modulation": [
        "gate_residual", "norm_modulate"
    ],
    "kernels.monarch_attention": [
        "MonarchFactors", "monarch_attention", "monarch_factors", "monarch_matrix", "softmax_attention"
    ],
    "kernels.processors": [
        "BlockLinearAttnProcessor", "KVCache", "MonarchAttnProcessor", "RowsKVCache", "StreamingRotaryPosEmbed",
        "WanCausalAttnProcessor", "grid_from_latents", "install_block_linear_processors",
        "install_monarch_processors", "install_wan_causal_processors", "reset_block_linear_state",
        "set_update_state", "uninstall_wan_causal_processors"
    ],
    "kernels.rope": [
        "apply_rope"
    ],
    "models": [
        "audio", "avatar", "compile", "composite", "dit", "face", "generate", "graphs", "matte", "onnx",
        "pretrained", "runtime", "sampler", "synth", "training", "vae"
    ],
    "models.audio": [
        "AudioEncoder", "AudioFeatures", "AudioFrontEnd", "FrameOutput", "FrameTiming", "IDLE", "LISTENING",
        "LogMel", "MAX_LOOKAHEAD_MS", "SPEAKING", "STATE_DIM", "STATE_NAMES", "SileroVAD", "StreamingFeatures",
        "StreamingWhisperFeatures", "VoiceActivity", "WhisperEncoderEngine", "WhisperFeatures",
        "WhisperModelError", "WhisperWindows", "as_float_audio", "check_hysteresis", "decode_state",
        "default_encoder", "extract", "extract_features", "hz_to_mel", "mel_center_frequencies",
        "mel_filterbank", "mel_to_hz", "per_video_frame", "silero_model_path", "state_vector",
        "whisper_features"
    ],
    "models.avatar": [
        "AVATAR_JSON", "AvatarBundle", "AvatarError", "AvatarGraph", "AvatarStages", "KINDS", "LIVE_MAX_LAG_MS",
        "PortraitAvatar", "RunSettings", "SMALL_VAE", "STATE_MODES", "StateOverride", "TINY_VAE", "VideoAvatar",
        "build_avatar_graph", "load_avatar", "onnx_dir", "random_avatar", "random_video_avatar",
        "render_avatar_graph", "save_avatar", "save_video_avatar", "warm_avatar"
    ],
    "models.dit": [
        "AvatarDiT", "Denoiser", "DiTEngine", "DiTStreamState", "LayerStreamState", "PRESETS", "TorchDiT",
        "generate", "generate_block"
    ],
    "models.face": [
        "FaceError", "FaceLandmarker", "FaceLandmarks", "MEDIAPIPE", "OpennessTrack", "one_face",
        "outside_mouth_mask", "track_openness"
    ],
    "models.generate": [
        "BlockCausalTemporalConv", "CausalDenoiser", "CausalStream", "CausalVAEDecode", "DEFAULT_TIMESTEPS",
        "FAMILIES", "Family", "GenerateGraph", "GenerateModel", "NoiseSource", "PromptBook", "SHIFT",
        "STRENGTH_MEANING", "SanaVideoStream", "VAEEncode", "WanCausal", "WanDecodeState", "WanEncodeState",
        "build_generate_graph", "check_strength", "decode_chunk", "default_dtype", "detect_family",
        "encode_chunk", "file_source", "first_frame", "from_vae_scale", "install_block_causal_convs",
        "load_folder_vae", "load_generate_model", "load_prompt_embeds", "sigmas_from_timesteps", "to_vae_scale",
        "video_frames", "warp_timesteps"
    ],
    "models.onnx": [
        "CheckedExport", "ExportError", "OrtGraph", "OrtVAEStream", "check_manifest", "default_threads",
        "weights_hash", "write_manifest"
    ],
    "models.synth": [
        "ArrayAudioSource", "ClipJob", "ClipPlan", "EspeakError", "EspeakNotFound", "FaceParams", "FaceSource",
        "PARAMS", "PORTRAIT_PNG", "PhonemeEvent", "Portrait", "PortraitError", "PortraitRenderer", "Segment",
        "Speech", "VISEMES", "VOICES", "Viseme", "astronaut_portrait", "can_render_truth", "clip_seed",
        "clips_portrait", "detect_face_regions", "espeak_available", "face_params", "load_portrait",
        "make_clip", "make_sentence", "mouth_curves", "parse_box", "plan_clip", "prepare_clip", "render_truth",
        "resample", "save_portrait_image", "synthesize", "viseme_for"
    ],
    "models.vae": [
        "Cache", "CausalTemporalConv", "ChunkDecodeStage", "FaceClips", "TorchVAE", "VAEDecode", "VAEEngine",
        "VAETrainConfig", "VAETrainResult", "VideoVAE", "box_mask", "box_to_region", "crop_frames",
        "evaluate_vae", "face_clips_from_frames", "face_crop_box", "frames_to_uint8", "kl_divergence",
        "load_face_clips", "measure_latent_stats", "mouth_box_for_frame", "reconstruction_loss", "redrawable",
        "reference_region", "region_size", "remember_reference", "ssim", "ssim_map", "stream_start",
        "train_vae", "uint8_to_frames", "with_reference_warp"
    ],
    "renderers.fit": [
        "CheckpointError", "DatasetError", "DensifyConfig", "FitConfig", "Fitter", "PosedImages", "TrainingRun",
        "fit_loss", "focus_bounds", "init_params", "load_transforms", "params_to_scene", "scene_scale_of",
        "scene_to_params", "ssim", "synthetic_dataset"
    ],
    "renderers.gaussians": [
        "GaussianScene", "RENDER_MODES", "SceneError", "SceneTooLargeError", "TileCapacity", "check_fits",
        "load_ply", "load_scene", "load_splat", "random_scene", "rasterize", "rasterize_to_pixels", "save_ply"
    ],
    "renderers.gaussians4d": [
        "CULL_THRESHOLD", "CheckpointError", "Gaussian4DRenderStage", "Gaussian4DScene", "RENDER_MODES",
        "check_fits_4d", "load_checkpoint", "random_scene_4d", "rasterize_4d", "save_checkpoint", "scene_time",
        "slice_gaussians"
    ],
    "renderers.nerf": [
        "DatasetError", "EARLY_STOP", "FitReport", "HashGridConfig", "MarchCapacity", "NerfConfig", "NerfField",
        "NerfFitConfig", "NerfFitter", "NerfLoadError", "NerfModel", "OccupancyGrid", "PosedImages",
        "RenderResult", "Sphere", "SphereScene", "camera_rays", "dataset_rays", "demo_scene", "fit",
        "hash_encode", "is_nerf_dir", "load_nerf", "load_transforms", "mlp", "ray_aabb", "render_rays",
        "sh_encode", "sphere_views", "trunc_exp"
    ],
    "renderers.nerf.hash_encoding": [
        "HashGridConfig", "PRIMES", "hash_encode", "hash_encode_reference", "hash_encode_vectorized",
        "init_table", "level_corners", "spatial_hash"
    ],
    "renderers.nerf.mlp": [
        "OUTPUT_ACTIVATIONS", "init_weights", "mlp", "mlp_forward"
    ],
    "stream": [
        "Clock", "CountSource", "Edge", "EndOfStream", "Flag", "FlowLimiter", "Frame", "Graph", "GraphError",
        "IndexedSource", "IterableSource", "Outputs", "POLICIES", "PortSpec", "PushSource", "Pushed",
        "Recorded", "RecordingSink", "Ring", "RingAborted", "Stage", "StageContext", "StageError",
        "TICKS_PER_SECOND", "Telemetry", "prometheus_text", "write_json"
    ],
    "stream.media": [
        "ALPHA_FORMATS", "AlphaVideoSink", "AudioFileSource", "CHUNK_MS", "H264Encoder", "IMAGE_CODECS",
        "ImageSequenceSink", "JoinAlpha", "JpegEncoder", "MP4Sink", "MediaError", "PRESETS", "PushAudioSource",
        "RGBAImageEncoder", "SAMPLE_RATE", "ScaleVideo", "VideoFileSource", "alpha_format", "chunk_samples",
        "decode_audio", "encoder_opens", "iter_pcm16", "iter_video_frames", "open_media", "probe_video",
        "read_video", "read_video_rgba", "rgba_port", "scale_picture", "video_port"
    ],

}


def _packages() -> list[str]:
    return sorted(".".join(init.parent.relative_to(ROOT).parts) for layer in LAYERS
                  for init in (ROOT / layer).glob("**/__init__.py"))


@pytest.mark.parametrize("package", _packages())
def test_every_package_has_an_index(package):
    module = importlib.import_module(f"framegraph.{package}")
    if package in PUBLIC:
        assert sorted(module.__all__) == PUBLIC[package], "update PUBLIC when the public API changes on purpose"
        for name in module.__all__:  # a name, or a module of the package
            assert hasattr(module, name) or importlib.util.find_spec(f"framegraph.{package}.{name}"), name
        return
    assert not hasattr(module, "__all__"), f"pin framegraph.{package}'s __all__ in PUBLIC"
    folder = ROOT / package.replace(".", "/")
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    parts = sorted({p.stem for p in folder.glob("*.py") if p.stem != "__init__"} |
                   {p.parent.name for p in folder.glob("*/__init__.py")})
    missing = [p for p in parts if f":mod:`.{p}`" not in doc]
    assert not missing, f"framegraph.{package}'s docstring is its index; it does not name {missing}"
