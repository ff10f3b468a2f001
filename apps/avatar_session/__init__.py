"""A live talking avatar for any agent framework: audio in at any rate, synced video + audio out.

- :mod:`.session`: ``AvatarSession`` (push speech segments, end them, clear = barge-in, take the output).
- :mod:`.source`: ``SpeechSource``, the graph's audio source (speech segments, silence between them).
- :mod:`.output`: ``SessionOutput``, the sink that releases pictures and audio together by pts, and the items
  it hands out (``VideoOut``, ``AudioOut``, ``SegmentEvent``).

Framework adapters are thin layers over it: ``framegraph.apps.pipecat`` (a Pipecat frame processor).
"""
from .output import AudioOut, SegmentEvent, SessionOutput, VideoOut
from .session import AvatarSession
from .source import ChunkInfo, SpeechSource

__all__ = ["AvatarSession", "AudioOut", "SegmentEvent", "SessionOutput", "VideoOut", "ChunkInfo",
           "SpeechSource"]
