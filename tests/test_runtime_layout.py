"""runtime/ in rooms (issue 44.1): the top level keeps its entry points, each room's docstring maps its files, and
scripts/rewrite_runtime_imports.py moves any file's old paths to the new ones, idempotently."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ("ranks", "execute", "measure", "restart", "diagnosis", "modules", "parallel", "lessons", "commands")
spec = importlib.util.spec_from_file_location("rewrite", ROOT / "scripts" / "rewrite_runtime_imports.py")
rewrite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rewrite)


def test_runtime_top_level_keeps_only_its_entry_points():
    assert sorted(p.name for p in (ROOT / "runtime").glob("*.py")) == ["__init__.py", "cli.py", "worker.py"]


def test_each_room_opens_with_a_docstring_naming_each_of_its_files():
    for room in ROOMS:
        folder = ROOT / "runtime" / room
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        names = [p.name for p in folder.glob("*.py") if p.name != "__init__.py"]
        names += [p.name + "/" for p in folder.iterdir() if (p / "__init__.py").is_file()]
        missing = [n for n in names if n not in doc]
        assert names and not missing, f"runtime/{room}/__init__.py does not name {missing}"


def test_every_move_lands_on_a_module_that_exists_and_the_old_one_is_gone():
    moves = rewrite.read_moves()
    for old, new in moves.items():
        path = ROOT / "runtime" / Path(*new.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), new
        gone = ROOT / "runtime" / old
        assert old == "worker" or not (gone.with_suffix(".py").exists() or gone.exists()), old


def test_the_old_worker_path_runs_the_new_worker():
    from distlab.runtime import worker
    from distlab.runtime.ranks import worker as new
    assert worker.main is new.main


SAMPLE = '''from distlab.runtime import load as machine_load, trust, cli
    from distlab.runtime import models
from distlab.runtime.launch import Launch
Launch("distlab.runtime.executor:plan_task", payload, 2)
monkeypatch.setattr("distlab.runtime.load.sample", fake)
torchrun -m distlab.runtime.worker PLAN.json
explain("W1130 x\\ndistlab.runtime.worker: error: ...")
see runtime/fit.py and runtime/ddp/run.py, through runtime.launch; runtime/tp
    "from distlab.runtime import wire\\n",
kept: distlab.runtime.launch (old path)
untouched: distlab.runtime.launcher sim/parallel/ddp distlab.runtime.commands.run runtime/ranks/launch.py x.runtime.fit
'''
EXPECTED = '''from distlab.runtime.measure import load as machine_load, trust
from distlab.runtime import cli
    from distlab.runtime.modules import bridge as models
from distlab.runtime.ranks.launch import Launch
Launch("distlab.runtime.execute.executor:plan_task", payload, 2)
monkeypatch.setattr("distlab.runtime.measure.load.sample", fake)
torchrun -m distlab.runtime.ranks.worker PLAN.json
explain("W1130 x\\ndistlab.runtime.ranks.worker: error: ...")
see runtime/measure/fit.py and runtime/parallel/ddp/run.py, through runtime.ranks.launch; runtime/parallel/tp
    "from distlab.runtime.execute import wire\\n",
kept: distlab.runtime.launch (old path)
untouched: distlab.runtime.launcher sim/parallel/ddp distlab.runtime.commands.run runtime/ranks/launch.py x.runtime.fit
'''


def test_rewrite_moves_imports_strings_and_paths_and_a_second_run_changes_nothing():
    moves = rewrite.read_moves()
    once = rewrite.rewrite_text(SAMPLE, moves)
    assert once == EXPECTED
    assert rewrite.rewrite_text(once, moves) == once


def test_a_notebook_line_importing_from_two_rooms_stays_one_line():
    line = '    "from distlab.runtime import launch, fit\\n",\n'
    assert rewrite.rewrite_text(line, rewrite.read_moves(), notebook=True) == \
        '    "from distlab.runtime.ranks import launch; from distlab.runtime.measure import fit\\n",\n'


def test_no_old_path_is_left_in_the_repository(capsys):
    assert rewrite.main(["--check"]) == 0, capsys.readouterr().out


def test_a_parenthesized_import_over_several_lines_is_split_by_room():
    src = "def f():\n    from distlab.runtime import (launch, fit,\n                                 cli)\n"
    assert rewrite.rewrite_text(src, rewrite.read_moves()) == (
        "def f():\n    from distlab.runtime.ranks import launch\n    from distlab.runtime.measure import fit\n"
        "    from distlab.runtime import cli\n")
