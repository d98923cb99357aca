"""Keep README.md's worked examples real: re-run every ```console block's simulator command and put its output
back in the block.

    python scripts/readme_examples.py            # rewrite the blocks in place
    python scripts/readme_examples.py --check    # exit 1 (and say which) when a block differs from its command

A block is ``$ distlab ...`` followed by that command's output. Blocks of simulator commands (SIMULATED: no
real ranks, deterministic) are regenerated; blocks of commands that measure this machine (validate, calibrate,
bench, run) are real measurements and stay as they were printed, with the date they say. An output cut short in
the README ends with a line starting with '...' after the lines it keeps: the command's first lines must match
them. tests/test_docs.py runs the check.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
SIMULATED = ("collective", "simulate", "memory", "check")
BLOCK = re.compile(r"```console\n(.*?)```\n", re.S)


def output_of(command: str) -> str:
    """What ``distlab ...`` prints (run in-process from the repository's folder)."""
    from distlab.runtime.cli import main
    argv = shlex.split(command)[1:]
    buffer = io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(buffer):
            main(argv)
    finally:
        os.chdir(cwd)
    return buffer.getvalue()


def blocks(text: str):
    """(match, command, shown output lines) of every console block with one simulator command."""
    for m in BLOCK.finditer(text):
        lines = m.group(1).splitlines()
        commands = [i for i, line in enumerate(lines) if line.startswith("$ ")]
        if len(commands) != 1 or commands[0] != 0:
            continue
        command = lines[0][2:].split("  #")[0].strip()
        if command.split()[:2][-1] in SIMULATED:
            yield m, command, lines[1:]


def refreshed(shown: list[str], real: str) -> list[str]:
    """The block's new output: all of it, or as many first lines as the README kept, then its '...' line."""
    lines = real.rstrip("\n").splitlines()
    cut = next((i for i, line in enumerate(shown) if line.startswith("...")), None)
    return lines if cut is None else lines[:cut] + shown[cut:]


FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)
TABLE_EXAMPLE = re.compile(r"^\|[^|]*\|[^|]*\| `(distlab [^`]+)` \|$", re.M)
INLINE = re.compile(r"`(distlab [^`]+)`")
FILE_WORD = re.compile(r"(^|/)[\w.-]+\.(json|ya?ml|trace|flight)$|^scenarios/")


def commands(text: str) -> list[str]:
    """Every `distlab ...` command a page gives to be run, in page order: each line of a fenced block that starts
    with it (after '$ '; a trailing '# comment' dropped), each example of README's command table, and each
    inline `distlab ...` that names a file (a path, or a .json/.yaml/.trace/.flight), which must then exist or
    be written by a command before it. Other inline mentions (`distlab run --out`) name a flag, not a command."""
    found = []
    for m in FENCE.finditer(text):
        for line in m.group(2).splitlines():
            line = line.strip().removeprefix("$ ")
            for part in line.split(" && "):
                part = part.split("  #")[0].split(" #")[0].strip()
                if part.startswith("distlab "):
                    found.append((m.start(), part))
    for m in TABLE_EXAMPLE.finditer(text):
        found.append((m.start(), m.group(1)))
    fenced = [(m.start(), m.end()) for m in FENCE.finditer(text)]
    for m in INLINE.finditer(text):
        inside = any(a <= m.start() < b for a, b in fenced)
        words = shlex.split(m.group(1))
        if not inside and not TABLE_EXAMPLE.match(text[text.rfind("\n", 0, m.start()) + 1:
                                                        text.find("\n", m.end()) if "\n" in text[m.end():] else None]) \
                and any(FILE_WORD.search(w) for w in words[2:]):
            found.append((m.start(), m.group(1)))
    return [c for _, _, c in sorted((at, i, c) for i, (at, c) in enumerate(found))]


def main(argv=None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    text = open(README).read()
    stale, out, last = [], [], 0
    for m, command, shown in blocks(text):
        new = refreshed(shown, output_of(command))
        if new != shown:
            stale.append(command)
        out.append(text[last:m.start()] + "```console\n$ " + command + "\n" + "\n".join(new) + "\n```\n")
        last = m.end()
    if check:
        for command in stale:
            print(f"README.md: the output shown for `{command}` is not what it prints now; run "
                  "python scripts/readme_examples.py")
        return 1 if stale else 0
    from distlab.sim.io import write_atomic
    write_atomic(README, "".join(out) + text[last:])
    print(f"README.md: {len(stale)} example(s) rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
