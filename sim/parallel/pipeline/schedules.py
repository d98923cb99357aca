"""Pipeline schedules as per-rank action lists, in the exact order torch 2.13's schedule classes execute them.

An action is (stage, kind, microbatch); kinds use torch's letters: ``F`` forward, ``B`` full backward,
``I`` input-gradient backward and ``W`` weight-gradient backward. The Zero Bubble paper (2401.10241) calls I "B";
I + W = B. Written as torch does, ``"2F5"`` = stage 2, forward, microbatch 5.

Schedules (p ranks, m microbatches, v stages per rank; stage s sits on rank s % p, except ZBV's "V" layout):

- ``gpipe``: all forwards, then all backwards (GPipe, 1811.06965). Bubble (p-1)/(m+p-1).
- ``1f1b``: stage s runs min(m, p-s) forwards, then alternates B, F, then drains (PipeDream-flush;
  Megatron 2104.04473). Same bubble as GPipe, at most p-s microbatches in flight. Needs m >= p.
- ``interleaved``: v model chunks per rank, depth first, in rounds of m/r microbatches, r = max(1, m // p)
  (Megatron 2104.04473, as generalised by torch). Bubble (p-1)/(v·m+p-1). Needs m % r == 0.
- ``zbh1``: 1F1B with the backward split into I and W; stage on rank r delays its W's by r steps, filling the
  cool-down bubble (Zero Bubble 2401.10241, "ZB-H1"; torch ``ScheduleInterleavedZeroBubble``).
- ``zbv``: two chunks per rank in a V (rank r holds stages r and 2p-1-r), I and W split (2401.10241 section 6;
  torch ``ScheduleZBVZeroBubble``). Near zero bubble when F = I = W.
- ``dualpipev``: ZBV's V layout, DualPipe's phases with forward/backward pairs of different microbatches that
  torch marks OVERLAP_F_B (DeepSeek-V3 2412.19437; torch ``ScheduleDualPipeV``). Needs v = 2 and m >= 2p.
- ``loopedbfs``: v stages per rank in a loop, all forwards stage by stage, then all backwards (Breadth-First
  Pipeline Parallelism 2211.05953; torch ``ScheduleLoopedBFS``). Any p, m, v.

dualpipe.py builds the last two; :func:`overlap_pairs` gives DualPipeV's overlapped pairs.
"""
from __future__ import annotations

from functools import lru_cache

from distlab.sim.errors import ConfigError
from distlab.sim.parallel.pipeline import dualpipe
from distlab.sim.parallel.pipeline.action import Action

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zbh1", "zbv", "dualpipev", "loopedbfs")
ALIASES = {"interleaved1f1b": "interleaved", "interleaved-1f1b": "interleaved", "zb-h1": "zbh1", "zb1p": "zbh1",
           "zb-v": "zbv", "zbvzerobubble": "zbv", "dualpipe-v": "dualpipev",
           "looped-bfs": "loopedbfs", "bfs": "loopedbfs"}
# torch.distributed.pipelining class for each schedule
TORCH_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
                 "zbh1": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
                 "dualpipev": "ScheduleDualPipeV", "loopedbfs": "ScheduleLoopedBFS"}


def normalise(name: str) -> str:
    key = str(name).lower().replace("_", "-")
    key = ALIASES.get(key, ALIASES.get(key.replace("-", ""), key))
    if key not in SCHEDULES:
        raise ConfigError(f"unknown pipeline schedule {name!r}; allowed: {', '.join(SCHEDULES)}", "schedule")
    return key


