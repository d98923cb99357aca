"""Reading flight records back (runtime/diagnosis/flight.py writes them): every rank's ring or final dump in a folder, and
the launcher's run.json, bounded and checked, for `distlab diagnose` (runtime/diagnosis/diagnose.py).

    flight = load_dir("m.flight")        # {"world_size", "ranks": {rank: {"source", "reason", "records"}}, "run"}

A folder may hold records edited or truncated by hand, or planted: every file is read bounded (sim/io.py) and
checked, and one that is malformed, too large or claims more than MAX_WORLD ranks is skipped (the count is in the
error when nothing readable is left), so a dump claiming ``world_size: 1e8`` cannot make diagnose build 10^8 rows.
"""
from __future__ import annotations

import contextlib
import json
import os

from distlab.runtime.diagnosis.flight import COLLECTIVES, HEADER, MAX_CAPACITY, MAX_WORLD, SLOT, STATES, _whole, decode
from distlab.sim.errors import ConfigError, OutputError

MAX_DUMP_BYTES = 16 << 20           # a flight.RANK.json (1024 records: ~0.4 MB)
# Caps on a whole folder, so that `distlab diagnose` on any accepted folder ends within 60 s in 1 GB (a record
# parsed is ~1 KB of Python objects; 64 ranks of the default 1024-record rings are 65,536 records, 26 MB).
MAX_FOLDER_BYTES = 192 << 20        # flight.*.json and flight.*.ring together
MAX_FOLDER_RECORDS = 300_000        # records over every rank


def load_dir(directory: str) -> dict:
    """Every rank's flight record in ``directory``: {"world_size", "ranks": {rank: {"source": "dump" or "live",
    "reason", "records", ...}}, "run": run.json from the launcher or None}. The final dump wins over the ring.
    Every file is read bounded (sim/io.py); a file that is malformed, too large or claims more than MAX_WORLD
    ranks is skipped, as is a run.json that is not such an object."""
    from distlab.sim.io import load_json, read_bytes
    if not os.path.isdir(directory):
        raise ConfigError("not a directory", directory)
    ranks: dict[int, dict] = {}
    skipped, names, total, records = 0, [], 0, 0
    for name in sorted(os.listdir(directory)):
        parts = name.split(".")
        if len(parts) != 3 or parts[0] != "flight" or not parts[1].isdigit() or parts[2] not in ("json", "ring") \
                or int(parts[1]) >= MAX_WORLD:
            continue
        names.append((name, parts))
        with contextlib.suppress(OSError):
            total += os.stat(os.path.join(directory, name)).st_size
    if total > MAX_FOLDER_BYTES:
        raise ConfigError(f"its flight records are {total >> 20} MiB in all, more than diagnose reads (at most "
                          f"{MAX_FOLDER_BYTES >> 20} MiB: raise MAX_FOLDER_BYTES in runtime/diagnosis/flight_read.py)", directory)
    for name, parts in names:
        path = os.path.join(directory, name)
        try:
            if parts[2] == "json":
                d = load_json(path, "flight record", MAX_DUMP_BYTES)
                d["source"] = "dump"
            else:
                d = decode(read_bytes(path, "flight ring", HEADER + MAX_CAPACITY * SLOT.size))
                d["source"], d["reason"] = "live", None
        except (OSError, ValueError, KeyError, TypeError, ConfigError):
            skipped += 1
            continue
        if not _valid(d):
            skipped += 1
            continue
        records += len(d["records"])
        if records > MAX_FOLDER_RECORDS:
            raise ConfigError(f"more than {MAX_FOLDER_RECORDS} flight records in all (at most {MAX_FOLDER_RECORDS}: "
                              "raise MAX_FOLDER_RECORDS in runtime/diagnosis/flight_read.py)", directory)
        r = int(parts[1])
        if r not in ranks or d["source"] == "dump":
            ranks[r] = d
    if not ranks:
        why = (f"; {skipped} skipped: malformed, larger than {MAX_DUMP_BYTES >> 20} MiB, or claiming more than "
               f"{MAX_WORLD} ranks" if skipped else "")
        raise ConfigError(f"no flight records here (flight.RANK.json or flight.RANK.ring){why}", directory)
    try:
        run = load_json(os.path.join(directory, "run.json"), "run record", MAX_DUMP_BYTES)
    except ConfigError:
        run = None
    if not (isinstance(run, dict) and _whole(run.get("world_size"), 1, MAX_WORLD + 1)
            and isinstance(run.get("exit_codes", {}), dict) and isinstance(run.get("failures", []), list)
            and all(isinstance(f, dict) for f in run.get("failures", []))):
        run = None
    world = max([d["world_size"] for d in ranks.values()] + [(run or {}).get("world_size", 0)])
    return {"directory": directory, "world_size": world, "ranks": ranks, "run": run}


_FIELDS = {"seq": int, "op": str, "group": list, "stream": str, "bytes": int, "dtype": str, "root": int,
           "state": str}


def _valid(d) -> bool:
    """A dump (possibly edited or truncated by hand) that diagnose can read: records with the fields it uses."""
    if not isinstance(d, dict) or not isinstance(d.get("records"), list) or \
            not _whole(d.get("world_size"), 1, MAX_WORLD + 1):
        return False
    for x in d["records"]:
        if not isinstance(x, dict) or any(not isinstance(x.get(k), t) or isinstance(x.get(k), bool)
                                          for k, t in _FIELDS.items()):
            return False
        if x["op"] not in COLLECTIVES or x["state"] not in STATES or \
                not all(_whole(g, 0, d["world_size"]) for g in x["group"]):
            return False
    return True


def keep(directory: str, exit_codes: list, failures: list, interrupted: str | None = None) -> dict | None:
    """After a failed or interrupted run: write run.json (every rank's exit code, the failures in order, the
    signal that interrupted the launcher or None) beside the records, then load_dir() them; None if none."""
    from distlab.sim.io import write_atomic
    run = {"world_size": len(exit_codes), "exit_codes": {str(r): c for r, c in enumerate(exit_codes)},
           "failures": failures, "interrupted": interrupted}
    try:
        write_atomic(os.path.join(directory, "run.json"), json.dumps(run, indent=1), keep_copy=False)
        return load_dir(directory)
    except (OSError, ConfigError, OutputError):
        return None
