"""The plan: what every rank does, in order, on named streams. The one format the simulator and the runtime run.

A plan is a list of ranks; each rank is an ordered list of ops. Every op names a stream (``compute``,
``comm``, or any other name). Ops on one stream run one after another, like kernels on a CUDA stream; different
streams of a rank run concurrently. ``Record(event)`` on a stream marks the point where everything queued
before it on that stream has finished; ``Wait(event)`` on another stream holds that stream until then
(``cudaEventRecord`` / ``cudaStreamWaitEvent``).

Byte counts follow nccl-tests (doc/PERFORMANCE.md): ``bytes`` of an all_gather is the gathered output, of a
reduce_scatter the full input, of an all_to_all what one rank sends in all; of the others the buffer itself.
An all_to_all with per-peer sizes (``splits``, torch's ``all_to_all_single`` input/output split sizes) names the
whole matrix on every member; its ``bytes`` is then the largest row sum (what the busiest sender sends).
The ops themselves (Compute, Collective, Send, Recv, Record, Wait) are sim/ops.py; this module holds them per rank,
reads and writes the format and checks it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from distlab.sim.dtypes import DTYPE_BYTES  # noqa: F401  (re-exported: plan.DTYPE_BYTES)
from distlab.sim.errors import ConfigError
from distlab.sim.ops import (ALGORITHMS, ATTENTION_KERNELS, ATTENTION_PASSES, COLLECTIVES,  # noqa: F401 (re-exported)
                             COMPUTE_MODEL_FIELDS, OP_TYPES, Collective, Communicator, Compute, Op, Recv, Record,
                             Send, Wait, describe, format_bytes)

FORMAT = "distlab-plan/1"
# Caps on a plan read from a file (from_dict), sized so that every accepted plan finishes `distlab check` within
# 10 s and `distlab simulate` within 60 s in 1 GB (measured on 2 ranks of small collectives: docs/security.md).
MAX_PLAN_OPS = 300_000           # ops over all ranks
MAX_OP_BYTES = 2**50             # 1 PiB in one op: more than a GPU cluster moves in one collective (sim/io.py)
MAX_PLAN_BYTES = 2**56           # 64 PiB over the whole plan


@dataclass
class Plan:
    """Per-rank ordered ops. ``ranks[r]`` is rank r's program. ``scenario``: the header, the scenario the plan
    was built from as plain data (None for none; sim/scenario/header.py writes and validates it)."""
    ranks: list[list[Op]]
    name: str = "plan"
    meta: dict = field(default_factory=dict)
    scenario: dict | None = None

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def group_of(self, op: Collective) -> tuple[int, ...]:
        """The op's group; the whole world (group None) is one tuple shared by every op of the plan."""
        return op.group if op.group is not None else self.world_group()

    def communicator_of(self, op: Collective) -> Communicator:
        """The op's process group: its ranks and its ``group_name``."""
        return Communicator(self.group_of(op), op.group_name)

    def world_group(self) -> tuple[int, ...]:
        """``(0, ..., world_size - 1)``, made once per world size (not per op: plans of 1000s of ranks)."""
        world = self.__dict__.get("_world_group")
        if world is None or len(world) != self.world_size:
            world = self.__dict__["_world_group"] = tuple(range(self.world_size))
        return world

    def validate(self, where: str = "plan") -> "Plan":
        n = self.world_size
        if n < 1:
            raise ConfigError("a plan needs at least one rank", where)
        checked_groups: dict = {}
        checked_local: set = set()       # ids of rank-independent ops already checked (ranks share op objects)
        checked_values: set = set()      # ops (with the rank where it matters) already checked
        same_everywhere = None           # a checked program whose every op is rank-independent
        # a plan built from representatives (sim/kernel/relabel.py): the others are their renamings, valid as they are
        ranks = getattr(self.ranks, "representatives", lambda: range(n))()
        for r in ranks:
            ops = self.ranks[r]
            if same_everywhere is not None and (ops is same_everywhere or ops == same_everywhere):
                continue                 # the same ops as a checked rank (list ==: identical items compare fast)
            recorded: set = set()
            for i, op in enumerate(ops):
                if id(op) not in checked_local:
                    t = type(op)
                    if (t is Record or t is Wait) and type(op.event) is str and op.event and type(op.stream) is str \
                            and op.stream:
                        pass                 # a well-formed event op (what _check_op checks of it)
                    elif t is Compute or t is Collective or t is Send or t is Recv:
                        same = (op, r) if t is not Compute else op      # equal ops (micro-batches): checked once
                        try:
                            seen = same in checked_values
                        except TypeError:        # an unhashable field: _check_op names it
                            seen = False
                        if not seen:
                            _check_op(op, r, n, f"{where}: ranks[{r}][{i}]", checked_groups)
                            try:
                                checked_values.add(same)
                            except TypeError:
                                pass
                    else:
                        _check_op(op, r, n, f"{where}: ranks[{r}][{i}]", checked_groups)
                    if isinstance(op, (Compute, Record, Wait)) or (isinstance(op, Collective) and op.group is None):
                        checked_local.add(id(op))
                if isinstance(op, Record):
                    if op.event in recorded:
                        raise ConfigError(f"event {op.event!r} is recorded twice on rank {r}; event names are "
                                          "unique per rank", f"{where}: ranks[{r}][{i}]")
                    recorded.add(op.event)
            if all(id(op) in checked_local for op in ops):
                same_everywhere = ops
        return self

    def to_dict(self) -> dict:
        ranks, seen = [], {}            # ops shared by ranks (the same frozen object) are written once
        for ops in self.ranks:
            row = []
            for op in ops:
                hit = seen.get(id(op))
                if hit is None or hit[0] is not op:      # (the op kept alive: its id is not reused)
                    hit = seen[id(op)] = (op, {"kind": op.kind, **_fields_of(op)})
                row.append(hit[1])
            ranks.append(row)
        head = {"scenario": self.scenario} if self.scenario is not None else {}
        return {"format": FORMAT, "name": self.name, "world_size": self.world_size, "meta": self.meta, **head,
                "ranks": ranks}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d, where: str = "plan") -> "Plan":
        if not isinstance(d, dict):
            raise ConfigError("a plan is a JSON object with keys format, world_size, ranks", where)
        unknown = set(d) - {"format", "name", "world_size", "meta", "scenario", "ranks"}
        if unknown:
            raise ConfigError(f"unknown key {sorted(unknown)[0]!r}; allowed: format, name, world_size, meta, "
                              "scenario, ranks", where)
        if d.get("format", FORMAT) != FORMAT:
            raise ConfigError(f"format {d.get('format')!r} is not {FORMAT!r}", where)
        ranks = d.get("ranks")
        if not isinstance(ranks, list) or not all(isinstance(r, list) for r in ranks):
            raise ConfigError("'ranks' must be a list with one list of ops per rank", where)
        if "world_size" in d and d["world_size"] != len(ranks):
            raise ConfigError(f"world_size is {d['world_size']!r} but 'ranks' has {len(ranks)} entries", where)
        meta = d.get("meta", {})
        if not isinstance(meta, dict):
            raise ConfigError("'meta' must be an object", where)
        if not isinstance(d.get("scenario", {}), dict):        # read as a Scenario by sim/scenario/header.py
            raise ConfigError("'scenario' must be an object (the scenario the plan was built from)", where)
        total = sum(len(r) for r in ranks)
        if total > MAX_PLAN_OPS:
            raise ConfigError(f"{total} ops is more than a plan file may hold (at most {MAX_PLAN_OPS}: raise "
                              "MAX_PLAN_OPS in sim/plan.py to allow more)", where)
        parsed = [[_op_from_dict(o, f"{where}: ranks[{r}][{i}]") for i, o in enumerate(ops)]
                  for r, ops in enumerate(ranks)]
        plan = cls(parsed, name=str(d.get("name", "plan")), meta=meta, scenario=d.get("scenario")).validate(where)
        moved = sum(o.bytes for ops in parsed for o in ops if _is_int(getattr(o, "bytes", None)))
        if moved > MAX_PLAN_BYTES:
            raise ConfigError(f"its ops move {moved} bytes in all, more than a plan file may (at most 2^56 = 64 "
                              "PiB: raise MAX_PLAN_BYTES in sim/plan.py to allow more)", where)
        return plan

    @classmethod
    def from_json(cls, text: str, where: str = "plan") -> "Plan":
        from distlab.sim.io import loads_json
        return cls.from_dict(loads_json(text, where, "plan"), where)

    @classmethod
    def load(cls, path: str) -> "Plan":
        """A plan file, bounded (sim/io.py: at most 64 MiB and 2,000,000 JSON objects and lists)."""
        from distlab.sim.io import MAX_JSON_BYTES, read_text
        return cls.from_json(read_text(path, "plan", MAX_JSON_BYTES), where=path)

    def save(self, path: str) -> None:
        from distlab.sim.io import write_atomic
        write_atomic(path, self.to_json(indent=1))


