"""Read nccl-tests output: the text table every ``*_perf`` binary prints, or the JSON that ``-J FILE.json`` writes.

    log = load("all_reduce_perf.txt")        # NcclLog(op="all_reduce", nranks=16, hosts=2, rows=[...])
    log.rows[0].bytes, log.rows[0].oop.time_us, log.rows[0].oop.busbw_GBps

The text format (nccl-tests src/common.cu, src/util.cu; it changed over the versions, all read here):
- a header: ``# nccl-tests version 2.19.4 nccl-headers=21903 nccl-library=21903`` (2.19 on), ``# Collective test
  starting: all_reduce_perf`` (2.19 on), ``# nThread 1 nGpus 8 minBytes 8 maxBytes ...``, then one line per rank
  ``#  Rank  0 Group  0 Pid 584419 on dkh device  0 [0000:14:00] NVIDIA A100-SXM4-80GB`` (no ``Group`` before
  2.13) and, from NCCL itself, ``NCCL version 2.20.3+cuda12.3``;
- one row per size: ``size count type [redop] [root]`` then out-of-place ``time algbw busbw #wrong`` and in-place
  ``time algbw busbw #wrong`` (``redop`` from 2.2, ``root`` from 2.10; ``#wrong`` was ``error``, a float like
  ``2e-07``, before 2.10; an in-place ``#wrong`` may be ``N/A``); time in us, bandwidths in GB/s (1e9 bytes);
- ``# Out of bounds values : 0 OK`` and ``# Avg bus bandwidth : 34.9`` at the end.
Lines of other programs (``NCCL INFO``, mpirun's ``[1,0]<stdout>:`` prefix) are skipped or stripped.

The JSON format (src/util.cu, JSON_FILE_VERSION 3): {"version", "nccl_version", "args": argv, "config": {...},
"devices": [{"rank", "hostname", "device_info", ...}], "results": [{"size", "count", "type", "redop", "root",
"out_of_place": {"time", "alg_bw", "bus_bw", "nwrong"}, "in_place": {...}}]}.

Bad input (an empty or truncated file, a row with the wrong number of columns, no rows) is a ConfigError naming
the file and line: one line, exit 2.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from distlab.sim.errors import ConfigError

MAX_LOG_BYTES = 16 << 20
# nccl-tests' binaries -> distlab's collective names (sendrecv, gather, scatter, hypercube have none)
OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
       "broadcast": "broadcast", "reduce": "reduce", "alltoall": "all_to_all", "all_to_all": "all_to_all"}
_RANK = re.compile(r"Rank\s+(\d+)(?:\s+Group\s+\d+)?\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s+(.*\S)")
_PREFIX = re.compile(r"^(\[\d+,\d+\]<std(?:out|err)>:|\d+:)\s?")      # mpirun --tag-output, srun -l
_NUM = re.compile(r"^-?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


@dataclass
class Measure:
    """One placement's columns: time (us), algbw and busbw (GB/s), wrong elements (None: N/A)."""
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    wrong: float | None


@dataclass
class Row:
    bytes: int
    count: int
    dtype: str
    redop: str
    root: int
    oop: Measure
    ip: Measure | None


@dataclass
class NcclLog:
    path: str
    op: str                          # distlab's name (all_reduce, all_to_all, ...)
    nranks: int
    rows: list[Row]
    hosts: list[str] = field(default_factory=list)         # in rank order, each once
    ranks_per_host: dict = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)       # each device name once
    nccl_version: str | None = None
    tests_version: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"path": self.path, "op": self.op, "nranks": self.nranks, "hosts": self.hosts,
                "devices": self.devices, "nccl_version": self.nccl_version, "tests_version": self.tests_version,
                "sizes": len(self.rows), "notes": self.notes}


def load(path: str) -> NcclLog:
    """A log file (text, or JSON when it starts with '{'), read bounded (sim/io.py)."""
    from distlab.sim.io import read_bytes
    data = read_bytes(path, "nccl-tests log", MAX_LOG_BYTES)
    try:
        text = data.decode("utf-8", errors="replace")
    except Exception:                                      # pragma: no cover (errors="replace" never raises)
        raise ConfigError("not a text file", path) from None
    if text.lstrip().startswith("{"):
        try:
            return parse_json(json.loads(text), path)
        except json.JSONDecodeError as e:
            raise ConfigError(f"not valid JSON (line {e.lineno}: {e.msg}); nccl-tests -J writes a whole "
                              "JSON document: a cut file?", path) from None
    return parse_text(text, path)


