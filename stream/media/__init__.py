"""Media I/O on PyAV, which wraps FFmpeg.

It has audio sources, MP4 / H.264 / JPEG / image-sequence outputs and video with alpha.
"""
from .alpha import (
    ALPHA_FORMATS,
    IMAGE_CODECS,
    AlphaVideoSink,
    JoinAlpha,
    RGBAImageEncoder,
    alpha_format,
    read_video_rgba,
    rgba_port,
)
from .audio import CHUNK_MS, SAMPLE_RATE, AudioFileSource, PushAudioSource, chunk_samples, decode_audio, iter_pcm16
from .errors import MediaError, open_media
from .scale import ScaleVideo, scale_picture
from .video import (
                    PRESETS,
                    H264Encoder,
                    ImageSequenceSink,
                    JpegEncoder,
                    MP4Sink,
                    VideoFileSource,
                    encoder_opens,
                    iter_video_frames,
                    probe_video,
                    read_video,
                    video_port,
)

__all__ = [
    "CHUNK_MS", "SAMPLE_RATE", "AudioFileSource", "PushAudioSource", "chunk_samples", "decode_audio",
    "iter_pcm16", "MediaError", "open_media", "ScaleVideo", "PRESETS", "H264Encoder", "ImageSequenceSink",
    "JpegEncoder", "MP4Sink", "VideoFileSource", "encoder_opens", "iter_video_frames", "probe_video", "read_video",
    "scale_picture", "video_port", "ALPHA_FORMATS", "IMAGE_CODECS", "AlphaVideoSink", "JoinAlpha", "RGBAImageEncoder",
    "alpha_format", "read_video_rgba", "rgba_port",
]