def _fields_of(op: Op) -> dict:
    d = {f.name: getattr(op, f.name) for f in fields(op)}       # shallow: tuples serialise as lists
    if isinstance(op, Compute):
        for key, default in COMPUTE_MODEL_FIELDS.items():
            if d[key] == default:
                del d[key]
        if "gemms" in d:
            d["gemms"] = [list(g) for g in d["gemms"]]
    elif isinstance(op, Collective):
        if d.get("splits") is None:
            d.pop("splits", None)
        if d.get("group_name") == "":
            d.pop("group_name")          # plans without names stay as they were
    return d


def _op_from_dict(o, where: str) -> Op:
    if not isinstance(o, dict):
        raise ConfigError("an op must be an object with a 'kind'", where)
    kind = o.get("kind")
    if not isinstance(kind, str) or kind not in OP_TYPES:
        raise ConfigError(f"unknown op kind {kind!r}; allowed: {', '.join(OP_TYPES)}", where)
    cls = OP_TYPES[kind]
    names = {f.name for f in fields(cls)}
    kwargs = {k: v for k, v in o.items() if k != "kind"}
    for k in kwargs:
        if k not in names:
            raise ConfigError(f"unknown key {k!r} for a {kind} op; allowed: {', '.join(sorted(names))}", where)
    if cls is Collective and isinstance(kwargs.get("group"), list):
        kwargs["group"] = tuple(kwargs["group"])
    if cls is Compute:
        if isinstance(kwargs.get("gemms"), list):
            kwargs["gemms"] = tuple(tuple(g) if isinstance(g, list) else g for g in kwargs["gemms"])
        if isinstance(kwargs.get("attention"), list):
            kwargs["attention"] = tuple(kwargs["attention"])
    if cls is Collective and isinstance(kwargs.get("splits"), list):
        kwargs["splits"] = tuple(tuple(row) if isinstance(row, list) else row for row in kwargs["splits"])
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{kind} op: {e}", where) from None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and x not in (float("inf"),)


