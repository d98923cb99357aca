"""Lesson 10, experts half: mixture of experts and expert parallelism (sim/parallel/ep/). The helpers the notebook calls
and its exercises; expected values come from the library (sim/parallel/ep/routing.py, sim/parallel/ep/plan.py, the simulator),
so they match what the lesson runs. The running example is one MoE block of DeepSeek-V3 (preset
``deepseek-v3``, arXiv 2412.19437) with one 4096-token sequence per GPU, on H800 nodes (``hgx-h800``)."""
from __future__ import annotations

from functools import lru_cache

from distlab.sim.lessons.checker import Exercise

MiB = 2**20
BLOCK = {"preset": "deepseek-v3", "layers": 1, "first_dense": 0, "embed": False}   # one MoE block alone
# The real run's model (scenarios/moe-cpu.yaml): MoE layers alone, small enough for 2 CPU ranks.
CPU_MOE = dict(kind="moe", layers=2, hidden=256, experts=8, top_k=2, expert_ffn=512, seq_len=256, shared_experts=1,
               attention="none", embed=False, dtype="float32")
SKEW = 1.0                                     # the lesson's skewed router: expert e gets (e+1)^-1 of the copies
# DeepSeek-V3 dispatches in FP8 and combines in BF16 (arXiv 2412.19437 sec. 3.3.3): the lesson's block does too
# (sim/parallel/ep/plan.py EPOptions.fp8_dispatch); ``fp8=False`` gives the all-bf16 block for comparison.
FP8 = True


def block_model():
    from distlab.sim.parallel.ep.model import from_spec
    return from_spec(BLOCK)


def cpu_model():
    from distlab.sim.parallel.ep.model import from_spec
    return from_spec({**CPU_MOE, "name": "moe-cpu"})


def _config():
    from distlab.sim.parallel.ep.model import config_of
    return config_of(block_model())


