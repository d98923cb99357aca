"""torch's flight recorder dumps (ProcessGroupNCCL, and Gloo from torch 2.7) read into distlab's flight records,
so `distlab diagnose DIR` names the rank and the collective as it does for its own runs.

    flight = load_dir("dumps/")          # {"world_size", "ranks": {rank: {"source": "dump", "records": [...]}}}

torch keeps the last ``TORCH_FR_BUFFER_SIZE`` (formerly ``TORCH_NCCL_TRACE_BUFFER_SIZE``) collectives per process
and writes them on a timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``) to ``TORCH_FR_DUMP_TEMP_FILE`` + rank (default
``/tmp/nccl_trace_rank_<rank>``): one file per rank, the rank in its trailing digits (torch's reader,
torch/distributed/flight_recorder/components/loader.py, finds them the same way). A dump is a pickle by default
or JSON (``_dump_fr_trace_json``; ``TORCH_FR_DUMP_JSON``-style tooling); both hold {"version", "pg_config": {pg
name: {"desc", "ranks": "[0, 1]"}}, "pg_status", "entries": [{"collective_seq_id", "profiling_name":
"nccl:all_reduce", "process_group": [name, desc], "input_sizes", "input_dtypes", "output_sizes", "state":
"scheduled" | "started" | "completed", "retired", "time_created_ns", "time_discovered_started_ns",
"time_discovered_completed_ns", ...}]} (torch/distributed/flight_recorder/components/types.py reads these keys).

JSON is read as JSON. A pickle is read only when asked (``--allow-pickle``), and then by an unpickler that refuses
every global (``find_class`` raises): builtin dicts, lists, tuples, strings, numbers and None load, nothing else,
so a planted file cannot run code. Each file is bounded (MAX_DUMP_BYTES).

Each entry becomes a record: seq = collective_seq_id, op = the name after ``backend:`` (all_reduce, broadcast,
_allgather_base -> all_gather, ...), group = its process group's ranks (pg_config; the default group: every
rank), bytes = the input's elements x dtype size (all_gather: the output's), state: completed when torch marked
it completed or retired, started, else issued; the root of a broadcast/reduce is not in the dump (0 is assumed).
Send/recv and coalesced entries are left out (named in the result's ``notes``).
"""
from __future__ import annotations

import io
import json
import math
import os
import pickle
import re

from distlab.sim.errors import ConfigError

MAX_DUMP_BYTES = 64 << 20
MAX_WORLD = 1 << 17
OPS = {"all_reduce": "all_reduce", "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
       "broadcast": "broadcast", "reduce": "reduce", "all_gather": "all_gather", "_allgather_base": "all_gather",
       "allgather": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
       "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
       "reduce_scatter_tensor_coalesced": "reduce_scatter", "all_to_all": "all_to_all",
       "alltoall_base": "all_to_all", "alltoall": "all_to_all", "barrier": "barrier"}
DTYPES = {"Float": ("float32", 4), "Half": ("float16", 2), "BFloat16": ("bfloat16", 2), "Double": ("float64", 8),
          "Long": ("int64", 8), "Int": ("int32", 4), "Byte": ("uint8", 1), "Char": ("int8", 1),
          "Short": ("int16", 2), "Bool": ("uint8", 1), "Float8_e4m3fn": ("float8_e4m3fn", 1),
          "Float8_e5m2": ("float8_e5m2", 1)}
_RANK = re.compile(r"(\d+)$")


