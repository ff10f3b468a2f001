"""`framegraph bench report`: every bench's JSON drawn with that bench's figure, other JSON as numbers; and
every registered bench has the contract (a front: arguments and IMPLEMENTATION; an implementation: run, figure) that
the report and the command line use."""
import glob
import importlib
import json
import os
from pathlib import Path

from helpers import REPO

from framegraph.apps.cli import main
from framegraph.apps.commands.bench import BENCHES, implementation

RESULTS = str(REPO / "benchmarks" / "results")


def test_bench_report_collects_json_into_html_and_png(tmp_path, capsys):
    import pytest

    res = tmp_path / "results"
    res.mkdir()
    assert main(["bench", "runtime", "--out", str(res / "runtime.json"), "--quick", "--hops", "2"]) == 0
    (res / "other.json").write_text(json.dumps({"device": "cpu", "fps": 12.5, "nested": {"p50_ms": 3.0}}))
    out = tmp_path / "report" / "index.html"
    assert main(["bench", "report", "--inputs", str(res), "--out", str(out)]) == 0
    page = out.read_text()
    assert "runtime: runtime.json" in page and "other: other.json" in page
    assert page.count("data:image/png;base64,") == 1  # the runtime plots
    assert "nested.p50_ms" in page
    assert (tmp_path / "report" / "index.png").stat().st_size > 1000
    (res / "broken.json").write_text("{oops")
    assert main(["bench", "report", "--inputs", str(res), "--out", str(out)]) == 2
    assert "broken.json: not valid JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "report"])


def test_every_bench_has_the_contract_and_the_recorded_results_are_drawn_by_it():
    from framegraph.apps.bench.meta import pyplot
    from framegraph.apps.bench.report import build_report, kind_of

    for name, (module, _) in BENCHES.items():
        front = importlib.import_module(module)
        assert callable(getattr(front, "add_arguments", None)), f"bench {name}: {module} has no add_arguments"
        for export in ("run", "figure"):
            assert callable(getattr(implementation(name), export, None)), \
                f"bench {name}: {front.IMPLEMENTATION} has no {export}"
    recorded = sorted(glob.glob(os.path.join(RESULTS, "**", "*.json"), recursive=True))
    assert recorded
    kinds = {os.path.basename(f): kind_of(json.loads(Path(f).read_text())) for f in recorded}
    assert set(kinds.values()) <= set(BENCHES)  # every recorded file is drawn by the bench that wrote it
    page, figures = build_report([RESULTS])
    for f, kind in kinds.items():
        assert f"{kind}: {f}" in page
    assert len(figures) == len(recorded) and page.count("data:image/png;base64,") == len(recorded)
    for fig in figures:
        pyplot().close(fig)
