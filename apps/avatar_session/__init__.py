"""A live talking avatar for any agent framework: audio in at any rate, synced video + audio out.

- :mod:`.session`: ``AvatarSession``. Push speech segments, end them, clear for barge-in, take the output.
- :mod:`.source`: ``SpeechSource``, the graph's audio source. It plays speech segments, with silence between.
- :mod:`.output`: ``SessionOutput``, the sink that releases pictures and audio together by pts. Also the items
  it hands out: ``VideoOut``, ``AudioOut``, ``SegmentEvent``.

Framework adapters are thin layers over it. ``framegraph.apps.pipecat`` is a Pipecat frame processor.
"""
from .output import AudioOut, SegmentEvent, SessionOutput, VideoOut
from .session import AvatarSession
from .source import ChunkInfo, SpeechSource

__all__ = ["AvatarSession", "AudioOut", "SegmentEvent", "SessionOutput", "VideoOut", "ChunkInfo",
           "SpeechSource"]