def _check_kernels(op: Compute, where: str) -> None:
    """The optional kernel fields of a Compute op (sim/compute.py reads them)."""
    def whole(t, n):
        return isinstance(t, tuple) and len(t) == n and all(_is_int(x) and x > 0 for x in t)
    if not isinstance(op.gemms, tuple) or not all(whole(g, 3) for g in op.gemms):
        raise ConfigError(f"gemms must be a list of [M, N, K] whole numbers > 0, got {op.gemms!r}", where)
    if op.attention is not None and not whole(op.attention, 4):
        raise ConfigError(f"attention must be [batch, heads, seq, head_dim] whole numbers > 0, got {op.attention!r}",
                          where)
    if not isinstance(op.causal, bool):
        raise ConfigError(f"causal must be true or false, got {op.causal!r}", where)
    if op.attention_pass not in ATTENTION_PASSES:
        raise ConfigError(f"unknown attention_pass {op.attention_pass!r}; allowed: {', '.join(ATTENTION_PASSES)}",
                          where)
    if op.attention_kernel not in ATTENTION_KERNELS:
        raise ConfigError(f"unknown attention_kernel {op.attention_kernel!r}; allowed: "
                          f"{', '.join(ATTENTION_KERNELS)}", where)
    if not isinstance(op.dtype, str) or op.dtype not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {op.dtype!r}; allowed: {', '.join(DTYPE_BYTES)}", where)
    if not (_is_int(op.chunks) and 1 <= op.chunks <= 64):
        raise ConfigError(f"chunks must be a whole number from 1 to 64, got {op.chunks!r}", where)