POINT_TO_POINT = ("sendrecv", "hypercube", "scatter_perf", "gather_perf", "alltoallv")


def _op_from(name: str) -> str | None:
    base = os.path.basename(name).lower()
    for other in POINT_TO_POINT:
        if other in base and not (other in ("scatter_perf", "gather_perf") and ("reduce_scatter" in base or
                                                                             "all_gather" in base)):
            raise ConfigError(f"{other.removesuffix('_perf')}: distlab fits the collectives "
                              f"{', '.join(sorted(set(OPS.values())))}; point-to-point and rooted scatter/gather "
                              "tests have no model here", name)
    for key in sorted(OPS, key=len, reverse=True):          # reduce_scatter before reduce
        if key in base or key.replace("_", "") in base.replace("_", ""):
            return OPS[key]
    return None


def _number(tok: str, where: str) -> float:
    if not _NUM.match(tok):
        raise ConfigError(f"{tok!r} is not a number; a nccl-tests row has numbers after size, count, type, "
                          "redop and root", where)
    return float(tok)


def _measure(toks: list[str], where: str) -> Measure:
    wrong = None if toks[3] == "N/A" else _number(toks[3], where)
    return Measure(_number(toks[0], where), _number(toks[1], where), _number(toks[2], where), wrong)


def _row(line: str, where: str) -> Row:
    toks = line.split()
    if len(toks) < 5 or not toks[0].isdigit() or not toks[1].isdigit():
        raise ConfigError("not a nccl-tests row (size count type [redop] [root] time algbw busbw #wrong ...)",
                          where)
    size, count, dtype, rest = int(toks[0]), int(toks[1]), toks[2], toks[3:]
    redop, root = "none", -1
    if rest and not _NUM.match(rest[0]) and rest[0] != "N/A":
        redop, rest = rest[0], rest[1:]
    if len(rest) in (5, 9) and re.fullmatch(r"-?\d+", rest[0]):
        root, rest = int(rest[0]), rest[1:]
    if len(rest) not in (4, 8):
        raise ConfigError(f"a row with {len(toks)} columns; nccl-tests writes size, count, type, redop, root, then "
                          "time, algbw, busbw, #wrong out of place and in place (a cut or edited line?)", where)
    return Row(size, count, dtype, redop, root, _measure(rest[:4], where),
               _measure(rest[4:], where) if len(rest) == 8 else None)


def parse_text(text: str, path: str = "log") -> NcclLog:
    """The table and header of one nccl-tests run (module docstring)."""
    rows: list[Row] = []
    ranks: dict[int, tuple[str, str]] = {}
    op = nccl = tests = None
    nthreads = ngpus = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = _PREFIX.sub("", raw.strip()).strip()
        where = f"{path}:{number}"
        if not line:
            continue
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            if m := _RANK.search(body):
                ranks[int(m.group(1))] = (m.group(2), m.group(3))
            elif m := re.match(r"nccl-tests version (\S+).*nccl-library=(\d+)", body):
                tests, nccl = m.group(1), nccl or _version(int(m.group(2)))
            elif m := re.match(r"Collective test starting: (\S+)", body):
                op = _op_from(m.group(1))
            elif m := re.match(r"nThread\s+(\d+)\s+nGpus\s+(\d+)", body):
                nthreads, ngpus = int(m.group(1)), int(m.group(2))
            continue
        if m := re.match(r"NCCL version (\d+\.\d+\.\d+)", line):
            nccl = m.group(1)
            continue
        if line.split()[0].isdigit() and len(line.split()) > 1 and line.split()[1].isdigit():
            rows.append(_row(line, where))
    if not rows:
        raise ConfigError("no nccl-tests table here (rows of size, count, type, time, algbw, busbw): not a "
                          "nccl-tests log, or cut before its first row", path)
    nranks = max(ranks) + 1 if ranks else None
    notes = []
    if nranks is None:
        raise ConfigError("no '#  Rank N ... device' lines: the rank count is unknown (keep the header that "
                          "nccl-tests prints)", path)
    if len(ranks) < nranks:
        notes.append(f"{len(ranks)} of {nranks} rank lines in the header (the rest were cut): hosts unknown")
    op = op or _op_from(path) or _op_from_factor(rows, nranks, path)
    hosts, per_host = _hosts(ranks) if len(ranks) == nranks else ([], {})
    if nthreads and ngpus and len(ranks) == nranks and nranks % (nthreads * ngpus):
        notes.append(f"{nranks} ranks is not a multiple of nThread x nGpus = {nthreads * ngpus}")
    devices = list(dict.fromkeys(d for _, d in ranks.values()))
    return NcclLog(path, op, nranks, rows, hosts, per_host, devices, nccl, tests, notes)