def _cluster(ep: int):
    from distlab.sim.cluster import load_cluster
    nodes = max(1, ep // 8)
    return load_cluster("hgx-h800", nodes=nodes) if nodes > 1 else load_cluster("hgx-h800")


def shape_rows() -> list[list]:
    """DeepSeek-V3's shape from the preset (sim/parallel/ep/model.py): [what, value]."""
    from distlab.sim.parallel.ep.model import PRESETS, from_spec
    p, m = PRESETS["deepseek-v3"], from_spec({"preset": "deepseek-v3"})
    routed = sum(q.numel for q in m.params if ".moe.experts." in q.name)
    active = m.num_params - routed + routed * p["top_k"] / p["experts"]
    return [["blocks (the first 3 dense)", p["layers"]], ["hidden", p["hidden"]],
            ["routed experts per MoE block", p["experts"]], ["experts per token (top-k)", p["top_k"]],
            ["shared experts", p["shared_experts"]], ["expert FFN width", p["expert_ffn"]],
            ["parameters, total (billions)", round(m.num_params / 1e9, 1)],
            ["parameters one token uses (billions)", round(active / 1e9, 1)]]


def layout(ep: int = 8, skew: float = 0.0, node_limit: int | None = None, fp8: bool = FP8):
    """The routing of one micro-batch over ``ep`` ranks (sim/parallel/ep/plan.py Layout), 8 ranks per node."""
    from distlab.sim.parallel.ep.plan import EPOptions, Layout
    return Layout(_config(), ep, EPOptions(skew=skew, node_limit=node_limit, fp8_dispatch=fp8),
                  [r // 8 for r in range(ep)])


def dispatch_MiB(ep: int = 8, rank: int = 0, own: bool = False, fp8: bool = FP8) -> float:
    """Bytes rank ``rank`` sends to the other ranks in one dispatch all_to_all (``own``: its own experts' too)."""
    row = layout(ep, fp8=fp8).dispatch[rank]
    return sum(b for j, b in enumerate(row) if own or j != rank) / MiB


def block_plan(ep: int = 8, skew: float = 0.0, node_limit: int | None = None, fp8: bool = FP8):
    """Forward and backward of the block on ``ep`` ranks (no optimizer: what runtime/parallel/ep/run.py times)."""
    from distlab.sim.mesh import Mesh
    from distlab.sim.parallel.ep.plan import EPOptions, ep_plan
    return ep_plan(block_model(), Mesh({"ep": ep}), EPOptions(skew=skew, node_limit=node_limit, fp8_dispatch=fp8),
                   _cluster(ep), name=f"deepseek-v3-block-ep{ep}", optimizer=False)


def block_trace(ep: int = 8, skew: float = 0.0, node_limit: int | None = None, fp8: bool = FP8):
    """The simulated block (cached: the notebook and its exercises ask for the same ones)."""
    return _block_trace(ep, float(skew), node_limit, fp8)


@lru_cache(maxsize=32)
def _block_trace(ep: int, skew: float, node_limit: int | None, fp8: bool):
    from distlab.sim.kernel.engine import simulate
    return simulate(block_plan(ep, skew, node_limit, fp8), _cluster(ep))


def precision_rows(ep: int = 8) -> list[list]:
    """The balanced block with every all_to_all in bf16 against DeepSeek-V3's FP8 dispatch: [what, bf16, fp8]."""
    rows = []
    for what, get in (("rank 0's dispatch to the 7 others (MiB)", lambda f: round(dispatch_MiB(ep, fp8=f), 1)),
                      ("dispatch all_to_all (ms)", lambda f: round(_op_ms(block_trace(ep, fp8=f), "dispatch fwd"), 3)),
                      ("combine all_to_all (ms)", lambda f: round(_op_ms(block_trace(ep, fp8=f), "combine fwd"), 3)),
                      ("block fwd + bwd (ms)", lambda f: round(block_trace(ep, fp8=f).makespan * 1e3, 2))):
        rows.append([what, get(False), get(True)])
    return rows


def _op_ms(trace, part: str) -> float:
    o = next(o for o in trace.for_rank(0) if o.kind == "collective" and part in o.name)
    return (o.end - o.start) * 1e3


def collective_rows(ep: int = 8) -> list[list]:
    """Rank 0's ep all_to_alls in issue order: [#, what, dtype, MiB to each peer]."""
    from distlab.sim.parallel.ep.plan import collective_sequence
    plan = block_plan(ep)
    names = [o.name for o in plan.ranks[0] if getattr(o, "name", "").startswith("ep ")]
    return [[i, n.replace("ep all_to_all h.0 ", ""), dtype,
             f"{_size(peers[0])} x {len(peers)}" if len(set(peers)) == 1 else " ".join(map(_size, peers))]
            for i, (n, (_, peers, dtype, _, _)) in enumerate(zip(names, collective_sequence(plan)))]


def _size(nbytes: int) -> str:
    return f"{nbytes / MiB:g} MiB" if nbytes >= MiB else f"{nbytes} B"


def hot_share(skew: float = SKEW, ep: int = 8) -> float:
    """Share (%) of all routed token copies that the busiest ep rank receives (experts sharded contiguously)."""
    received = layout(ep, skew).received
    return 100.0 * max(received) / sum(received)


def received_per_rank(skew: float = SKEW, ep: int = 8) -> list[int]:
    return layout(ep, skew).received


def breakdown_rows(skew: float = 0.0, ep: int = 8) -> list[list]:
    """Rank 0's ops in the simulated block: [op, stream, ms]."""
    trace = block_trace(ep, skew)
    return [[o.name.replace(" h.0", ""), "ep" if o.kind == "collective" else "compute",
             round((o.end - o.start) * 1e3, 3)] for o in trace.for_rank(0) if o.kind in ("compute", "collective")]


def step_ms(skew: float = SKEW, ep: int = 8) -> float:
    """The simulated forward and backward of the block (the slowest rank's end)."""
    return block_trace(ep, skew).makespan * 1e3


def skew_sweep(skews=(0.0, 0.25, 0.5, 0.75, 1.0, 1.5)) -> list[list]:
    """[skew, busiest rank's share %, step ms, step / balanced]."""
    steps = {s: step_ms(s) for s in (0.0, *skews)}
    return [[s, round(hot_share(s), 1), round(steps[s], 2), round(steps[s] / steps[0.0], 2)] for s in skews]


def ib_share(node_limit: int | None = 4, ep: int = 64) -> float:
    """Share (%) of rank 0's dispatch bytes that leave its node (8 GPUs per node), balanced routing."""
    row = layout(ep, 0.0, node_limit).dispatch[0]
    return 100.0 * sum(b for j, b in enumerate(row) if j // 8 != 0) / sum(row)


def node_limit_rows(ep: int = 64) -> list[list]:
    """EP 64 across 8 nodes: [node limit, % of dispatch bytes over IB, dispatch ms, block fwd+bwd ms]."""
    out = []
    for limit in (None, 4, 1):
        trace = block_trace(ep, 0.0, limit)
        d = next(o for o in trace.for_rank(0) if o.kind == "collective" and "dispatch fwd" in o.name)
        out.append(["none" if limit is None else limit, round(ib_share(limit, ep), 1),
                    round((d.end - d.start) * 1e3, 2), round(trace.makespan * 1e3, 2)])
    return out


@lru_cache(maxsize=4)
def pair_trace(overlap: bool, ep: int = 8):
    """DualPipe's pair on ``ep`` ranks: the block's forward (micro-batch A) beside its backward (micro-batch B),
    overlapped (sim/parallel/pipeline/dualpipe.py overlapped_ops) or one after the other (serial_ops)."""
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.parallel.ep.plan import EPOptions, Layout, block_ops
    from distlab.sim.parallel.pipeline.dualpipe import overlapped_ops, serial_ops
    from distlab.sim.plan import Plan
    c, group = _config(), tuple(range(ep))
    lay = Layout(c, ep, EPOptions(fp8_dispatch=FP8))
    ranks = []
    for j in range(ep):
        f, b = block_ops(c, 0, "F", j, lay, group, "A "), block_ops(c, 0, "B", j, lay, group, "B ")
        ranks.append(overlapped_ops(f, b, "F", "B") if overlap else serial_ops(f, "F") + serial_ops(b, "B"))
    return simulate(Plan(ranks, name=f"dualpipe-pair-{'overlapped' if overlap else 'serial'}").validate(),
                    _cluster(ep))


def pair_ms(overlap: bool) -> float:
    return pair_trace(overlap).makespan * 1e3


EXERCISES = (
    Exercise("10-dispatch-MiB", "One DeepSeek-V3 MoE block, 4096 tokens per GPU, ep 8 on one H800 node, balanced "
             "routing, the dispatch in FP8 as the paper does it (1 byte per value, plus one fp32 scale per 128 "
             "values): how many MiB does rank 0 send to the other 7 ranks in the forward dispatch all_to_all?",
             "MiB", dispatch_MiB,
             traps=lambda: {dispatch_MiB(own=True): "that includes the copies for rank 0's own 32 experts: they "
                                                    "never leave the GPU (the all_to_all's diagonal is a local "
                                                    "copy)",
                            dispatch_MiB(fp8=False): "that is the bf16 dispatch; in FP8 each value is one byte"},
             hint="each token goes to top_k = 8 experts: T·k copies of h = 7168 values; balanced, 1/ep of them "
                  "stay on rank 0",
             why="T·k·(h + 4·h/128)·(ep-1)/ep bytes, about eight times one token's activations, for every MoE "
                 "block; the combine sends the same copies back in BF16, twice the bytes, and the backward "
                 "repeats both: EP moves more bytes than the ring of section 3."),
    Exercise("10-hot-share", "Same block, skew 1.0: expert e gets a share proportional to 1/(e+1) of the token "
             "copies, and the 256 experts are sharded contiguously, 32 per rank. What share (%) of all copies "
             "does the busiest rank, rank 0, receive?", "%", hot_share, abs_tolerance=1.0,
             hint="H(32)/H(E) for E experts, with H(n) = 1 + 1/2 + ... + 1/n ≈ ln n + 0.577",
             why="two thirds of the copies land on one rank of eight: 5.3x its fair share. Its grouped GEMM and "
                 "its ingress link take 5.3x as long, and everyone waits for it at the combine all_to_all."),
    Exercise("10-skew-step", "Still skew 1.0, ep 8 on one hgx-h800 node: how long (ms) does the simulator say "
             "the block's forward and backward take? (balanced: the table above)", "ms", step_ms,
             tolerance=0.08,
             hint="attention, router and shared experts do not change; rank 0's expert GEMMs grow by its share x "
                  "ep; each all_to_all is as long as the busiest link: rank 0's ingress (dispatch) or egress "
                  "(combine), carrying the 7 other ranks' copies for it",
             why="over 2.5x the balanced block: the hot rank's GEMMs and its one NVLink port decide the step. "
                 "That is why DeepSeek-V3 balances its router (a bias per expert, sec. 2.1.2) and why a dropless "
                 "MoE's step time follows its most loaded expert."),
    Exercise("10-ib-share", "DeepSeek-V3's layout: ep 64 across 8 H800 nodes, balanced routing, each token sent "
             "to experts on at most 4 nodes (its own and the next 3 here). What share (%) of rank 0's dispatch "
             "bytes crosses InfiniBand?", "%", ib_share, abs_tolerance=0.5,
             traps=lambda: {ib_share(None): "that is without the node limit: 7 of 8 nodes' experts"},
             hint="with the limit, its copies are spread evenly over the experts of 4 nodes",
             why="3 of 4 nodes' worth instead of 7 of 8; IB carries 50 GB/s per GPU against NVLink's 160, so the "
                 "limit shortens the dispatch. DeepSeek also sends a token once per node over IB and forwards "
                 "it over NVLink (sec. 3.2.2), which distlab does not model."),
)