def check(schedule: str, p: int, m: int, v: int = 1) -> str:
    """Validate (schedule, p, m, v) as torch's constructors do; returns the normalised schedule name."""
    schedule = normalise(schedule)
    for key, val in (("stages", p), ("microbatches", m), ("virtual_stages", v)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ConfigError(f"{key} must be a whole number >= 1, got {val!r}", key)
    if schedule in ("gpipe", "1f1b") and v != 1:
        raise ConfigError(f"{schedule} runs one stage per rank, so virtual_stages must be 1 (got {v}); "
                          "use schedule interleaved", "virtual_stages")
    if schedule in ("zbv", "dualpipev") and v != 2:
        raise ConfigError(f"{schedule} runs exactly 2 stages per rank, so virtual_stages must be 2 (got {v}); "
                          "allowed: virtual_stages 2",
                          "virtual_stages")
    if schedule == "dualpipev" and m < 2 * p:
        raise ConfigError(f"dualpipev needs at least as many microbatches as stages (2 x {p} ranks = {2 * p}); "
                          f"got {m}; allowed: microbatches >= {2 * p}", "microbatches")
    if schedule == "1f1b" and m < p:
        raise ConfigError(f"1f1b needs at least as many microbatches as stages: {m} microbatches < {p} stages",
                          "microbatches")
    if schedule in ("interleaved", "zbh1"):
        rounds = max(1, m // p)
        if m % rounds:
            raise ConfigError(f"{schedule} needs microbatches to be a multiple of the rounds max(1, m // p) = "
                              f"{rounds}; {m} is not (try {rounds * (m // rounds)} or {rounds * (m // rounds + 1)})",
                              "microbatches")
    return schedule


def stage_to_rank(schedule: str, p: int, v: int = 1) -> list[int]:
    """Rank of each of the p·v stages: loop (stage s on rank s % p), or V for zbv (r holds r and 2p-1-r)."""
    if normalise(schedule) in ("zbv", "dualpipev"):
        return [s if s < p else 2 * p - 1 - s for s in range(2 * p)]
    return [s % p for s in range(p * v)]


@lru_cache(maxsize=512)
def built(schedule: str, p: int, m: int, v: int = 1) -> tuple:
    """:func:`build` as tuples (its actions are immutable), built once per shape: the planner asks for the same
    shapes for memory (sim/parallel/memory.py) and for time (sim/planner/schedule.py)."""
    return tuple(tuple(acts) for acts in build(schedule, p, m, v))


def build(schedule: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Per-rank ordered action lists for ``schedule`` with p ranks, m microbatches, v stages per rank."""
    schedule = check(schedule, p, m, v)
    if schedule in ("dualpipev", "loopedbfs"):
        return [[a for step in rank for a in step] for rank in _steps(schedule, p, m, v)]
    fn = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved": _interleaved, "zbh1": _zbh1, "zbv": _zbv}[schedule]
    return [fn(r, p, m, v) for r in range(p)]


def overlap_pairs(schedule: str, p: int, m: int, v: int = 1) -> list[list[tuple[Action, Action]]]:
    """Per rank, the (F, B) pairs torch marks OVERLAP_F_B (only DualPipeV has them); ``build`` lists each pair's
    F right before its B, the order torch 2.13's runtime runs them."""
    schedule = check(schedule, p, m, v)
    if schedule != "dualpipev":
        return [[] for _ in range(p)]
    return [[step for step in rank if len(step) == 2] for rank in _steps(schedule, p, m, v)]


def _steps(schedule, p, m, v):
    if schedule == "dualpipev":
        return [dualpipe.dualpipe_v(r, p, m) for r in range(p)]
    return [dualpipe.looped_bfs(r, p, m, v) for r in range(p)]


def _gpipe(r, p, m, v):
    return [Action(r, "F", i) for i in range(m)] + [Action(r, "B", i) for i in range(m)]


def _one_f_one_b(r, p, m, v):
    warmup = min(m, p - r)
    out = [Action(r, "F", i) for i in range(warmup)]
    for i in range(m - warmup):          # steady state: backward first, then the next forward
        out += [Action(r, "B", i), Action(r, "F", warmup + i)]
    return out + [Action(r, "B", i) for i in range(m - warmup, m)]


def _chunked(r, p, m, v, warmup, zero_bubble):
    """Interleaved 1F1B order, optionally with I/W split; the j-th forward/backward of the rank goes to the
    local chunk ((j // per_round) mod v), backwards in reverse chunk order, microbatches counted per stage."""
    per_round = m // max(1, m // p)
    total = m * v
    nxt = {}

    def act(stage, kind):
        key = (stage, kind)
        nxt[key] = nxt.get(key, 0) + 1
        return Action(stage, kind, nxt[key] - 1)

    def fwd(j):
        return act((j // per_round) % v * p + r, "F")

    def bwd_stage(j):
        return (v - 1 - (j // per_round) % v) * p + r

    back = "I" if zero_bubble else "B"
    out = [fwd(j) for j in range(warmup)]
    for j in range(total):
        if warmup + j < total:
            out.append(fwd(warmup + j))
        out.append(act(bwd_stage(j), back))
        if zero_bubble and j >= r:       # rank r delays its weight gradients by r steps
            out.append(act(bwd_stage(j - r), "W"))
    if zero_bubble:
        out += [act(bwd_stage(j), "W") for j in range(max(0, total - r), total)]
    return out


def _interleaved(r, p, m, v):
    per_round = m // max(1, m // p)
    return _chunked(r, p, m, v, min((v - 1) * per_round + 2 * (p - 1 - r), m * v), False)


def _zbh1(r, p, m, v):
    per_round = m // max(1, m // p)
    return _chunked(r, p, m, v, min((v - 1) * per_round + (p - 1 - r), m * v), True)


def _zbv(r, p, m, v):
    """V shape: chunk 0 = stage r, chunk 1 = stage 2p-1-r; planned for n = max(2p-1, m) microbatches, then the
    actions on microbatches >= m are dropped."""
    n = max(2 * p - 1, m)
    s0, s1 = r, 2 * p - 1 - r
    cnt = {}
    out = []

    def emit(stage, kind):
        key = (stage, kind)
        cnt[key] = cnt.get(key, 0) + 1
        out.append(Action(stage, kind, cnt[key] - 1))

    def count(stage, kind):
        return cnt.get((stage, kind), 0)

    for _ in range(2 * (p - r) - 1):
        emit(s0, "F")
    for _ in range(r):
        emit(s1, "F"), emit(s0, "F")
    for _ in range(p - r):
        emit(s1, "F"), emit(s1, "I"), emit(s1, "W")
    while count(s1, "F") < count(s0, "F") or count(s0, "F") < n:
        if count(s0, "F") < n:
            emit(s0, "F")
        emit(s0, "I"), emit(s0, "W")
        emit(s1, "F"), emit(s1, "I"), emit(s1, "W")
    for _ in range(r):
        emit(s0, "I"), emit(s1, "I")
    for _ in range(p - r):
        emit(s0, "I"), emit(s0, "W")
    while count(s1, "W") < count(s1, "I"):
        emit(s1, "W")
    while count(s0, "W") < count(s0, "I"):
        emit(s0, "W")
    return [a for a in out if a.mb < m]


def format_table(actions: list[list[Action]]) -> str:
    """One line per rank: ``rank 0: 0F0 0F1 ...``."""
    return "\n".join(f"rank {r}: " + " ".join(map(str, acts)) for r, acts in enumerate(actions))
