"""One Prometheus view of the cluster.

Every replica's ``/metrics`` text is merged, each series labelled with its ``replica``.
The front door adds its own families, with prefix ``framegraph_cluster_``.
"""
from __future__ import annotations

import re

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(.*)$")


def label_sample(line: str, labels: dict[str, str]) -> str:
    """``name{a="1"} v`` with ``labels`` added first. ``name v`` gets braces."""
    m = _SAMPLE.match(line)
    if m is None:
        return line
    name, braces, value = m.groups()
    added = ",".join(f'{k}="{v}"' for k, v in labels.items())
    inner = braces[1:-1] if braces else ""
    return f"{name}{{{added}{',' + inner if inner else ''}}} {value}"


def merge(texts: list[tuple[dict[str, str], str]]) -> str:
    """Merge Prometheus texts so each metric family is one group with one ``# HELP`` and ``# TYPE``.

    Each text comes with the labels to add to all its samples.
    The exposition format requires one group per family.
    """
    families: dict[str, dict] = {}
    for labels, text in texts:
        family = None
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                _, kind, name, *_ = line.split(" ", 3)
                family = families.setdefault(name, {"HELP": None, "TYPE": None, "samples": []})
                family[kind] = family[kind] or line
            elif line and not line.startswith("#"):
                if family is None:
                    family = families.setdefault("", {"HELP": None, "TYPE": None, "samples": []})
                family["samples"].append(label_sample(line, labels))
    out = []
    for f in families.values():
        out += [x for x in (f["HELP"], f["TYPE"]) if x] + f["samples"]
    return "\n".join(out) + "\n"


def family(name: str, kind: str, help_: str, series: list[tuple[dict, float]]) -> str:
    """One ``framegraph_cluster_NAME`` family in exposition text."""
    lines = [f"# HELP framegraph_cluster_{name} {help_}", f"# TYPE framegraph_cluster_{name} {kind}"]
    for labels, value in series:
        lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"framegraph_cluster_{name}{{{lab}}} {value}" if lab else f"framegraph_cluster_{name} {value}")
    return "\n".join(lines) + "\n"
