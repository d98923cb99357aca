#!/usr/bin/env python3
"""Rewrite old runtime module paths to their new homes (issue 44.1), in any file, as often as you like.

    python3 scripts/rewrite_runtime_imports.py                 # every tracked text file of the repository
    python3 scripts/rewrite_runtime_imports.py tests/test_x.py lessons/05_ddp.ipynb    # just these
    python3 scripts/rewrite_runtime_imports.py --check         # list what would change, exit 1 if anything

The moves are scripts/runtime_moves.txt (``distlab.runtime.OLD distlab.runtime.NEW.PATH`` per line). Each move
rewrites, where the old name stands alone (not part of a longer name):
- dotted names: imports, ``-m distlab.runtime.worker``, ``"distlab.runtime.executor:plan_task"`` launch targets,
  monkeypatch strings ``"distlab.runtime.load.sample"``, and the same without ``distlab.`` (``runtime.launch``);
- ``from distlab.runtime import load as machine_load, trust`` (one statement per new package; a module whose
  file was renamed keeps its old name as an alias: ``from distlab.runtime.modules import bridge as models``);
- paths in prose and docstrings: ``runtime/fit.py`` -> ``runtime/measure/fit.py``, ``runtime/ddp/`` ->
  ``runtime/parallel/ddp/``.
Idempotent: no new path contains an old one where it stands alone, so a second run changes nothing. A line that
says ``old path`` (the thin re-exports kept for users, docs/extending.md) is left as it is.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MOVES_FILE = ROOT / "scripts" / "runtime_moves.txt"
SUFFIXES = {".py", ".md", ".ipynb", ".sh", ".toml", ".txt", ".yaml", ".yml", ".cfg", ".json"}
SKIP = {"scripts/runtime_moves.txt", "scripts/rewrite_runtime_imports.py", "tests/test_runtime_layout.py"}
KEEP_MARK = "old path"
PREFIX = "distlab.runtime."


def read_moves(path: Path = MOVES_FILE) -> dict[str, str]:
    """{"launch": "ranks.launch", ...}: names relative to distlab.runtime."""
    moves = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        old, new = line.split()
        if not (old.startswith(PREFIX) and new.startswith(PREFIX)):
            raise SystemExit(f"{path}:{n}: both names must start with {PREFIX}")
        moves[old.removeprefix(PREFIX)] = new.removeprefix(PREFIX)
    return moves


def rules(moves: dict[str, str]) -> list[tuple[re.Pattern, object]]:
    """Two patterns, each with every old name as one alternative (longest first), and their replacements."""
    names = "|".join(re.escape(old) for old in sorted(moves, key=len, reverse=True))
    # dotted, with or without distlab. (a preceding "." or word means a longer name: not ours)
    # (after an escape such as \n in a string literal too)
    dotted = re.compile(rf"(?:(?<![\w.])|(?<=\\[nt]))((?:distlab\.)?)runtime\.({names})(?!\w)")
    # paths: runtime/old.py, runtime/old/ (a folder), runtime/old at the end of a phrase
    path = re.compile(rf"(?<![\w/.-])runtime/({names})(?=\.py\b|/|(?!\w|\.\w))")
    return [(dotted, lambda m: f"{m[1]}runtime.{moves[m[2]]}"),
            (path, lambda m: "runtime/" + moves[m[1]].replace(".", "/"))]


FROM_IMPORT = re.compile(r"(?P<indent>^[ \t]*)?from distlab\.runtime import "
                         r"(?P<names>\w+(?: as \w+)?(?:, *\w+(?: as \w+)?)*)", re.M)
# the same over several lines: from distlab.runtime import (a,\n    b)   (Python files only)
FROM_IMPORT_PARENS = re.compile(r"(?P<indent>^[ \t]*)from distlab\.runtime import \((?P<names>[\w\s,]+?),?\s*\)",
                                re.M)


def rewrite_from_import(match: re.Match, moves: dict[str, str], notebook: bool, names: str | None = None) -> str:
    """``from distlab.runtime import a, b as c`` -> one statement per package the names now live in."""
    groups: dict[str, list[str]] = {}
    for item in (names or match["names"]).split(","):
        name, _, alias = item.strip().partition(" as ")
        new = moves.get(name)
        if new is None:                                  # not moved (cli, commands, lessons)
            package, leaf = "", name
        else:
            package, _, leaf = ("." + new).rpartition(".")
        alias = alias or (name if leaf != name else "")
        groups.setdefault(package, []).append(leaf + (f" as {alias}" if alias else ""))
    indent = match["indent"]
    statements = [f"from distlab.runtime{package} import {', '.join(names)}" for package, names in groups.items()]
    joiner = "; " if indent is None or notebook else "\n" + indent
    return (indent or "") + joiner.join(statements)


def rewrite_text(text: str, moves: dict[str, str], notebook: bool = False) -> str:
    compiled = rules(moves)
    if not notebook:
        text = FROM_IMPORT_PARENS.sub(lambda m: rewrite_from_import(m, moves, notebook, " ".join(
            m["names"].split()).replace(" ,", ",")), text)
    out = []
    for line in text.splitlines(keepends=True):
        if "runtime" not in line or KEEP_MARK in line:
            out.append(line)
            continue
        line = FROM_IMPORT.sub(lambda m: rewrite_from_import(m, moves, notebook), line)
        for pattern, replacement in compiled:
            line = pattern.sub(replacement, line)
        out.append(line)
    return "".join(out)


def tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    return [ROOT / p for p in listed if Path(p).suffix in SUFFIXES and p not in SKIP]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [Path(a).resolve() for a in argv if a != "--check"] or tracked_files()
    moves = read_moves()
    changed = []
    for path in paths:
        if not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if "runtime" not in text:
            continue
        new = rewrite_text(text, moves, notebook=path.suffix == ".ipynb")
        if new != text:
            changed.append(path)
            if not check:
                path.write_text(new, encoding="utf-8")
    for path in changed:
        print(("would rewrite " if check else "rewrote ") + str(path.relative_to(ROOT) if path.is_relative_to(ROOT)
                                                             else path))
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
