"""Running a graph from the command line: a progress bar, Ctrl-C that drains, a clear summary."""
from __future__ import annotations

import sys

from tqdm import tqdm

from framegraph.stream import Graph, Stage


def run_with_progress(graph: Graph, counter: Stage, total: int, desc: str, unit: str = "frame") -> dict:
    """Start ``graph``, show a progress bar of frames processed by ``counter`` (usually the sink) out
    of ``total``, and return the report. Ctrl-C drains the graph, so file sinks finish a playable file;
    the report then has ``"interrupted": True``."""
    graph.start()
    index = graph.stages.index(counter)
    bar = tqdm(total=total, desc=desc, unit=unit, disable=None, file=sys.stderr, dynamic_ncols=True)
    interrupted = False
    try:
        while graph.running:
            try:
                graph.join(timeout=0.2)
            except TimeoutError:
                pass
            except KeyboardInterrupt:
                if interrupted:  # second Ctrl-C: stop now
                    graph.cancel()
                    raise
                interrupted = True
                bar.write("interrupted: finishing the file (Ctrl-C again to abort)")
                graph.drain()
            done = graph.telemetry.stages[index].process.count
            bar.update(done - bar.n)
        report = graph.join()
    finally:
        bar.close()
    report["interrupted"] = interrupted
    return report
