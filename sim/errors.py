"""Errors that a user can fix: the CLI prints them as one line and exits 2."""


class ConfigError(ValueError):
    """Bad input (a cluster, scenario, plan or flag): what is wrong, where, and what is allowed."""

    def __init__(self, message: str, where: str | None = None):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class SimulationDeadlock(RuntimeError):
    """A plan that cannot finish: some rank waits forever. `stuck` lists (rank, stream, op description)."""

    def __init__(self, stuck: list[tuple[int, str, str]], now: float):
        self.stuck = stuck
        self.now = now
        lines = [f"rank {r} stream {s!r} waits in {op}" for r, s, op in stuck[:8]]
        more = f"; and {len(stuck) - 8} more" if len(stuck) > 8 else ""
        super().__init__(f"deadlock at t={now * 1e3:.3f} ms: " + "; ".join(lines) + more)
