"""A run's secret: drawn per local run by the launcher, given by the user to runs under torchrun.

    export DISTLAB_RUN_SECRET=$(python -c 'import secrets; print(secrets.token_hex(16))')   # same on every node
    export DISTLAB_RUN_SECRET_FILE=/shared/me/run.secret                                    # or: a file, mode 600

Ranks prove they know it to rank 0's store (runtime/ranks/store.py) before they join the process group; a process
that does not is refused (runtime/ranks/rendezvous.py). The secret itself never crosses the network (HMAC).
A secret file must be a regular file (not a symbolic link), belong to the user and be readable by no one else,
as ssh demands of private keys.
"""
from __future__ import annotations

import os
import secrets
import stat

from distlab.sim.errors import ConfigError

SECRET_ENV = "DISTLAB_RUN_SECRET"
SECRET_FILE_ENV = "DISTLAB_RUN_SECRET_FILE"
MIN_SECRET = 16
HOW = ("export DISTLAB_RUN_SECRET=$(python -c 'import secrets; print(secrets.token_hex(16))') and give every node "
       "the same value, or DISTLAB_RUN_SECRET_FILE=FILE (readable by you only) on a shared file system")


def new_secret() -> str:
    """A run's secret: 256 random bits, as hex."""
    return secrets.token_hex(32)


def run_secret() -> bytes:
    """The secret from DISTLAB_RUN_SECRET or DISTLAB_RUN_SECRET_FILE; a ConfigError says how to give one."""
    text = os.environ.get(SECRET_ENV)
    where = SECRET_ENV
    if text is None and os.environ.get(SECRET_FILE_ENV):
        where = os.environ[SECRET_FILE_ENV]
        text = _read_secret_file(where)
    if text is None:
        raise ConfigError("no run secret: ranks started by torchrun must present one, so that no one else who "
                          f"reaches the rendezvous can join the run; {HOW} (docs/security.md)", SECRET_ENV)
    text = text.strip()
    if len(text) < MIN_SECRET:
        raise ConfigError(f"the run secret has {len(text)} characters; at least {MIN_SECRET} are needed "
                          f"(e.g. 32 hex digits from secrets.token_hex(16))", where)
    return text.encode("utf-8")


def _read_secret_file(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise ConfigError(f"cannot read the run secret file: {e.strerror}", path) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("the run secret file is not a regular file", path)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise ConfigError(f"the run secret file must belong to you and be readable by you only (mode "
                              f"{stat.S_IMODE(st.st_mode):o}; chmod 600 it)", path)
        data = f.read(4097)
    if len(data) > 4096:
        raise ConfigError("the run secret file is larger than 4 KiB; it should hold one line", path)
    return data.decode("utf-8", errors="replace")


FAMILY_FILE = ".distlab-secret"


def family_secret_file(folder: str) -> str:
    """``folder/.distlab-secret``: a secret kept beside a run's checkpoints (runtime/restart/elastic.py's run_local), so
    that later runs on the folder are the same run family and resume from its checkpoints. Created (0600) if
    missing; a file that is a link, another user's, or readable by others is a ConfigError (a stranger who
    could plant or read it could sign checkpoints)."""
    path = os.path.join(folder, FAMILY_FILE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        _read_secret_file(path)                     # checks owner, mode, not a link
        return path
    except OSError as e:
        raise ConfigError(f"cannot create the run family's secret: {e.strerror}", path) from None
    with os.fdopen(fd, "w") as f:
        f.write(new_secret() + "\n")
    return path
