"""The dependency rule, read from the source: ``apps → models, renderers → stream, kernels``.

Every import of framegraph's own modules counts, at the top of a module or inside a function: ``stream``
and ``kernels`` depend on nothing else in framegraph; ``models`` and ``renderers`` on those two (and the
shipped ``assets``), not on each other; ``apps`` on anything. And no two modules import each other at
load time (an import circle), directly or through others; inside each package, at any depth, no two of its
modules or sub-packages do either.
"""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAY_IMPORT = {
    "stream": {"stream"},
    "kernels": {"kernels"},
    "assets": {"assets"},
    "models": {"models", "stream", "kernels", "assets"},
    "renderers": {"renderers", "stream", "kernels", "assets"},
    "apps": {"apps", "models", "renderers", "stream", "kernels", "assets"},
}


def modules() -> dict[str, Path]:
    """``framegraph.<folder>.<...>`` → file, for every module of the distribution."""
    found = {}
    for folder in MAY_IMPORT:
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(("framegraph",) + parts)] = path
    return found


MODULES = modules()


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (for annotations only, never run)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return found


def imports(name: str, path: Path, run_time_only: bool = False) -> list[tuple[int, str]]:
    """(line, imported framegraph module) for every import in the module, at its top or inside a
    function; ``run_time_only``: leave out those under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    skip = _type_checking_only(tree) if run_time_only else set()
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("framegraph.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("framegraph."):
                target = node.module
            else:
                continue
            for a in node.names:  # ``from . import x`` may name a submodule
                sub = f"{target}.{a.name}"
                found.append((node.lineno, sub if sub in MODULES else target))
    return found


def test_every_import_follows_the_dependency_rule():
    breaks = []
    for name, path in MODULES.items():
        folder = name.split(".")[1]
        for line, target in imports(name, path):
            layer = target.split(".")[1]
            if layer not in MAY_IMPORT[folder]:
                breaks.append(f"{path.relative_to(REPO)}:{line} imports {target} ({folder} may import "
                              f"{sorted(MAY_IMPORT[folder])})")
    assert not breaks, "\n".join(breaks)


def _circles(graph: dict[str, set[str]]) -> list[str]:
    circles, state, path = [], {}, []

    def visit(n):
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                circles.append(" -> ".join(path[path.index(m):] + [m]))
            elif m not in state:
                visit(m)
        path.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return circles


def test_no_import_circles():
    """A circle closed by an import inside a function is still a circle: the two modules cannot be read,
    tested or moved one without the other."""
    graph = {name: {t for _, t in imports(name, path, run_time_only=True) if t in MODULES and t != name}
             for name, path in MODULES.items()}
    # A package's __init__ importing its own submodules is how packages work, not a circle.
    for name in graph:
        graph[name] = {t for t in graph[name] if not t.startswith(name + ".")}
    circles = _circles(graph)
    assert not circles, "\n".join(circles)


def sibling_edges() -> dict[tuple[str, str], list[str]]:
    """(child, child) → the imports behind it, for every import between two children of one package.

    A child is a module or a sub-package directly in the package: ``models/avatar/portrait/int8.py`` importing
    ``models/avatar/graph.py`` is the edge ``models.avatar.portrait → models.avatar.graph``. An import of a
    module's own package (or of its own submodule) is no edge. Imports inside functions count; those under
    ``if TYPE_CHECKING:`` (annotations only, never run) do not."""
    edges: dict[tuple[str, str], list[str]] = {}
    for name, path in MODULES.items():
        for line, target in imports(name, path, run_time_only=True):
            if target not in MODULES:
                continue
            a, b = name.split("."), target.split(".")
            shared = 0
            while shared < min(len(a), len(b)) and a[shared] == b[shared]:
                shared += 1
            if shared == len(a) or shared == len(b):
                continue  # one is the other's package
            edge = (".".join(a[:shared + 1]), ".".join(b[:shared + 1]))
            edges.setdefault(edge, []).append(f"{path.relative_to(REPO)}:{line} imports {target}")
    return edges


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of two or more nodes that reach each other (Tarjan), each sorted."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_no_circles_between_the_modules_of_a_package():
    """Inside every package, at every depth, its modules and sub-packages depend on each other one way:
    ``models.avatar.bundle`` loads ``portrait/``, so nothing in ``portrait/`` may use ``bundle`` or ``graph``;
    ``models.avatar`` may use ``models.onnx``, never the reverse. Shared helpers move down (to a leaf module,
    or a package below both). This covers the top-level packages too (``framegraph.*``)."""
    edges = sibling_edges()
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    found = []
    for group in _strongly_connected(graph):
        closing = [f"  {a} -> {b}: {why[0]}" for (a, b), why in sorted(edges.items()) if a in group and b in group]
        found.append(" <-> ".join(m.removeprefix("framegraph.") for m in group) + "\n" + "\n".join(closing))
    assert not found, "modules of one package import each other in a circle:\n" + "\n".join(found)
