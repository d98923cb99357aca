"""Issue 12.2: every output flag refuses a path it cannot write (one line, exit 2, nothing written, no folder
created), files get the umask's permissions, and binary or non-UTF-8 inputs are one-line errors."""
from __future__ import annotations

import os
import stat

import pytest

from distlab.runtime.cli import main
from distlab.sim.errors import ConfigError
from distlab.sim.io import check_output, write_atomic
from distlab.sim.plan import Collective, Plan


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def plan_file(tmp_path):
    path = tmp_path / "plan.json"
    Plan([[Collective("all_reduce", 1024)], [Collective("all_reduce", 1024)]]).save(str(path))
    return path


def cases(tmp):
    """(argv, message, path that must not appear): 14 distinct unwritable outputs over 6 commands."""
    a_file = tmp / "a-file.txt"
    return [
        (["collective", "all_reduce", "--plot", "/nonexistent-distlab/x.png"], "does not exist",
         "/nonexistent-distlab"),
        (["collective", "all_reduce", "--timeline", a_file / "x.png"], "is a file, not a folder", a_file / "x.png"),
        (["collective", "all_reduce", "--size", "1MiB", "--trace", tmp], "is a folder", None),
        (["collective", "all_reduce", "--trace", "/sys/distlab-x.json"], "folder /sys exists but files cannot be created",
         "/sys/distlab-x.json"),
        (["collective", "all_reduce", "--plot", tmp / "busbw.txt"], "is not a figure format", tmp / "busbw.txt"),
        (["collective", "all_reduce", "--trace", tmp / "t.txt"], "allowed: .json, .trace", tmp / "t.txt"),
        (["collective", "all_reduce", "--plot", tmp / "same.png", "--timeline", tmp / "same.png"],
         "give each output its own file", tmp / "same.png"),
        (["bench", "--out", str(tmp / "sub") + "/"], "is a folder", tmp / "sub"),
        (["bench", "--plot", tmp / "noext"], "no extension", tmp / "noext"),
        (["simulate", "--out", a_file], "is a file; give a folder", None),
        (["simulate", "--out", tmp / "missing" / "deeper"], "does not exist", tmp / "missing"),
        (["run", "PLAN", "--out", tmp / "nope" / "t.trace"], "does not exist", tmp / "nope"),
        (["validate", "--plot", tmp / "v.xyz"], "is not a figure format", tmp / "v.xyz"),
        (["calibrate", "--out", tmp / "gone" / "c.yaml"], "does not exist", tmp / "gone"),
    ]


def test_unwritable_outputs_are_one_line_exit_2_and_write_nothing(capsys, tmp_path, plan_file):
    (tmp_path / "a-file.txt").write_text("x")
    checked = set()
    for argv, message, absent in cases(tmp_path):
        argv = [plan_file if a == "PLAN" else a for a in argv]
        before = sorted(os.listdir(tmp_path))
        rc, out, err = run(capsys, *argv)
        assert rc == 2, (argv, out, err)
        assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
        assert out == "", argv                        # nothing computed: no table either
        assert sorted(os.listdir(tmp_path)) == before, argv
        if absent is not None:
            assert not os.path.exists(absent), argv
        checked.add(str(argv[-1]))
    assert len(checked) >= 10


def test_no_parent_folder_is_created(capsys, tmp_path):
    target = tmp_path / "new" / "x.png"
    rc, _, err = run(capsys, "collective", "all_reduce", "--plot", target)
    assert rc == 2 and not (tmp_path / "new").exists()
    (tmp_path / "new").mkdir()                        # the user creates it: then it works
    rc, _, err = run(capsys, "collective", "all_reduce", "--plot", target)
    assert rc == 0, err
    assert target.read_bytes()[:4] == b"\x89PNG"


