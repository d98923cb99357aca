"""Errors that a user can fix: the CLI prints them as one line and exits 2."""


class ConfigError(ValueError):
    """Bad input (a cluster, scenario, plan or flag): what is wrong, where, and what is allowed."""

    def __init__(self, message: str, where: str | None = None):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class OutputError(RuntimeError):
    """A result could not be written (a full or read-only disk, a device that refuses it): the path, the error,
    and where the result was kept instead. The CLI prints it as one line and exits 1."""

    def __init__(self, path: str, error: str, kept: str | None = None, kept_error: str | None = None):
        self.path, self.error, self.kept = path, error, kept
        where = (f"the result is kept in {kept}" if kept else
                 f"it could not be kept elsewhere either ({kept_error})" if kept_error else "nothing was kept")
        super().__init__(f"cannot write {path}: {error}; {where}")


class SimulationDeadlock(RuntimeError):
    """A plan that cannot finish: some rank waits forever. `stuck` lists (rank, stream, op description)."""

    def __init__(self, stuck: list[tuple[int, str, str]], now: float):
        self.stuck = stuck
        self.now = now
        lines = [f"rank {r} stream {s!r} waits in {op}" for r, s, op in stuck[:8]]
        more = f"; and {len(stuck) - 8} more" if len(stuck) > 8 else ""
        super().__init__(f"deadlock at t={now * 1e3:.3f} ms: " + "; ".join(lines) + more)
