"""One trace format for simulated and measured runs: every op (and, when simulated, every transfer).

Times are seconds from the start of the run. An op record's ``start`` is when the rank reached it on its stream
(for a collective: when it was issued and began waiting for its peers), ``launch`` when data began to move (all
members had arrived), ``end`` when it finished on that rank. Chrome-trace export opens in Perfetto
(ui.perfetto.dev) or chrome://tracing (sim/chrome.py): one process per rank, one thread per stream, flow
arrows between the ranks of a collective and from each send to its recv, a "network" process with one
thread per channel.
"""
from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

FORMAT = "distlab-trace/1"


@dataclass(slots=True)
class OpRecord:
    """One op on one rank. Slotted (no per-record dict): a step of 1000s of ranks holds millions of them; a
    collective's ``group`` is the plan's own tuple, shared by every record of that group."""
    rank: int
    stream: str
    index: int          # position in the rank's op list of the plan
    kind: str           # compute, collective, send, recv, record, wait
    name: str
    start: float
    end: float
    bytes: int = 0
    op: str = ""        # the collective (all_reduce, ...) when kind == "collective"
    launch: float | None = None
    group: tuple[int, ...] | None = None
    algorithm: str = ""
    peer: int | None = None     # the other rank of a send or recv

    @property
    def duration(self) -> float:
        return self.end - self.start


class RankCopies(Sequence):
    """The op records of ranks whose timelines are equal (sim/kernel/symmetry.py, sim/kernel/subgroups.py): the
    representatives' records, read as the records of every member of their class, sorted by (rank, index).
    ``rep_of`` is one representative for all ``members`` or a function rank -> its representative. Nothing per
    member is stored: a member's record is made when it is read (a copy with its rank, and with its own group
    and peer read from ``plan``, where collectives run over sub-groups)."""

    def __init__(self, records: list[OpRecord], rep_of, members: range, plan=None):
        self.records, self.members, self.plan = records, members, plan
        self.rep_of = (lambda r, q=rep_of: q) if isinstance(rep_of, int) else rep_of
        self.by_rep: dict[int, list[OpRecord]] = {}
        for o in records:
            self.by_rep.setdefault(o.rank, []).append(o)
        self._starts = None

    def for_rank(self, rank: int) -> list[OpRecord]:
        if rank not in self.members:
            return []
        q = self.rep_of(rank)
        mine = self.by_rep.get(q, [])
        if rank == q:
            return list(mine)
        if self.plan is None:
            return [OpRecord(rank, o.stream, o.index, o.kind, o.name, o.start, o.end, o.bytes, o.op, o.launch,
                             o.group, o.algorithm, o.peer) for o in mine]
        ops, out = self.plan.ranks[rank], []
        for o in mine:
            op = ops[o.index]
            group = self.plan.group_of(op) if o.group is not None else None
            peer = op.peer if o.peer is not None else None
            out.append(OpRecord(rank, op.stream, o.index, o.kind, o.name, o.start, o.end, o.bytes, o.op, o.launch,
                                group, o.algorithm, peer))
        return out

    def _offsets(self) -> list[int]:
        """Where each member's records start in the sequence."""
        if self._starts is None:
            starts, total = [], 0
            for r in self.members:
                starts.append(total)
                total += len(self.by_rep.get(self.rep_of(r), ()))
            self._starts = starts + [total]
        return self._starts

    def __len__(self) -> int:
        return self._offsets()[-1]

    def __iter__(self):
        for r in self.members:
            yield from self.for_rank(r)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(self)[i]
        if not -len(self) <= i < len(self):
            raise IndexError("record index out of range")
        i %= len(self)
        starts = self._offsets()
        pos = bisect_right(starts, i) - 1          # the last member starting at or before i (it has records)
        r = self.members[pos]
        k = i - starts[pos]
        return self.by_rep[self.rep_of(r)][k] if r == self.rep_of(r) else self.for_rank(r)[k]

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)


@dataclass(slots=True)
class TransferRecord:
    src: int
    dst: int
    start: float
    end: float
    bytes: float
    links: tuple[str, ...] = ()


@dataclass
class Trace:
    ops: list[OpRecord] | RankCopies = field(default_factory=list)
    transfers: list[TransferRecord] = field(default_factory=list)
    meta: dict = field(default_factory=dict)   # source: simulated|measured, plan, cluster, ...

    # -- queries -------------------------------------------------------------------------------------------
    @property
    def makespan(self) -> float:
        """From the earliest op start to the latest op end, over all ranks."""
        ops = self.ops.records if isinstance(self.ops, RankCopies) else self.ops   # copies: the same times
        if not ops:
            return 0.0
        return max(o.end for o in ops) - min(o.start for o in ops)

    def for_rank(self, rank: int) -> list[OpRecord]:
        if isinstance(self.ops, RankCopies):
            return self.ops.for_rank(rank)
        return [o for o in self.ops if o.rank == rank]

    def busy_time(self, rank: int, stream: str) -> float:
        """Seconds the stream of ``rank`` was busy (union of its op intervals)."""
        spans = sorted((o.start if o.launch is None else o.launch, o.end)
                       for o in self.ops if o.rank == rank and o.stream == stream and o.kind not in ("record", "wait"))
        return _union_length(spans)

    # -- serialisation -------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": FORMAT, "meta": self.meta,
                "ops": [_record_dict(o) for o in self.ops],
                "transfers": [asdict(t) for t in self.transfers]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "Trace":
        ops = []
        for o in d.get("ops", []):
            o = dict(o)
            if o.get("group") is not None:
                o["group"] = tuple(o["group"])
            ops.append(OpRecord(**o))
        transfers = [TransferRecord(**{**t, "links": tuple(t.get("links", ()))}) for t in d.get("transfers", [])]
        return cls(ops, transfers, dict(d.get("meta", {})))

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        return cls.from_dict(json.loads(text))

    def stream_order(self) -> list[str]:
        """Streams top to bottom, as the timeline PNG and the Chrome trace show them: compute first, then the
        others in order of first appearance (comm, p2p, ...)."""
        ops = [o for o in self.ops if o.kind not in ("record", "wait")] or self.ops
        return list(dict.fromkeys(o.stream for o in sorted(ops, key=lambda o: o.stream != "compute")))

    def to_chrome(self) -> str:
        """Chrome trace-event JSON (sim/chrome.py): opens in Perfetto (ui.perfetto.dev) or chrome://tracing."""
        from distlab.sim.chrome import chrome_events
        return json.dumps({"traceEvents": chrome_events(self), "displayTimeUnit": "ms", "otherData": self.meta},
                          sort_keys=True, separators=(",", ":"))

    def save(self, path: str) -> None:
        """``*.json`` gets Chrome-trace JSON (Perfetto); ``*.trace`` or ``*.distlab.json`` the native format."""
        from distlab.sim.io import write_atomic
        native = path.endswith(".trace") or path.endswith(".distlab.json")
        write_atomic(path, self.to_json() if native else self.to_chrome())


def _record_dict(o: OpRecord) -> dict:
    d = asdict(o)
    if d["group"] is not None:
        d["group"] = list(d["group"])
    return d


def _union_length(spans: list[tuple[float, float]]) -> float:
    from distlab.sim.kernel.spans import union_length      # the one home of the union rule
    return union_length(spans)
