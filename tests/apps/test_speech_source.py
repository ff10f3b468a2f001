"""The avatar session's speech source in a real graph: a barge-in while the source waits to hand a chunk on."""
import threading
import time

import numpy as np
import torch

from framegraph.apps.avatar_session.source import CHUNK, SpeechSource
from framegraph.stream import Clock, Graph, PortSpec, RecordingSink


class HeldSink(RecordingSink):
    """Records the audio chunks, holding the first until ``go`` is set: the ring fills, the source waits."""

    def __init__(self):
        super().__init__({"audio": PortSpec((CHUNK,), torch.int16)}, name="held")
        self.go = threading.Event()

    def process(self, inputs, out):
        self.go.wait(30)
        super().process(inputs, out)


def test_a_barge_in_while_the_source_waits_on_a_full_ring_clears_the_chunk_it_holds():
    """The chunk being handed on when ``clear`` comes is speech from before the barge-in: it lies before the pts
    ``clear`` returns, so the session drops its sound (it once was "post-clear" and was heard after the barge-in)."""
    src = SpeechSource(start_buffer_ms=0)
    sink = HeldSink()
    g = Graph(Clock("fast"))
    g.add(src)
    g.add(sink)
    g.connect(src, sink, "audio", capacity=1)
    speech = np.full(2 * 16000, 1000, np.int16)
    src.push("long", speech, speech, 16000)
    g.start()
    try:
        queued = -1
        while queued != src.queued_samples:  # it stops once the held sink and the full ring hold its chunks
            queued = src.queued_samples
            time.sleep(0.3)
        cleared, dropped = src.clear()
        assert dropped == ["long"]
        sink.go.set()
        src.close()
        g.join(30)
    finally:
        sink.go.set()
        g.cancel()
    spoken = [r.pts for r in sink.of("audio") if r.data.abs().max() > 0]
    assert len(spoken) >= 2 and len(sink.of("audio")) == len(spoken)  # only the speech's chunks were made
    assert max(spoken) < cleared, (spoken, cleared)