class _BuiltinsOnly(pickle.Unpickler):
    """Loads builtin containers and scalars; any global (a class, a function) is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused {module}.{name}: a flight recorder dump holds only builtin values")


def _load(path: str, allow_pickle: bool):
    from distlab.sim.io import read_bytes
    data = read_bytes(path, "flight recorder dump", MAX_DUMP_BYTES)
    if data.lstrip()[:1] == b"{":
        try:
            return json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"not valid JSON ({str(e)[:60]}; a cut dump?)", path) from None
    if data[:1] != b"\x80":
        raise ConfigError("neither JSON nor a pickle: not a torch flight recorder dump", path)
    if not allow_pickle:
        raise ConfigError("a pickle dump; read it with --allow-pickle (a restricted unpickler: builtin values "
                          "only), or dump JSON", path)
    try:
        return _BuiltinsOnly(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError) as e:
        raise ConfigError(f"not a readable dump ({str(e).splitlines()[0][:80]})", path) from None


def is_dump_dir(directory: str) -> bool:
    """Files named like torch's dumps (a name ending in the rank) and none of distlab's own flight.RANK.* files."""
    if not os.path.isdir(directory):
        return False
    names = os.listdir(directory)
    if any(n.startswith("flight.") for n in names):
        return False
    return any(_RANK.search(n) and os.path.isfile(os.path.join(directory, n)) for n in names)


def _group(entry: dict, pg_config: dict, world: int) -> tuple[int, ...] | None:
    name, desc = (entry.get("process_group") or ["", ""])[:2]
    conf = pg_config.get(name) if isinstance(pg_config, dict) else None
    if isinstance(conf, dict) and isinstance(conf.get("ranks"), str) and re.fullmatch(r"\[[\d, ]*\]", conf["ranks"]):
        return tuple(int(x) for x in re.findall(r"\d+", conf["ranks"]))
    if desc == "default_pg" or name in ("0", ""):
        return tuple(range(world))
    return None


def _record(e: dict, pg_config: dict, world: int) -> dict | None:
    name = str(e.get("profiling_name", ""))
    op = OPS.get(name.split(":", 1)[-1].split(" ")[0])
    group = _group(e, pg_config, world)
    if op is None or group is None:
        return None
    sizes = e.get("output_sizes" if op == "all_gather" else "input_sizes") or [[]]
    dtypes = e.get("input_dtypes") or ["Float"]
    dtype, width = DTYPES.get(dtypes[0], ("float32", 4))
    elements = sum(math.prod(s) for s in sizes if isinstance(s, list) and all(isinstance(x, int) for x in s))
    state = e.get("state")
    state = "completed" if state == "completed" or e.get("retired") is True else \
        "started" if state == "started" else "issued"

    def secs(key):
        v = e.get(key)
        return v / 1e9 if isinstance(v, (int, float)) and v > 0 else None
    return {"seq": int(e["collective_seq_id"]), "op": op, "group": list(group), "stream": "", "bytes": elements * width,
            "dtype": dtype, "root": 0, "state": state, "index": -1, "t_issued": secs("time_created_ns"),
            "t_started": secs("time_discovered_started_ns"), "t_completed": secs("time_discovered_completed_ns")}


def load_dir(directory: str, allow_pickle: bool = False) -> dict:
    """Every rank's dump in ``directory`` as runtime/diagnosis/flight_read.py's ``load_dir`` returns distlab's own."""
    if not os.path.isdir(directory):
        raise ConfigError("not a directory", directory)
    files = {}
    for n in sorted(os.listdir(directory)):
        m = _RANK.search(n)
        if m and os.path.isfile(os.path.join(directory, n)) and int(m.group(1)) < MAX_WORLD:
            files[int(m.group(1))] = os.path.join(directory, n)
    if not files:
        raise ConfigError("no flight recorder dumps here (files named like nccl_trace_rank_0)", directory)
    dumps = {r: _load(p, allow_pickle) for r, p in files.items()}
    world = max(files) + 1
    for r, d in dumps.items():
        if not isinstance(d, dict) or not isinstance(d.get("entries"), list):
            raise ConfigError("not a torch flight recorder dump: no 'entries' list", files[r])
        ranks = ((d.get("pg_config") or {}).get("0") or {}).get("ranks") if isinstance(d.get("pg_config"), dict) \
            else None
        if isinstance(ranks, str):
            world = max(world, len(re.findall(r"\d+", ranks)))
    out, notes = {}, []
    for r, d in dumps.items():
        records = []
        for i, e in enumerate(d["entries"]):
            try:
                rec = _record(e, d.get("pg_config") or {}, world) if isinstance(e, dict) else None
            except (KeyError, TypeError, ValueError):
                raise ConfigError(f"entries[{i}] lacks collective_seq_id, profiling_name or sizes", files[r]) from None
            if rec is None:
                notes.append(f"rank {r}: {e.get('profiling_name') if isinstance(e, dict) else e!r} left out "
                             "(point-to-point, coalesced or an unknown group)")
            else:
                records.append(rec)
        out[r] = {"source": "dump", "world_size": world, "records": records,
                  "reason": f"torch flight recorder dump (format {d.get('version', '?')})", "dumped_at": None}
    return {"directory": directory, "world_size": world, "ranks": out, "run": None, "notes": notes[:20]}
