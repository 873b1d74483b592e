"""The house's floors hold: imports point down, rooms keep their private names, rooms stay small.

``docs/architecture.md`` draws the floors; :data:`FLOORS` is the same table, and these tests read
every module's imports (``ast``, nothing is imported) to check that

- a room imports only rooms on its own floor or below, and no two rooms import each other in a
  circle (imports under ``if TYPE_CHECKING:`` are annotations, not dependencies, and are left out);
- no module imports itself through others at run time: every module a node, function-local
  imports included;
- no module imports a private name (``_name``) from another module, reaches into another module's
  private attribute, or imports a private module (``_name.py``) from outside its own package;
- no function of the packages is over 60 lines (the declarative tables named in
  :data:`LONG_TABLES` excepted). Modules are sized by their concept, not by a line count: one over
  ~800 lines is a question for review, not a failure.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "kernels", "analysis", "hydra_plugins", "dvfs")

FLOORS: dict[int, tuple[str, ...]] = {
    1: ("orchestrator", "orchestrator.errors", "orchestrator.config", "orchestrator.bounds",
        "orchestrator.progress", "orchestrator.interrupt", "orchestrator.devices", "kernels",
        "orchestrator.launching", "orchestrator.measuring", "orchestrator.results",
        "orchestrator.realgpu",
        "orchestrator.results.store", "orchestrator.results.provenance",
        "orchestrator.results.columns", "orchestrator.jobs", "orchestrator.jobs.request",
        "orchestrator.jobs.policy", "orchestrator.jobs.checks", "orchestrator.jobs.replies",
        "orchestrator.realgpu.measured", "orchestrator.realgpu.check_summary",
        "orchestrator.launching.ray_calls", "orchestrator.launching.estimate",
        "orchestrator.measuring.phases", "orchestrator.testing",
        "orchestrator.testing.chaos_watch"),
    2: ("orchestrator.measuring.guard", "orchestrator.jobs.job",
        "orchestrator.measuring.journal", "orchestrator.measuring.meter",
        "orchestrator.measuring.inject", "orchestrator.measuring.window",
        "orchestrator.measuring.memory",
        "orchestrator.measuring.trial_trace", "orchestrator.measuring.thermal",
        "orchestrator.launching.sweep_lock", "orchestrator.realgpu.calibrate",
        "orchestrator.realgpu.readings", "orchestrator.testing.chaos",
        "orchestrator.measuring.program", "orchestrator.measuring.charge", "dvfs"),
    3: ("orchestrator.results.rows", "analysis",
        "orchestrator.search", "orchestrator.launching.compose"),
    4: ("orchestrator.measuring.trial", "orchestrator.measuring.session",
        "orchestrator.measuring.command",
        "orchestrator.launching.resume", "orchestrator.launching.settings"),
    5: ("orchestrator.measuring.worker", "orchestrator.app", "orchestrator.realgpu.check",
        "orchestrator.measuring.monitor"),
    6: ("orchestrator.launching.slot", "orchestrator.launching.pool",
        "orchestrator.launching.supervisor", "orchestrator.launching.launch",
        "orchestrator.launching.batch", "orchestrator.launching.scheduling",
        "orchestrator.launching.calls",
        "orchestrator.launching.pool_join"),
    7: ("orchestrator.cli", "hydra_plugins", "orchestrator.testing.fuzz_cli"),
}
"""Floor -> rooms, bottom up: the table of ``docs/architecture.md``."""
FLOOR_OF = {room: floor for floor, rooms in FLOORS.items() for room in rooms}

MAX_FUNCTION_LINES = 60
LONG_TABLES: frozenset[str] = frozenset()
"""``module:function`` of declarative tables allowed past :data:`MAX_FUNCTION_LINES`."""


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def package_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


WINGS = ("launching", "measuring", "results", "realgpu", "testing", "jobs")
"""The folders of ``orchestrator`` whose modules are rooms each (a wing groups rooms)."""
WINGS_ABOVE: dict[str, tuple[str, ...]] = {
    "jobs": ("measuring", "results", "launching", "realgpu", "testing"),
}
"""A wing -> the wings above it, which no module of it may import at run time, whatever the
floors of their rooms (``jobs``, what a trial is asked to do, lies below those that run and
record it)."""


def room_of(module: str) -> str:
    """The room a module lives in: a module of a wing, a package of ``orchestrator`` or a top
    package (``kernels``, ``analysis``) counts as one room."""
    parts = module.split(".")
    if parts[0] != "orchestrator":
        return parts[0]
    if len(parts) > 2 and parts[1] in WINGS:
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imports_of(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, imported name or None) of each import of ours, annotations left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in PACKAGES:
                found += [(node.lineno, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names
                      if a.name.split(".")[0] in PACKAGES]
    return found


def room_edges() -> dict[str, dict[str, str]]:
    """room -> {room it imports: where (file:line)}."""
    edges: dict[str, dict[str, str]] = defaultdict(dict)
    for path in package_files():
        src = room_of(module_name(path))
        for line, module, name in imports_of(path):
            target = module if name is None else f"{module}.{name}"
            dst = room_of(target if (ROOT / Path(*target.split("."))).exists()
                          or (ROOT / Path(*target.split("."))).with_suffix(".py").exists()
                          else module)
            if dst != src:
                edges[src].setdefault(dst, f"{path.relative_to(ROOT)}:{line}")
    return edges


def test_every_room_of_the_packages_is_on_a_floor():
    rooms = {room_of(module_name(p)) for p in package_files()}
    assert sorted(rooms - set(FLOOR_OF)) == []
    assert sorted(set(FLOOR_OF) - rooms) == []


def test_imports_point_down_or_along_a_floor():
    upward = [f"{where}: {src} (floor {FLOOR_OF[src]}) imports {dst} (floor {FLOOR_OF[dst]})"
              for src, targets in room_edges().items() for dst, where in targets.items()
              if FLOOR_OF[dst] > FLOOR_OF[src]]
    assert upward == []


def test_no_wing_imports_a_wing_above_it():
    upward = [f"{where}: {src} imports {dst}"
              for src, targets in room_edges().items() for dst, where in targets.items()
              for wing, above in WINGS_ABOVE.items()
              if src.startswith(f"orchestrator.{wing}")
              and any(dst.startswith(f"orchestrator.{a}.") for a in above)]
    assert upward == []


def test_no_two_rooms_import_each_other_in_a_circle():
    edges = room_edges()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(room: str, stack: list[str]) -> None:
        state[room] = 1
        for nxt in edges.get(room, {}):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[room] = 2

    for room in sorted(edges):
        if room not in state:
            visit(room, [room])
    assert cycles == []


def run_time_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """:func:`imports_of`, less the imports of a top-level ``if __name__ == "__main__":`` block
    (it runs when the module is the program, never when it is imported)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    main = {line for node in tree.body if isinstance(node, ast.If)
            and "__main__" in ast.unparse(node.test)
            for line in range(node.lineno, node.end_lineno + 1)}
    return [found for found in imports_of(path) if found[0] not in main]


