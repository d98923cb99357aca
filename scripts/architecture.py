#!/usr/bin/env python3
"""The package picture of docs/architecture.md, drawn from the code: which package imports which.

    python scripts/architecture.py            # writes docs/architecture.png and the table in docs/architecture.md
    python scripts/architecture.py --check    # exit 1 when the doc's table no longer matches the imports

Every .py file under sim/ and runtime/ is parsed (tests/test_import_graph.py's ``import_graph``: imports at
module level and inside functions, ``distlab.`` stripped) and its module is put in its package: the first
folder under sim/ or runtime/ (sim/kernel, runtime/ranks, ...; sim/parallel/ddp counts as sim/parallel). The
files at the top of sim/ form two nodes: ``sim base`` (the ones that reach no package: errors, io, dtypes, files,
mesh ...) and ``sim`` (the rest: plan, trace, scenario, cli ...); runtime's top files (cli.py, worker.py) are
``runtime``. An arrow A -> B: a module of A imports one of B.

The picture is layered: packages that import each other (a strongly connected component, Tarjan) share a row,
and each row sits above every row it imports (longest path in the condensed graph). It draws an arrow only
where no longer path already leads there (transitive reduction), so that it stays readable; the table in the doc
lists every package's direct imports in full.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
FIGURE = ROOT / "docs" / "architecture.png"
BEGIN = "<!-- scripts/architecture.py writes from here: do not edit by hand -->"
END = "<!-- scripts/architecture.py: end -->"
TOPS = ("sim", "runtime")


def _graph_tools():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tests" / "test_import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def package_names(root: Path = ROOT) -> list[str]:
    """The picture's nodes, from the tree alone: sim base, sim, runtime, and every first-level package."""
    folders = [f"{top}/{d.name}" for top in TOPS for d in sorted((root / top).iterdir())
               if (d / "__init__.py").is_file()]
    return ["sim base", "sim", "runtime"] + folders


def package_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """package -> the packages its modules import (module docstring)."""
    tools = _graph_tools()
    graph = tools.import_graph(root, TOPS)

    def in_package(name: str) -> bool:
        parts = name.split(".")
        return len(parts) >= 2 and (root / parts[0] / parts[1]).is_dir()

    def reaches_a_package(name: str) -> bool:
        seen, todo = set(), [name]
        while todo:
            for other in graph[todo.pop()] - seen:
                if in_package(other):
                    return True
                seen.add(other)
                todo.append(other)
        return False

    def node(name: str) -> str:
        parts = name.split(".")
        if in_package(name):
            return f"{parts[0]}/{parts[1]}"
        if parts[0] == "sim" and not reaches_a_package(name):
            return "sim base"
        return parts[0]

    nodes = {name: node(name) for name in graph}
    out: dict[str, set[str]] = {p: set() for p in package_names(root)}
    for name, imported in graph.items():
        out[nodes[name]] |= {nodes[i] for i in imported} - {nodes[name]}
    return out


def layers(graph: dict[str, set[str]]) -> tuple[list[list[str]], list[tuple[str, str]]]:
    """(rows from the bottom up, arrows to draw): components on one row, each above what it imports; arrows of
    the transitive reduction between components, and every arrow inside a component."""
    components = _graph_tools().cycles(graph)
    component_of = {p: tuple(c) for c in components for p in c}
    for p in graph:
        component_of.setdefault(p, (p,))
    condensed: dict[tuple, set[tuple]] = {c: set() for c in component_of.values()}
    for p, imported in graph.items():
        condensed[component_of[p]] |= {component_of[i] for i in imported} - {component_of[p]}
    level: dict[tuple, int] = {}

    def height(c: tuple) -> int:
        if c not in level:
            level[c] = 1 + max((height(d) for d in condensed[c]), default=-1)
        return level[c]

    rows: list[list[str]] = [[] for _ in range(1 + max(height(c) for c in condensed))]
    for c in sorted(condensed, key=lambda c: (c[0].split("/")[0] != "sim", c)):
        rows[height(c)] += list(c)

    def reach(c: tuple, skip: tuple) -> set:
        seen, todo = set(), [d for d in condensed[c] if d != skip]
        while todo:
            d = todo.pop()
            if d not in seen:
                seen.add(d)
                todo += condensed[d]
        return seen
    arrows = []
    for p, imported in sorted(graph.items()):
        for i in sorted(imported):
            a, b = component_of[p], component_of[i]
            if a == b or b not in reach(a, skip=b):
                arrows.append((p, i))
    return rows, arrows


def draw(graph: dict[str, set[str]], path: Path = FIGURE):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch
    rows, arrows = layers(graph)
    width = max(len(r) for r in rows)
    fig, ax = plt.subplots(figsize=(1.9 * width + 1, 1.15 * len(rows) + 1.2))
    where = {}
    for y, row in enumerate(rows):
        for x, p in enumerate(row):
            where[p] = (x + (width - len(row)) / 2, y)
    boxes = {}
    for p, (x, y) in where.items():
        colour = "#dbe8f7" if p.startswith("sim") else "#fbe3cc"
        boxes[p] = ax.text(x, y, p, ha="center", va="center", fontsize=9, zorder=3,
                           bbox=dict(boxstyle="round,pad=0.4", fc=colour, ec="#555555"))
    for a, b in arrows:
        (xa, ya), (xb, yb) = where[a], where[b]
        same_row = ya == yb
        ax.add_patch(FancyArrowPatch((xa, ya), (xb, yb), arrowstyle="-|>", mutation_scale=9, lw=0.7,
                                     color="#b03030" if same_row else "#666666", zorder=1, shrinkA=14, shrinkB=14,
                                     connectionstyle="arc3,rad=0.25" if same_row else "arc3,rad=0.0"))
    ax.set_xlim(-0.8, width - 0.2)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.axis("off")
    ax.set_title("distlab's packages: an arrow A -> B means A imports B (grey: one way; red: both ways, in a "
                 "cycle)\nblue: sim (never imports torch or runtime), orange: runtime; arrows a longer path "
                 "implies are left out", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return fig


def table(graph: dict[str, set[str]]) -> str:
    """The doc's generated part: every package's direct imports, and the packages that import each other."""
    lines = [BEGIN, "", "| package | imports |", "| --- | --- |"]
    lines += [f"| {p} | {', '.join(sorted(graph[p])) or '(nothing of distlab)'} |" for p in package_names()]
    cycles = _graph_tools().cycles(graph)
    lines += ["", "Packages that import each other (through different modules: no module imports itself back, "
                  "`python3 ../shared/tools/import_cycles.py`):", ""]
    lines += [f"- {', '.join(c)}" for c in cycles] or ["- none"]
    return "\n".join(lines + ["", END])


def with_table(doc: str, block: str) -> str:
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC}: the markers {BEGIN!r} and {END!r} are missing")
    head, rest = doc.split(BEGIN, 1)
    return head + block + rest.split(END, 1)[1]


def main(argv: list[str]) -> int:
    graph = package_graph()
    doc = DOC.read_text()
    new = with_table(doc, table(graph))
    if "--check" in argv:
        if new != doc:
            print(f"{DOC.relative_to(ROOT)} is stale: run python scripts/architecture.py")
            return 1
        return 0
    DOC.write_text(new)
    draw(graph)
    print(f"wrote {FIGURE.relative_to(ROOT)} and the table in {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