def _version(code: int) -> str:
    """NCCL's version code: 21903 -> 2.19.3 (major x 10000 + minor x 100 + patch from 2.9; before, x 1000, x 100)."""
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def _hosts(ranks: dict) -> tuple[list[str], dict]:
    per: dict[str, int] = {}
    for r in sorted(ranks):
        per[ranks[r][0]] = per.get(ranks[r][0], 0) + 1
    return list(per), per


def _op_from_factor(rows: list[Row], n: int, path: str) -> str:
    """The op from busbw / algbw (nccl-tests doc/PERFORMANCE.md) and the redop, when nothing names it."""
    big = [r for r in rows if r.oop.algbw_GBps >= 1.0]
    if not big or n < 2:
        raise ConfigError("cannot tell which collective this is: name the file after the binary "
                          "(e.g. all_gather_perf.txt) or keep its '# Collective test starting' line", path)
    f = big[-1].oop.busbw_GBps / big[-1].oop.algbw_GBps
    if abs(f - 2 * (n - 1) / n) < 0.02:
        return "all_reduce"
    if abs(f - (n - 1) / n) < 0.02 and big[-1].redop != "none":
        return "reduce_scatter"
    if abs(f - (n - 1) / n) < 0.02:
        raise ConfigError("busbw / algbw = (n-1)/n: all_gather or alltoall; name the file after the binary "
                          "(e.g. all_gather_perf.txt)", path)
    raise ConfigError(f"busbw / algbw = {f:.3f} matches no collective distlab models; name the file after the "
                      "binary (e.g. broadcast_perf.txt)", path)


def parse_json(d, path: str = "log.json") -> NcclLog:
    """The JSON nccl-tests -J writes (module docstring)."""
    if not isinstance(d, dict) or not isinstance(d.get("results"), list) or not d["results"]:
        raise ConfigError("not nccl-tests JSON: needs a non-empty 'results' list (nccl-tests -J FILE.json)", path)
    devices = d.get("devices") if isinstance(d.get("devices"), list) else []
    ranks = {int(x["rank"]): (str(x.get("hostname", "?")), str(x.get("device_info", "?")))
             for x in devices if isinstance(x, dict) and isinstance(x.get("rank"), int)}
    if not ranks:
        raise ConfigError("no 'devices' with a rank: the rank count is unknown", path)
    rows = []
    for i, r in enumerate(d["results"]):
        where = f"{path}: results[{i}]"
        try:
            oop, ip = r["out_of_place"], r.get("in_place")
            rows.append(Row(int(r["size"]), int(r["count"]), str(r["type"]), str(r.get("redop", "none")),
                            _root(r.get("root")), _json_measure(oop, where), _json_measure(ip, where) if ip else None))
        except (KeyError, TypeError, ValueError):
            raise ConfigError("each result needs size, count, type and out_of_place {time, alg_bw, bus_bw}",
                              where) from None
    args = d.get("args") if isinstance(d.get("args"), list) else []
    nranks = max(ranks) + 1
    op = (_op_from(str(args[0])) if args else None) or _op_from(path) or _op_from_factor(rows, nranks, path)
    hosts, per_host = _hosts(ranks)
    nccl = d.get("nccl_version")
    return NcclLog(path, op, nranks, rows, hosts, per_host, list(dict.fromkeys(v for _, v in ranks.values())),
                   _version(nccl) if isinstance(nccl, int) else None, str(d.get("version")), [])


def _root(v) -> int:
    return int(v) if isinstance(v, (int, str)) and str(v).lstrip("-").isdigit() else -1


def _json_measure(m: dict, where: str) -> Measure:
    t = m.get("time", m.get("cpu_time"))
    vals = [t, m["alg_bw"], m["bus_bw"]]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        raise ConfigError("time, alg_bw and bus_bw must be numbers", where)
    wrong = m.get("nwrong")
    return Measure(float(t), float(m["alg_bw"]), float(m["bus_bw"]),
                   float(wrong) if isinstance(wrong, (int, float)) else None)
