"""The runtime: frames, rings, stages, graphs, the session clock, telemetry and media I/O.

``docs/DESIGN.md`` holds the runtime contract. The README's architecture section gives the overview.
"""
from .clock import TICKS_PER_SECOND, Clock, FlowLimiter
from .files import write_json
from .frame import Flag, Frame, PortSpec
from .graph import Edge, Graph, GraphError, StageError
from .push import Pushed, PushSource
from .record import CountSource, IterableSource, Recorded, RecordingSink
from .ring import POLICIES, Ring, RingAborted
from .stage import EndOfStream, IndexedSource, Outputs, Stage, StageContext
from .telemetry import Telemetry, prometheus_text

__all__ = [
    "TICKS_PER_SECOND", "Clock", "FlowLimiter", "Flag", "Frame", "PortSpec", "Edge", "Graph", "GraphError",
    "StageError", "Pushed", "PushSource", "CountSource", "IterableSource", "Recorded", "RecordingSink", "POLICIES",
    "Ring", "RingAborted", "EndOfStream", "IndexedSource", "Outputs", "Stage", "StageContext", "Telemetry",
    "prometheus_text", "write_json",
]
