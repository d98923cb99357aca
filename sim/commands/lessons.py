"""`distlab lessons`: open JupyterLab on the lessons folder (jupyterlab comes with the `lessons` extra)."""
from __future__ import annotations

import os

NAME = "lessons"
HELP = "Open the lessons (notebooks in lessons/) in JupyterLab."
INSTALL_HINT = 'pip install -e ".[lessons]"'


def add_arguments(p) -> None:
    p.add_argument("--no-browser", action="store_true", help="start the server without opening a browser")
    p.add_argument("--port", type=int, help="port to listen on (default: JupyterLab's, 8888 or the next free one)")
    p.add_argument("--dir", metavar="FOLDER", help="the lessons folder (default: lessons/ of this checkout)")


def lessons_dir() -> str | None:
    """lessons/ beside the sim package (an editable install or a checkout), or None."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "lessons")
    return path if os.path.isfile(os.path.join(path, "README.md")) else None


def command(folder: str, no_browser: bool = False, port: int | None = None) -> list[str]:
    import sys
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={folder}"]
    if no_browser:
        cmd.append("--no-browser")
    if port is not None:
        cmd.append(f"--port={port}")
    if hasattr(os, "geteuid") and os.geteuid() == 0:      # JupyterLab refuses root without it (containers, CI)
        cmd.append("--allow-root")
    return cmd


def run(args) -> int:
    import importlib.util
    import signal
    import subprocess
    import sys

    from distlab.sim.errors import ConfigError
    if importlib.util.find_spec("jupyterlab") is None:
        sys.stderr.write(f"distlab lessons: error: JupyterLab is not installed; install it with: {INSTALL_HINT}\n")
        return 2
    folder = args.dir or lessons_dir()
    if folder is None:
        raise ConfigError("cannot find the lessons folder next to this installation; pass --dir path/to/lessons "
                          "(from a clone: pip install -e \".[lessons]\")", "--dir")
    if not os.path.isdir(folder):
        raise ConfigError(f"{folder!r} is not a folder", "--dir")
    if args.port is not None and not 0 < args.port < 65536:
        raise ConfigError(f"{args.port} must be a port number 1..65535", "--port")
    print(f"distlab lessons: JupyterLab on {folder} (Ctrl-C to stop); start with README.md", flush=True)
    proc = subprocess.Popen(command(os.path.abspath(folder), args.no_browser, args.port))
    old = signal.signal(signal.SIGTERM, _interrupt)        # a SIGTERM ends JupyterLab too, not only distlab
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)


def _interrupt(signum, frame):
    raise KeyboardInterrupt
