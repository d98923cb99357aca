"""No import cycles in sim/ or runtime/ (issue 11.6), checked statically: every .py file is parsed with ast, and
every import it holds counts, at module level or inside a function (a lazy import still ties the two files
together): ``import distlab.x.y``, ``from distlab.x import y`` (y a module or a name in x) and relative imports.
An import names the longest module of the repository it reaches (``distlab.`` stripped: sim.x, runtime.y); the
cycles are the strongly connected components of that graph (Tarjan) with more than one module."""
from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("sim", "runtime")


def modules(root: Path, folders=FOLDERS) -> dict[str, Path]:
    """Dotted module name (relative to ``root``; a package is named by its folder) -> its file."""
    found = {}
    for top in folders:
        for path in sorted((root / top).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports_of(path: Path, name: str, known: dict) -> set[str]:
    """The modules of ``known`` that the file ``path`` (module ``name``) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:                   # from . import x / from ..y import z
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            target = target.removeprefix("distlab.")
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph(root: Path, folders=FOLDERS) -> dict[str, set[str]]:
    known = modules(root, folders)
    return {name: imports_of(path, name, known) for name, path in known.items()}


@functools.lru_cache(maxsize=1)
def repo_graph() -> dict[str, set[str]]:
    """The repository's graph, parsed once for every test of this file (do not mutate)."""
    return import_graph(ROOT)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative), each sorted, sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_graph_resolves_namespace_relative_and_function_level_imports(tmp_path):
    write(tmp_path, {"sim/__init__.py": "", "sim/a.py": "from distlab.sim.b import thing\n",
                     "sim/b.py": "def f():\n    from . import c\n",
                     "sim/c.py": "import distlab.sim.d.e as e\n", "sim/d/__init__.py": "",
                     "sim/d/e.py": "from ..a import x\nimport os\n"})
    graph = import_graph(tmp_path, ("sim",))
    assert graph["sim.a"] == {"sim.b"}
    assert graph["sim.b"] == {"sim", "sim.c"}                  # `from . import c`: the package and c
    assert graph["sim.c"] == {"sim.d.e"}
    assert graph["sim.d.e"] == {"sim.a"}                       # os is not ours
    assert cycles(graph) == [["sim.a", "sim.b", "sim.c", "sim.d.e"]]


def test_no_cycle_when_the_shared_code_is_imported_one_way(tmp_path):
    """The runtime's old cycle (workload -> validation.case, validation -> workload) and its fix."""
    files = {"runtime/__init__.py": "",
             "runtime/parallel/ddp.py": "def cases():\n    from distlab.runtime.measure.validation import case\n",
             "runtime/measure/validation.py": "def scenario_cases():\n"
                                              "    from distlab.runtime.parallel.ddp import cases\n"}
    write(tmp_path, files)
    assert cycles(import_graph(tmp_path, ("runtime",))) == [["runtime.measure.validation", "runtime.parallel.ddp"]]
    write(tmp_path, {"runtime/measure/validation.py": "def case():\n    pass\n",
                     "runtime/parallel/registry.py": "from distlab.runtime.parallel import ddp\n"})
    assert cycles(import_graph(tmp_path, ("runtime",))) == []


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_import_cycles(folder):
    """One graph over sim/ and runtime/ together; each folder's test lists the cycles that touch it."""
    found = [c for c in cycles(repo_graph()) if any(m.split(".")[0] == folder for m in c)]
    assert not found, "import cycles in " + folder + "/:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_graph_sees_the_real_imports():
    """The graph is not empty by mistake: known edges of the repository are in it."""
    graph = repo_graph()
    assert "runtime.measure.validation" in graph["runtime.parallel.ddp.validate"]
    assert "runtime.parallel.ddp.validate" in graph["runtime.parallel.registry"]
    assert "sim.plan" in graph["sim.kernel.engine"]
    assert all(os.path.exists(p) for p in modules(ROOT).values())


# Layers (issue 44.3): sim/parallel/ builds plans from options, a mesh and a model; the scenario (sim/scenario/),
# the workload records (sim/workloads/) and the planner (sim/planner/) sit above it and call down into it, never
# the other way round, so a parallelism can be read, tested and reused without the scenario machinery.
LOWER, UPPER = "sim.parallel", ("sim.scenario", "sim.workloads", "sim.planner")


def upward_imports(graph: dict[str, set[str]], lower: str = LOWER, upper=UPPER) -> list[str]:
    """'a -> b' for every module a under ``lower`` that imports a module b under one of ``upper``."""
    inside = lambda name, top: name == top or name.startswith(top + ".")  # noqa: E731
    return sorted(f"{a} -> {b}" for a, targets in graph.items() if inside(a, lower)
                  for b in targets if any(inside(b, u) for u in upper))


def test_upward_import_rule_sees_a_lazy_back_import(tmp_path):
    write(tmp_path, {"sim/__init__.py": "", "sim/parallel/__init__.py": "", "sim/parallel/x.py":
                     "def f():\n    from distlab.sim import scenario\n", "sim/scenario.py": "",
                     "sim/workloads/__init__.py": "", "sim/workloads/base.py": "from distlab.sim.parallel import x\n",
                     "sim/parallel/y.py": "from distlab.sim.workloads.base import option\n"})
    assert upward_imports(import_graph(tmp_path, ("sim",))) == [
        "sim.parallel.x -> sim.scenario", "sim.parallel.y -> sim.workloads.base"]


def test_parallel_never_imports_scenario_workloads_or_planner():
    found = upward_imports(repo_graph())
    assert not found, ("sim/parallel/ imports a layer above it (move the helper up, or the shared piece down "
                       "into sim/parallel/):\n" + "\n".join(found))