def resolve_import(module: str, name: str | None, modules: set[str]) -> str | None:
    """The module of ours an import loads: ``from pkg import sub`` the submodule ``pkg.sub``
    (not ``pkg``'s ``__init__``, which Python runs first for the namespace only); ``from
    pkg.mod import Name`` and ``import pkg.mod`` the module ``pkg.mod``; None for none of ours."""
    if name is not None and f"{module}.{name}" in modules:
        return f"{module}.{name}"
    while module and module not in modules:
        module = module.rpartition(".")[0]
    return module or None


def module_graph() -> dict[str, dict[str, str]]:
    """module -> {module it imports at run time: where (file:line)}, every module of the
    packages a node: function-local imports count (they run when the function is first called),
    imports under ``if TYPE_CHECKING:`` and in a ``__main__`` block do not."""
    paths = {module_name(p): p for p in package_files()}
    graph: dict[str, dict[str, str]] = {module: {} for module in paths}
    for module, path in paths.items():
        for line, imported, name in run_time_imports(path):
            target = resolve_import(imported, name, set(paths))
            if target is not None and target != module:
                graph[module].setdefault(target, f"{path.relative_to(ROOT)}:{line}")
    return graph


def import_cycles(graph: dict[str, dict[str, str]]) -> list[frozenset[str]]:
    """The groups of two or more modules that reach one another through imports (the graph's
    strongly connected components, Tarjan's algorithm): every cycle lies within one group."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(group) > 1:
                groups.append(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_module_imports_itself_at_run_time():
    # Every import that runs (function-local ones included) draws an arrow between two modules;
    # a group of modules that reach one another is a cycle.
    graph = module_graph()
    found = [sorted(f"{a} -> {b} ({where})" for a in group for b, where in graph[a].items()
                    if b in group)
             for group in import_cycles(graph)]
    assert found == []


def test_import_cycles_are_found_when_there(tmp_path):
    # The checker itself: a cycle of three is one group, a module that only imports into it is
    # not in it; `from pkg import sub` is the submodule; annotations and __main__ blocks do not
    # count, a function-local import does.
    graph = {"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}, "d": {"a": ""}, "e": {}}
    assert import_cycles(graph) == [frozenset("abc")]
    modules = {"kernels", "kernels.gemm", "kernels.spec"}
    assert resolve_import("kernels", "gemm", modules) == "kernels.gemm"
    assert resolve_import("kernels", "build_kernel", modules) == "kernels"
    assert resolve_import("kernels.spec", "KernelSpec", modules) == "kernels.spec"
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from kernels import spec\ndef f():\n    from kernels import cost\n"
                     "if __name__ == '__main__':\n    from kernels import registry\n")
    assert [name for _, _, name in run_time_imports(probe)] == ["cost"]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_reaches(path: Path, module: str | None = None) -> list[str]:
    """Each place ``path`` (the module ``module``) uses another module's private names."""
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found, modules_bound = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in PACKAGES:
            owner = node.module.rpartition(".")[0]
            if any(_private(p) for p in node.module.split(".")) and owner != package:
                found.append(f"{node.lineno}: imports the private module {node.module}")
            for a in node.names:
                if _private(a.name):
                    found.append(f"{node.lineno}: imports {a.name} from {node.module}")
                modules_bound.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PACKAGES:
                    modules_bound.add((a.asname or a.name).split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) \
                and isinstance(node.value, ast.Name) and node.value.id in modules_bound:
            found.append(f"{node.lineno}: reaches into {node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("top", [*PACKAGES, "scripts"])
def test_no_module_uses_another_modules_private_names(top):
    files = sorted((ROOT / top).rglob("*.py"))
    found = [f"{p.relative_to(ROOT)}:{line}" for p in files for line in private_reaches(p)]
    assert found == []


def test_private_reaches_are_seen_when_there(tmp_path):
    # The checker itself: an import of a private name, a private attribute and a private module
    # from another package are each found; the same package's private module is not.
    probe = tmp_path / "probe.py"
    probe.write_text("from orchestrator.results.rows import _hidden\n"
                     "import orchestrator.results.rows as r\n"
                     "r._secret\nfrom analysis._frame import OK\n"
                     "from orchestrator.devices.sim._x import y\n")
    found = private_reaches(probe, "analysis.probe")
    assert [f.split(":")[0] for f in found] == ["1", "5", "3"]


def test_no_function_is_over_a_screen():
    long = []
    for path in package_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                name = f"{module_name(path)}:{node.name}"
                if n > MAX_FUNCTION_LINES and name not in LONG_TABLES:
                    long.append(f"{name} ({n} lines)")
    assert long == []