def test_simulate_creates_only_the_folder_asked_for(capsys, tmp_path):
    rc, _, err = run(capsys, "simulate", "--out", tmp_path / "out", "--json")
    assert rc == 0, err
    assert sorted(os.listdir(tmp_path / "out")) == ["timeline.png", "trace.json"]


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_files_get_the_umask_permissions(capsys, tmp_path, mask):
    old = os.umask(mask)
    try:
        rc, _, err = run(capsys, "collective", "all_reduce", "--size", "1MiB", "--trace", tmp_path / "t.json",
                         "--plot", tmp_path / "p.png")
        write_atomic(str(tmp_path / "w.txt"), "text")
    finally:
        os.umask(old)
    assert rc == 0, err
    for name in ("t.json", "p.png", "w.txt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~mask, name
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]        # no temporary files left


def test_an_existing_file_keeps_its_mode(tmp_path):
    path = tmp_path / "kept.json"
    path.write_text("{}")
    path.chmod(0o640)
    write_atomic(str(path), "[1]")
    assert path.read_text() == "[1]" and stat.S_IMODE(path.stat().st_mode) == 0o640


def test_check_output_kinds(tmp_path):
    assert check_output(str(tmp_path / "fig.svg"), "--plot", "figure") == str(tmp_path / "fig.svg")
    assert check_output(str(tmp_path / "t.trace"), "--trace", "trace")
    assert check_output(str(tmp_path / "new-folder"), "--out", "dir")        # the folder itself may be created
    for path, kind in ((tmp_path / "f.docx", "figure"), (tmp_path / "a" / "b", "dir"), ("", "file")):
        with pytest.raises(ConfigError):
            check_output(str(path), "--x", kind)
    assert not os.listdir(tmp_path)                   # the write probe leaves nothing behind


@pytest.mark.parametrize("command,data,message", [
    (["check", "FILE"], b"\x89PNG\r\n\x1a\n\0\0\0", "binary file"),
    (["run", "FILE"], "{\"ranks\": [[]], \"name\": \"caf\xe9\"}".encode("latin-1"), "not UTF-8"),
    (["collective", "all_reduce", "--cluster", "FILE"], "name: caf\xe9\n".encode("latin-1"), "not UTF-8"),
    (["simulate", "FILE", "--no-files"], b"\0\0\0\0binary", "binary file"),
])
def test_binary_or_non_utf8_inputs_are_one_line(capsys, tmp_path, command, data, message):
    path = tmp_path / ("in.yaml" if command[0] in ("collective", "simulate") else "in.json")
    path.write_bytes(data)
    rc, out, err = run(capsys, *[path if a == "FILE" else a for a in command])
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_outputs_are_checked_before_the_work(capsys, tmp_path):
    """A sweep with a bad --plot fails at once: no rows printed, nothing written."""
    rc, out, err = run(capsys, "collective", "all_gather", "--sizes", "1KiB:1GiB", "--plot", tmp_path / "x" / "p.png",
                       "--json")
    assert rc == 2 and out == "" and not os.listdir(tmp_path)


def test_every_output_folder_in_runtime_and_sim_is_made_through_the_checked_path(tmp_path, capsys, monkeypatch):
    """Issue 41 item 3: no os.makedirs (which follows links and makes parents unchecked) in runtime/ or sim/: the
    pipeline tool, the lessons, the elastic run_local and the flight recorder make their folders with
    sim/files.py make_folder or open_folder. The pipeline tool refuses a link at --out before it measures."""
    import re
    root = os.path.join(os.path.dirname(__file__), "..")
    found = []
    for top in ("runtime", "sim"):
        for folder, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if name.endswith(".py"):
                    text = open(os.path.join(folder, name), encoding="utf-8").read()
                    found += [f"{folder}/{name}" for _ in re.finditer(r"\bos\.makedirs\(", text)]
    assert not found, found
    from distlab.runtime.parallel.pipeline import run as pipeline_run
    monkeypatch.setattr(pipeline_run, "measure", lambda *a, **k: pytest.fail("measured through a link"))
    (tmp_path / "real").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "real")
    assert pipeline_run.main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "out is a symbolic link; distlab writes only into a real folder" in err, err
