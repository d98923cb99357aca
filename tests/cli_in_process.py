"""`distlab ARGS` run in the test's own process, for tests that are about a command's output, exit code and files
rather than the process itself (signals, a killed launcher, start-up, the environment: those keep a subprocess,
conftest.py's ``run_cli``). In this process a command costs no interpreter start-up (~0.8 s of CPU) and its ranks
come from this process's fork server (runtime/ranks/forkserver.py), which imports torch once for every launch of the
test file instead of once per command (~3 s of CPU each).

    from cli_in_process import cli          # the fixture, replacing conftest.py's subprocess one in that file

    def test_x(cli):
        rc, out, err = cli("simulate", "scenarios/ddp-cpu.yaml", "--no-files")

The same contract as the subprocess: (exit code, stdout, stderr), run from the repository root (relative paths
such as scenarios/... resolve the same); argparse's errors leave through SystemExit, whose code is the exit code.
An uncaught exception (a traceback in a subprocess) fails the test where it is raised.
"""
from __future__ import annotations

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_in_process(capsys, *argv) -> tuple[int, str, str]:
    """`distlab ARGV` in this process: (exit code, stdout, stderr) of this command only."""
    from distlab.runtime.cli import main
    capsys.readouterr()                          # what earlier code printed is not this command's
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:                      # argparse (Parser.error, --help, --version)
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def cli(capsys, monkeypatch):
    """``cli(*args)`` -> (exit code, stdout, stderr), in this process, from the repository root."""
    monkeypatch.chdir(ROOT)

    def run(*argv, timeout=None):                # timeout: accepted as conftest's run_cli does, unused here
        return run_in_process(capsys, *argv)
    return run
