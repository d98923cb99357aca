"""Lesson 14 (jobs on a shared cluster): two jobs on one oversubscribed spine, realistic jobs packed and spread,
and the exercises, computed by the multi-job simulator (sim/jobs/), never typed in. No torch here: the real run
of two jobs on this machine is runtime/lessons/shared.py.

The fabric: DGX H100 nodes (8 ConnectX-7 NICs of 400 Gb/s = 50 GB/s, sim/cluster/presets.py) under leaf switches of two
nodes; a leaf's uplink to the spine carries its NICs' bandwidth over the oversubscription (sim/kernel/network.py).
"""
from __future__ import annotations

from functools import lru_cache

from distlab.sim.lessons.checker import Exercise
from distlab.sim.lessons.helpers import Figure, Table

NODES_PER_LEAF = 2
EXCHANGE_BYTES = 1_000_000_000           # what each GPU of a job sends in section 2
MIX_NODES = 8                            # section 3: four jobs of two nodes on four leaves
FOCUS = "tp-fsdp"                        # the job section 3's exercises ask about


def cluster_file(oversubscription: float = 2.0, nodes: int = 4, layout: str = "fat-tree") -> dict:
    """The head of a cluster file: DGX H100 nodes under leaves of two (sim/jobs/spec.py)."""
    return {"cluster": "dgx-h100", "nodes": nodes,
            "fabric": {"layout": layout, "nodes_per_leaf": NODES_PER_LEAF, "oversubscription": oversubscription}}


def exchange_plan(nbytes: int = EXCHANGE_BYTES):
    """A job of two nodes: each GPU of the first sends ``nbytes`` to the same GPU of the second (8 flows, one per
    NIC)."""
    from distlab.sim.plan import Plan, Recv, Send
    return Plan([[Send(r + 8, nbytes)] for r in range(8)] + [[Recv(r - 8, nbytes)] for r in range(8, 16)],
                name="exchange")


@lru_cache(maxsize=None)
def two_jobs(oversubscription: float = 2.0):
    """Jobs a (nodes 0 and 2) and b (nodes 1 and 3): both send from leaf 0 to leaf 1, at once."""
    from distlab.sim.jobs import spec
    from distlab.sim.jobs.together import simulate_jobs
    plan = exchange_plan()
    d = {**cluster_file(oversubscription), "jobs": [{"name": "a", "plan": plan, "placement": [0, 2]},
                                                    {"name": "b", "plan": plan, "placement": [1, 3]}]}
    return simulate_jobs(spec.resolve(spec.load(d)))


def leaf_uplink_GBps(oversubscription: float = 2.0) -> float:
    from distlab.sim.jobs import spec
    from distlab.sim.kernel.network import Topology
    topo = Topology(spec.resolve(spec.load({**cluster_file(oversubscription), "jobs": [{"plan": exchange_plan()}]}))
                    .cluster)
    return float(topo.capacity[topo.names.index("leaf0.up")]) / 1e9


MIX_JOBS = (   # four jobs of two nodes: realistic steps that simulate in a second
    ("fsdp", {"model": {"preset": "gpt2-medium", "micro_batch": 4}, "fsdp": {"zero": 3}}),
    ("ddp", {"model": {"preset": "gpt2-small", "micro_batch": 8}, "ddp": {}}),
    ("tp-fsdp", {"model": {"preset": "llama3-8b", "layers": 4, "seq_len": 1024, "micro_batch": 1},
                 "mesh": {"tp": 8}, "tp": {"sequence_parallel": True}}),
    ("ddp-2", {"model": {"preset": "gpt2-medium", "micro_batch": 4}, "ddp": {}}),
)


def mix(placement: str = "packed", oversubscription: float = 2.0) -> dict:
    """The cluster file of section 3: the four jobs on 8 nodes (4 leaves)."""
    return {**cluster_file(oversubscription, MIX_NODES), "placement": placement,
            "jobs": [{"name": name, "scenario": s, "nodes": 2} for name, s in MIX_JOBS]}


@lru_cache(maxsize=None)
def simulate_mix(placement: str = "packed", oversubscription: float = 2.0):
    from distlab.sim.jobs import spec
    from distlab.sim.jobs.together import simulate_jobs
    return simulate_jobs(spec.resolve(spec.load(mix(placement, oversubscription))), cache=_PLANS)


