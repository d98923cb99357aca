"""The options of a parallelism are a dataclass whose fields carry their own help: ``option`` makes such a field.

    @dataclass(frozen=True)
    class DDPOptions:
        bucket_cap_mb: float | None = option(None, "DDP bucket_cap_mb in MiB")

The metadata (``help``: one line, required; ``choices``; ``what``: words for the value in errors, e.g. "ZeRO
stage"; ``flag``: the command-line flag, default ``--field-name``) is read by the layers above: the workload
records (sim/workloads/base.py) turn it into scenario keys, flags, sweep keys and errors. It lives here, beside
the builders that define the options, so that sim/parallel/ never imports a layer above it
(tests/test_import_graph.py ``test_parallel_never_imports_scenario_workloads_or_planner``).
"""
from __future__ import annotations

from dataclasses import field


def option(default, help: str, choices=None, what: str | None = None, flag: str | None = None):
    """A dataclass field with the metadata the registry reads."""
    meta = {"help": help, "choices": tuple(choices) if choices is not None else None, "what": what, "flag": flag}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)
