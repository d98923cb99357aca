"""docs/accuracy.md, written by the benchmarks themselves: ``--markdown`` on a benchmark replaces its section.

    with report("overlap_accuracy", enabled=args.markdown):      # in a benchmark's main()
        ... print the figures as usual ...

Every benchmark run through ``run_main`` (or ``report``) ends with a line saying whether the machine's load left
its figures trustworthy (runtime/measure/trust.py). Each section holds what the script printed, verbatim, under a
header the script writes: the command line, the
date, the commit (``git rev-parse HEAD``, and whether the work tree had changes), the machine (host, CPU model,
cores), its load (runtime/measure/load.py before, runtime/measure/trust.py during) and whether that load leaves the figures
trustworthy (runtime/measure/trust.py: other processes under 10% of the cores). Nobody edits the file by hand:
tests/test_docs.py checks that every section has this header and names a benchmark that has ``--markdown``.
Sections are delimited by ``<!-- begin NAME -->`` and ``<!-- end NAME -->`` and kept in name order; running one
benchmark leaves the others' sections as they were.
"""
from __future__ import annotations

import contextlib
import io
import os
import platform
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "accuracy.md")
TITLE = ("# Accuracy and speed, as measured\n\n"
         "Written by the benchmark scripts (`python benchmarks/NAME.py --markdown`), never by hand: each section is "
         "what the script printed, with the command, date, commit, machine and load it ran on. Figures depend on "
         "the machine and its load; a section whose load was too high says so (runtime/measure/trust.py).\n")


def commit() -> str:
    """``HEAD``'s hash, with ``+changes`` when the work tree differs from it; 'unknown' outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    from distlab.runtime.ranks.preflight import cpu_cores
    return f"{platform.node()}, {cpu}, {cpu_cores()} cores, Python {platform.python_version()}"


def header(name: str, argv: list[str], before, during: dict | None) -> str:
    load = before.line() if before is not None else "unknown"
    seen = (f"other processes used {during['background_cores']:.2f} of {during['cores']} cores during the "
            f"{during['window_s']:g} s run, load average {during['loadavg_1m']}" if during else "unknown")
    return (f"## {name}\n\n"
            f"- command: `python benchmarks/{name}.py {shlex.join(argv)}`\n"
            f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}\n"
            f"- commit: {commit()}\n"
            f"- machine: {machine()}\n"
            f"- load before: {load}\n"
            f"- load during: {seen}\n"
            f"- {verdict(before, during)}\n")


def verdict(before, during) -> str:
    """'trustworthy: ...' or 'NOT TRUSTWORTHY: ...' by runtime/measure/trust.py's load rule."""
    from distlab.runtime.measure.trust import judge
    v = judge(before, during)
    return "trustworthy: other processes stayed under 10% of the cores" if v["trustworthy"] else (
        "NOT TRUSTWORTHY as this machine's figures: " + "; ".join(v["reasons"]))


def replace_section(text: str, name: str, body: str) -> str:
    """``text`` (the document) with section ``name`` set to ``body``; sections in name order after the title."""
    sections = dict(re.findall(r"<!-- begin (\S+) -->\n(.*?)<!-- end \1 -->\n", text, re.S))
    sections[name] = body if body.endswith("\n") else body + "\n"
    return TITLE + "".join(f"\n<!-- begin {k} -->\n{v}<!-- end {k} -->\n" for k, v in sorted(sections.items()))


@contextlib.contextmanager
def report(name: str, enabled: bool, argv: list[str] | None = None, path: str = DOC):
    """Read the machine's load before and during the benchmark and print, at its end, whether that load leaves
    its figures trustworthy (runtime/measure/trust.py); when ``enabled`` (--markdown), also keep what it printed and write
    it as section ``name`` of docs/accuracy.md (also when the benchmark exits with a missed target; not on an
    exception)."""
    from distlab.runtime.measure import load as machine_load
    from distlab.runtime.measure.trust import Watch
    before, watch = machine_load.sample(), Watch(adopt_orphans=True)     # validate's fork servers outlive it
    buffer, real = io.StringIO(), sys.stdout

    class Tee(io.TextIOBase):
        def write(self, s):
            buffer.write(s)
            return real.write(s)

        def flush(self):
            real.flush()
    if enabled:
        sys.stdout = Tee()
    try:
        yield
    finally:
        sys.stdout = real
    during = watch.stop()
    print(verdict(before, during))
    if not enabled:
        return
    argv = sys.argv[1:] if argv is None else argv
    body = header(name, argv, before, during) + "\n```\n" + buffer.getvalue().rstrip() + "\n```\n"
    text = open(path).read() if os.path.exists(path) else ""
    from distlab.sim.io import write_atomic
    write_atomic(path, replace_section(text, name, body))
    print(f"wrote section {name} of {os.path.relpath(path, ROOT)}")


def run_main(name: str, main) -> int:
    """A benchmark's ``if __name__ == "__main__"``: ``--markdown`` anywhere on the command line writes its
    section of docs/accuracy.md (``report``); ``main()`` sees the other arguments in sys.argv."""
    argv = sys.argv[1:]
    sys.argv = [sys.argv[0], *[a for a in argv if a != "--markdown"]]
    with report(name, "--markdown" in argv, argv):
        return main()