_PLANS: dict = {}       # the mix's plans, built once for every placement and fabric


def jobs_table(outcome) -> Table:
    """Per job: nodes, leaves, step alone and shared, slowdown (sim/jobs/report.py)."""
    from distlab.sim.jobs.report import compact, leaves
    rows = [[r.job.name, r.job.label, compact(r.job.nodes), compact(leaves(outcome, r)),
             f"{r.step_alone_s * 1e3:.2f}", f"{r.step_shared_s * 1e3:.2f}", f"{r.slowdown:.2f}x"]
            for r in outcome.runs]
    return Table(["job", "what", "nodes", "leaves", "alone ms", "shared ms", "slowdown"], rows,
                 f"{outcome.spec.name}: {outcome.spec.cluster.inter_node.oversubscription:g}:1 to the spine")


def links_table(outcome, top: int = 4) -> Table:
    """The contended links: bytes each job put on them."""
    from distlab.sim.jobs.report import contended_links
    rows = [[r["link"], f"{r['capacity_GBps']:g}",
             ", ".join(f"{k} {v / 1e9:.2f}" for k, v in r["bytes_by_job"].items())] for r in contended_links(outcome, top)]
    return Table(["link", "GB/s", "GB moved, by job"], rows, "links two or more jobs use, most bytes first")


def plot_jobs_timeline(outcome) -> Figure:
    """One track per job (rank 0): compute, communication, step ends shared and alone (sim/jobs/figure.py)."""
    from distlab.sim.jobs.figure import draw_jobs_timeline
    f = Figure(11, 0.7 * len(outcome.runs) + 1.8)
    draw_jobs_timeline(f.ax, outcome)
    return f


def placement_sweep(oversubscriptions=(1, 2, 4)) -> list[dict]:
    """The mix packed and spread at each oversubscription: every job's slowdown."""
    rows = []
    for placement in ("packed", "spread"):
        for o in oversubscriptions:
            out = simulate_mix(placement, float(o))
            rows.append({"placement": placement, "oversubscription": o,
                         "slowdown": {r.job.name: r.slowdown for r in out.runs},
                         "step_ms": {r.job.name: r.step_shared_s * 1e3 for r in out.runs}})
    return rows


def sweep_table(rows: list[dict]) -> Table:
    names = list(rows[0]["slowdown"])
    return Table(["placement", "oversubscription"] + names,
                 [[r["placement"], f"{r['oversubscription']}:1"] + [f"{r['slowdown'][n]:.2f}x" for n in names]
                  for r in rows], "slowdown of each job (shared / alone)")


def plot_placement_sweep(rows: list[dict], job: str = FOCUS) -> Figure:
    """``job``'s step time shared against the oversubscription, packed and spread."""
    f = Figure(6.5, 4)
    for placement, marker in (("packed", "o"), ("spread", "s")):
        mine = [r for r in rows if r["placement"] == placement]
        f.ax.plot([r["oversubscription"] for r in mine], [r["step_ms"][job] for r in mine], marker=marker,
                  label=placement)
    f.ax.set_xlabel("oversubscription (leaf down : up)")
    f.ax.set_ylabel(f"{job} step with its neighbours (ms)")
    f.ax.set_xticks([r["oversubscription"] for r in rows if r["placement"] == "packed"])
    f.ax.grid(alpha=0.3)
    f.ax.legend()
    return f


def run_of(outcome, name: str = FOCUS):
    return next(r for r in outcome.runs if r.job.name == name)


SHARED_OVERSUBSCRIPTION = 4.0      # 14-shared-placement asks where the placements differ (the sweep: not at 2:1)


def _faster(attribute: str, oversubscription: float = 2.0) -> str:
    packed, spread = (getattr(run_of(simulate_mix(p, oversubscription)), attribute) for p in ("packed", "spread"))
    return "same" if abs(packed - spread) <= 1e-9 * packed else ("packed" if packed < spread else "spread")


