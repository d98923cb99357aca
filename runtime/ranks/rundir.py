"""The launcher's run folders: ``distlab-run-PID-*`` in the temporary folder, PID the launcher's.

A launch removes its folder when it ends, however it ends; a launcher killed by SIGKILL cannot, so every launch
first removes the folders whose launcher PID no longer runs (a PID reused since then keeps its folder until
that process ends too).
"""
from __future__ import annotations

import os
import shutil
import tempfile

RUN_DIR_PREFIX = "distlab-run-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:                # another user's process
        return True
    return True


def remove_stale_run_dirs(tmp: str | None = None) -> list[str]:
    """Remove the run folders (``distlab-run-PID-*``) of launchers that no longer run; the removed paths."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(tmp)
    except OSError:
        return removed
    for name in names:
        pid = name[len(RUN_DIR_PREFIX):].split("-", 1)[0]
        if not name.startswith(RUN_DIR_PREFIX) or not pid.isdigit() or int(pid) == os.getpid():
            continue
        if not _pid_alive(int(pid)):
            path = os.path.join(tmp, name)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