def _check_op(op: Op, rank: int, n: int, where: str, checked_groups: dict) -> None:
    if not isinstance(op, tuple(OP_TYPES.values())):
        raise ConfigError(f"not an op: {op!r}", where)
    stream = getattr(op, "stream")
    if not isinstance(stream, str) or not stream:
        raise ConfigError("'stream' must be a non-empty string", where)
    if not isinstance(getattr(op, "name", ""), str):
        raise ConfigError(f"'name' must be a string, got {type(op.name).__name__}", where)
    if isinstance(op, Compute):
        if op.seconds is not None and (not _is_num(op.seconds) or op.seconds < 0):
            raise ConfigError(f"seconds must be a number >= 0, got {op.seconds!r}", where)
        for key in ("flops", "bytes"):
            v = getattr(op, key)
            if not _is_num(v) or v < 0:
                raise ConfigError(f"{key} must be a number >= 0, got {v!r}", where)
        _check_kernels(op, where)
        return
    if isinstance(op, (Record, Wait)):
        if not isinstance(op.event, str) or not op.event:
            raise ConfigError("'event' must be a non-empty string", where)
        return
    if not _is_int(op.bytes) or not 0 <= op.bytes <= MAX_OP_BYTES:
        raise ConfigError(f"bytes must be a whole number from 0 to 2^50 (1 PiB: more than any GPU cluster moves in "
                          f"one op), got {op.bytes!r}", where)
    if not isinstance(op.dtype, str) or op.dtype not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {op.dtype!r}; allowed: {', '.join(DTYPE_BYTES)}", where)
    if isinstance(op, (Send, Recv)):
        if not _is_int(op.peer) or not 0 <= op.peer < n:
            raise ConfigError(f"peer {op.peer!r} is outside the world (0..{n - 1})", where)
        if op.peer == rank:
            raise ConfigError(f"rank {rank} cannot {op.kind} to itself", where)
        return
    if not isinstance(op.op, str) or op.op not in COLLECTIVES:
        raise ConfigError(f"unknown collective {op.op!r}; allowed: {', '.join(COLLECTIVES)}", where)
    if not isinstance(op.group_name, str):
        raise ConfigError(f"group_name must be a string, got {op.group_name!r}", where)
    if not isinstance(op.algorithm, str) or op.algorithm not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {op.algorithm!r}; allowed: {', '.join(ALGORITHMS)}", where)
    if op.group is None:                 # the whole world: every rank is a member
        if op.op in ("broadcast", "reduce") and (not _is_int(op.root) or not 0 <= op.root < n):
            raise ConfigError(f"root {op.root!r} is not in group {list(range(n))}", where)
        _check_splits(op, n, where, checked_groups)
        return
    group = op.group
    if not isinstance(group, tuple):
        raise ConfigError("group must be a non-empty list of ranks", where)
    try:
        members = checked_groups.get(group)
    except TypeError:                    # a member that is not a rank number (a list, a mapping)
        raise ConfigError("group must be a non-empty list of ranks", where) from None
    if members is None:
        if not group or not all(_is_int(g) for g in group):
            raise ConfigError("group must be a non-empty list of ranks", where)
        for g in group:
            if not 0 <= g < n:
                raise ConfigError(f"group names rank {g}, outside the world (0..{n - 1})", where)
        if len(set(group)) != len(group):
            raise ConfigError(f"group {list(group)} names a rank twice", where)
        members = checked_groups[group] = frozenset(group)
    if rank not in members:
        raise ConfigError(f"rank {rank} calls a collective on group {list(group)} it is not in", where)
    if op.op in ("broadcast", "reduce") and (not _is_int(op.root) or op.root not in members):
        raise ConfigError(f"root {op.root!r} is not in group {list(group)}", where)
    _check_splits(op, len(group), where, checked_groups)


def _check_splits(op: Collective, n: int, where: str, checked: dict) -> None:
    """An all_to_all's per-peer sizes: n rows of n whole numbers >= 0 whose largest row sum is ``bytes``
    (checked once per matrix: every member names the same one)."""
    if op.splits is None or ("splits", id(op.splits), op.bytes) in checked:
        return
    if op.op != "all_to_all":
        raise ConfigError(f"splits are per-peer sizes of an all_to_all, not of {op.op}", where)
    rows = op.splits
    if (not isinstance(rows, tuple) or len(rows) != n
            or not all(isinstance(r, tuple) and len(r) == n and all(_is_int(x) and x >= 0 for x in r) for r in rows)):
        raise ConfigError(f"splits must be {n} rows of {n} whole numbers >= 0 (bytes from each member to each)",
                          where)
    if max(sum(r) for r in rows) != op.bytes:
        raise ConfigError(f"bytes {op.bytes} must be the largest row sum of splits, "
                          f"{max(sum(r) for r in rows)}", where)
    checked["splits", id(op.splits), op.bytes] = op.splits