EXERCISES = (
    Exercise("14-two-jobs", "Jobs a and b each send 1 GB from every GPU of a node under leaf 0 to the same GPU of a "
             "node under leaf 1 (2:1). Alone, a's 8 flows run at its NICs' 50 GB/s. Both at once: how many times "
             "longer does a take?", "x", lambda: two_jobs(2.0).runs[0].slowdown,
             hint="the uplink of a 2:1 leaf of two nodes carries half of its 16 NICs' bandwidth; 16 flows share "
                  "it max-min fairly", why="16 flows on 400 GB/s: 25 GB/s each, half the NIC."),
    Exercise("14-four-to-one", "The same two jobs on a 4:1 fabric (each leaf's uplink a quarter of its NICs): how many "
             "times longer does a take with b than a alone on the same fabric?", "x",
             lambda: two_jobs(4.0).runs[0].slowdown, tolerance=0.02,
             traps=lambda: {4.0: "that compares with a alone at its NICs' speed; at 4:1 a alone is already held "
                                 "by the uplink"},
             hint="first a alone: do its 8 flows fit through a 4:1 uplink? then both: how do 16 flows share it?",
             why="alone, a's 8 flows already share the 200 GB/s uplink (25 GB/s each); together 16 share it: "
                 "twice as long again, not four times. A slowdown is relative to alone on the same fabric."),
    Exercise("14-alone-placement", "Alone on its nodes (nothing else running), is the TP x FSDP job's step "
             "shorter packed (both nodes under one leaf) or spread (one node under each of two leaves)?", "choice",
             lambda: _faster("step_alone_s"), choices=("packed", "spread", "same"),
             hint="alone, does its traffic out of a leaf exceed the uplink?",
             why="one node's NICs are half of a 2:1 uplink: alone, the spine never limits it."),
    Exercise("14-shared-placement", "With all four jobs running on a 4:1 fabric (a leaf's uplink carries a quarter "
             "of what its nodes' NICs can send), which placement gives the TP x FSDP job the shorter step?",
             "choice", lambda: _faster("step_shared_s", SHARED_OVERSUBSCRIPTION), choices=("packed", "spread", "same"),
             hint="at 4:1 a leaf of two nodes has 200 GB/s to the spine; which placement sends a job's traffic "
                  "through it at all, and how many jobs' traffic then shares it?",
             why="packed, no job's traffic leaves its leaf, so the spine cannot slow it; spread, every leaf's "
                 "uplink carries two jobs' traffic between their nodes, and at 4:1 the TP x FSDP job's all-gathers "
                 "and reduce-scatters wait for it. At the lesson's 2:1 the uplink still has room for both (the "
                 "sweep below shows each placement at 1:1, 2:1 and 4:1)."),
)


def here_table(here: dict) -> Table:
    """The real run of runtime/lessons/shared.py: each job's all_reduce alone and beside the other."""
    rows = [[job, f"{here['alone_ms'][job]:.2f}", f"{here['shared_ms'][job]:.2f}", f"{here['slowdown'][job]:.2f}x"]
            for job in ("a", "b")]
    return Table(["job (2 gloo ranks)", "alone ms", "both at once ms", "slowdown"], rows,
                 f"all_reduce of {here['nbytes'] / 2**20:g} MiB on this machine, median per call")


HERE_RANKS = 4              # the real run: two jobs of two gloo ranks


def here_predicted_slowdown(cores: int) -> float:
    """Both jobs at once against alone, on ``cores`` cores: a gloo all_reduce of 1 MiB is CPU work (the reduction
    and loopback copies), so alone a job's 2 ranks get a core each while they fit; together 4 ranks share
    ``cores``: max(1, 4 / max(2, cores)), 2x on 2 cores, no slowdown from 4 cores on."""
    return max(1.0, HERE_RANKS / max(2, cores))


def here_verdict(here: dict, tolerance: float | None = None):
    """Lesson 14's real run judged as lessons 05-07's are (sim/lessons/verdicts.py ``verdict``): each job's time
    both at once, predicted as its time alone x ``here_predicted_slowdown``, against the measurement; outside the
    tolerance on a machine other processes kept busy (``here["background"]``) it is "not judged", with why."""
    from distlab.sim.lessons.verdicts import TOLERANCE, verdict
    k = here_predicted_slowdown(here["cores"])
    rows = [{"job": job, "predicted_s": here["alone_ms"][job] * k / 1e3, "measured_s": here["shared_ms"][job] / 1e3}
            for job in ("a", "b")]
    return verdict(rows, "job", TOLERANCE if tolerance is None else tolerance,
                   f"both at once, predicted alone x {k:.2g} ({HERE_RANKS} ranks on {here['cores']} cores)",
                   here.get("background"))
