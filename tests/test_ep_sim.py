"""Expert parallelism in the simulator (sim/parallel/ep, sim/collectives/direct.py, sim/parallel/pipeline/dualpipe.py): the
all_to_all with per-peer sizes costs what its slowest peer pair moves; across nodes it obeys nccl-tests' busbw
rule; a routing skew makes the step wait for the slowest expert rank, exactly; DualPipe's overlapped F/B pair
hides one chunk's all_to_all behind the other's compute; the DeepSeek-V3 preset has the paper's size; bad
input is one line, exit 2. Pure simulator: milliseconds."""
import pytest

from distlab.sim.cluster import Cluster, GPUSpec, IntraNode, InterNode, load_cluster
from distlab.sim.collectives import metrics
from distlab.sim.kernel.engine import compute_seconds, simulate, simulate_collective
from distlab.sim.errors import ConfigError
from distlab.sim.mesh import Mesh
from distlab.sim.parallel.ep.model import config_of, from_spec
from distlab.sim.parallel.ep.plan import EPOptions, Layout, ep_plan
from distlab.sim.parallel.pipeline.dualpipe import overlapped_ops, serial_ops
from distlab.sim.plan import Collective, Compute, Plan

BW = 10e9      # bytes/s per GPU per direction


def flat(n: int, nodes: int = 1) -> Cluster:
    """n GPUs per node on a switch of BW per direction, no latency, Gloo-style (no NCCL protocol costs); compute
    1 TFLOP/s, memory fast enough never to bind."""
    return Cluster("flat", nodes, n, GPUSpec("g", tflops=1.0, hbm_GBps=1e9, memory_GiB=80.0, arch="cpu"),
                   IntraNode("nvswitch", BW / 1e9, 0.0),
                   InterNode("infiniband", n, BW / 1e9, 0.0) if nodes > 1 else None)


def a2a_plan(splits, n):
    b = max(sum(r) for r in splits)
    return Plan([[Collective("all_to_all", b, group=tuple(range(n)), splits=splits)] for _ in range(n)]).validate()


def test_uneven_all_to_all_costs_its_busiest_link():
    """One hot receiver: every rank sends X to rank 0 and y to the others; rank 0's ingress carries 3X."""
    X, y = 8 << 20, 1 << 20
    splits = tuple(tuple(0 if i == j else (X if j == 0 else y) for j in range(4)) for i in range(4))
    t = simulate(a2a_plan(splits, 4), flat(4)).makespan
    assert t == pytest.approx(3 * X / BW, rel=1e-9)
    # the busiest sender instead: rank 2 sends 5X to each peer
    splits = tuple(tuple(0 if i == j else (5 * X if i == 2 else y) for j in range(4)) for i in range(4))
    assert simulate(a2a_plan(splits, 4), flat(4)).makespan == pytest.approx(15 * X / BW, rel=1e-9)


def test_even_splits_equal_the_plain_all_to_all_and_nccl_tests_busbw_across_nodes():
    """2 nodes x 4 GPUs, NIC = NVLink = BW: half of what a rank sends crosses its NIC, t = (S/2)/BW, so
    algbw = 2 BW and busbw = algbw x (n-1)/n (nccl-tests alltoall) = 1.75 BW."""
    c = load_cluster("dgx-h100", nodes=2)
    S = 64 << 20
    plain, _ = simulate_collective("all_to_all", S, c, "direct")
    even = simulate(a2a_plan(tuple(tuple(S // 16 for _ in range(16)) for _ in range(16)), 16), c)
    assert even.makespan == pytest.approx(plain.makespan, rel=1e-9)
    f = flat(4, nodes=2)
    t = simulate(a2a_plan(tuple(tuple(S // 8 for _ in range(8)) for _ in range(8)), 8), f).makespan
    assert t == pytest.approx(S / 2 / BW, rel=1e-9)
    assert metrics("all_to_all", 8, S, t)["busbw_GBps"] == pytest.approx(2 * BW * 7 / 8 / 1e9, rel=1e-9)


MOE = dict(kind="moe", layers=1, hidden=256, experts=8, top_k=2, expert_ffn=512, seq_len=64, attention="none",
           embed=False, dtype="float32")


def test_routing_skew_step_is_the_slowest_expert_ranks_hand_computed_time():
    model = from_spec(MOE)
    c = model.config
    n = 4
    opts = EPOptions(skew=1.5, zero1=False)
    lay = Layout(config_of(model), n, opts)
    assert lay.received[0] > 2 * lay.received[-1]                # the first experts' rank is the hot one
    plan = ep_plan(model, Mesh({"ep": n}), opts)
    cl = flat(n)
    row = c["hidden"] * 4
    D = [[t * row for t in r] for r in lay.tokens]

    def a2a(m):        # the busiest sender or receiver, off-diagonal
        return max(max(sum(m[i][j] for j in range(n) if j != i), sum(m[j][i] for j in range(n) if j != i))
                   for i in range(n)) / BW
    counts = (n - 1) * (c["experts"] * 8 // n) / BW
    expert = [compute_seconds(Compute(flops=2.0 * r * 3 * c["hidden"] * c["expert_ffn"]), cl) for r in lay.received]
    slowest = max(expert)
    assert slowest == expert[0] and slowest > 1.5 * sum(expert) / n
    front = compute_seconds(Compute(flops=2.0 * 64 * c["hidden"] * c["experts"]), cl)
    dense = sum(q.numel for q in model.params if ".experts." not in q.name)
    grads = 2 * (n - 1) / n * dense * 4 / BW                    # ring all_reduce, no latency
    optimizer = compute_seconds(Compute(flops=12.0 * (dense + 3 * 2 * 256 * 512), bytes=0.0), cl)
    hand = (front + counts + a2a(D) + slowest + a2a(list(zip(*D)))          # forward
            + a2a(D) + 2 * slowest + a2a(list(zip(*D))) + 2 * front        # backward
            + grads + optimizer)
    t = simulate(plan, cl).makespan
    assert t == pytest.approx(hand, rel=1e-6)
    balanced = simulate(ep_plan(model, Mesh({"ep": n}), EPOptions(zero1=False)), cl).makespan
    assert t > balanced


def test_dualpipe_pair_hides_one_chunks_all_to_all_behind_the_others_compute():
    """F = [c, a2a, c], B = [c, a2a, c] with c = 2 ms of compute and an all_to_all of a = 1 ms: serial 4c + 2a,
    overlapped 4c: F's all_to_all runs during B's first compute and B's during F's second."""
    n, c_s = 2, 2e-3
    nbytes = int(BW * 1e-3)                                     # each rank sends nbytes to its peer: 1 ms
    splits = ((0, nbytes), (nbytes, 0))

    def chunk(tag):
        return [Compute(f"{tag}0", seconds=c_s), Collective("all_to_all", nbytes, group=(0, 1), stream="ep",
                                                            splits=splits, name=f"{tag} a2a"),
                Compute(f"{tag}1", seconds=c_s)]
    serial = Plan([serial_ops(chunk("F"), "F") + serial_ops(chunk("B"), "B") for _ in range(n)]).validate()
    paired = Plan([overlapped_ops(chunk("F"), chunk("B"), "F", "B") for _ in range(n)]).validate()
    assert simulate(serial, flat(n)).makespan == pytest.approx(4 * c_s + 2e-3, rel=1e-9)
    trace = simulate(paired, flat(n))
    assert trace.makespan == pytest.approx(4 * c_s, rel=1e-9)
    ops = {o.name: o for o in trace.for_rank(0)}
    assert [ops[k].start for k in ("F0", "B0", "F1", "B1")] == pytest.approx([0, c_s, 2 * c_s, 3 * c_s])
    assert ops["F a2a"].start == pytest.approx(c_s) and ops["F a2a"].end <= ops["B0"].end + 1e-12
    assert ops["B a2a"].start == pytest.approx(2 * c_s) and ops["B a2a"].end <= ops["F1"].end + 1e-12


def test_dualpipev_with_experts_overlap_shortens_the_step():
    model = from_spec({**MOE, "layers": 4, "embed": True, "vocab": 512})
    cl = load_cluster("dgx-h100")
    mesh = Mesh({"pp": 2, "ep": 2})
    on = ep_plan(model, mesh, EPOptions(schedule="dualpipev", microbatches=4))
    off = ep_plan(model, mesh, EPOptions(schedule="dualpipev", microbatches=4, overlap=False))
    assert simulate(on, cl).makespan < simulate(off, cl).makespan


@pytest.mark.parametrize("dims", [{"ep": 2, "pp": 2}, {"dp": 2, "pp": 2, "ep": 2}])
def test_pipeline_stage_is_each_ranks_pp_coordinate_wherever_pp_sits_in_the_mesh(dims):
    """Regression: the DualPipeV example shrunk to pp 2 with ep (or a filled-in dp) outside pp put one ep group's
    ranks on different stages (a flat {pp, dp} numbering): all_to_alls of different sizes in the group, the plan
    check failed. Each rank now runs its own pp coordinate's stages; the step equals the pp-outermost mesh's."""
    from distlab.sim.check import check_plan
    model = from_spec({**MOE, "layers": 4, "embed": True, "vocab": 512})
    mesh, opts = Mesh(dims), EPOptions(schedule="dualpipev", microbatches=4)
    plan = ep_plan(model, mesh, opts)
    assert check_plan(plan) == []
    for g in range(mesh.world_size):         # dualpipev: pp rank 0 holds the embedding and the head (its V)
        names = {o.name for o in plan.ranks[g] if isinstance(o, Compute)}
        assert any("embed" in n for n in names) == (mesh.coords(g)["pp"] == 0), (dims, g)
    cl = flat(mesh.world_size)
    outer = Mesh({"pp": 2, **{k: v for k, v in dims.items() if k != "pp"}})
    assert simulate(plan, cl).makespan == pytest.approx(simulate(ep_plan(model, outer, opts), cl).makespan,
                                                        rel=1e-9)


def test_deepseek_v3_preset_has_the_papers_size():
    """arXiv 2412.19437: 671B parameters in total, 37B activated per token (top-8 of 256 routed experts)."""
    m = from_spec({"preset": "deepseek-v3"})
    assert m.num_params / 1e9 == pytest.approx(671, rel=0.005)
    routed = sum(q.numel for q in m.params if ".moe.experts." in q.name)
    assert (m.num_params - routed + routed * 8 / 256) / 1e9 == pytest.approx(37, rel=0.03)
    assert sum(1 for layer in m.layers if any(".moe." in q.name for q in layer.params)) == 58


def test_splits_round_trip_and_bad_splits_are_refused():
    p = a2a_plan(((0, 5), (7, 0)), 2)
    assert Plan.from_json(p.to_json()).ranks[1][0].splits == ((0, 5), (7, 0))
    assert "splits" not in Plan([[Collective("all_reduce", 4)]]).to_dict()["ranks"][0][0]
    with pytest.raises(ConfigError, match="largest row sum"):
        Plan([[Collective("all_to_all", 5, group=(0, 1), splits=((0, 5), (7, 0)))]] * 2).validate()
    with pytest.raises(ConfigError, match="2 rows of 2"):
        Plan([[Collective("all_to_all", 5, group=(0, 1), splits=((0, 5),))]] * 2).validate()


def write(tmp_path, mesh, model):
    path = tmp_path / "moe.yaml"
    path.write_text(f"model: {model}\nmesh: {mesh}\nep: {{}}\ncluster: dgx-h100\n")
    return str(path)


@pytest.mark.parametrize("mesh,model,message", [
    ("{ep: 4}", "{kind: moe, layers: 1, hidden: 64, experts: 6, top_k: 2, expert_ffn: 32, seq_len: 8}",
     "mesh.ep: ep 4 does not divide the 6 experts; allowed: 1, 2, 3, 6"),
    ("{ep: 2}", "{kind: moe, layers: 1, hidden: 64, experts: 8, top_k: 9, expert_ffn: 32, seq_len: 8}",
     "model.top_k: top_k 9 is more than the 8 experts; allowed: 1..8"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, mesh, model, message):
    from distlab.runtime.cli import main
    assert main(["simulate", write(tmp_path, mesh, model), "--no-files"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err and err.count("\n") == 1, err


def test_node_limited_routing_and_capacity_factor():
    """node_limit 1 on 2 nodes x 4: every token's experts are on its own node, so no dispatch byte crosses the
    network; a capacity factor 1.0 caps each expert at ceil(T x top_k / E) copies per source rank (GShard)."""
    from distlab.sim.parallel.ep.routing import routing
    c = config_of(from_spec(MOE))
    lay = Layout(c, 8, EPOptions(node_limit=1), nodes=[0, 0, 0, 0, 1, 1, 1, 1])
    assert all(lay.dispatch[i][j] == 0 for i in range(8) for j in range(8) if (i < 4) != (j < 4))
    assert sum(map(sum, lay.tokens)) == 8 * 64 * 2
    counts = routing(64, 2, 8, 2, skew=2.0, capacity_factor=1.0)
    assert max(counts[0]) == 16 and sum(counts[0]) < 128


def test_deepseek_v3_scenario_plan_places_ep_64_across_8_nodes_with_node_limited_routing():
    """scenarios/moe-deepseek-v3.yaml (the plan only; `distlab simulate` runs it in seconds): 64 ranks, each
    all_to_all over all of them, every rank's tokens routed to experts on its own and the next 3 nodes."""
    from distlab.sim import scenario as sc
    from distlab.sim.cluster import load_cluster
    from distlab.sim.workloads.registry import get
    d = sc.load("scenarios/moe-deepseek-v3.yaml")
    model = sc.resolve(d)[0]
    opts = get("ep").parse(d["ep"], "ep")
    cl = load_cluster(d["cluster"], nodes=d["nodes"])
    plan = ep_plan(model, Mesh(d["mesh"]), opts, cl)
    a2a = [o for o in plan.ranks[0] if isinstance(o, Collective) and "dispatch fwd" in o.name]
    assert plan.world_size == 64 and len(a2a) == 4 * 2 and len(a2a[0].group) == 64
    row = a2a[0].splits[0]
    assert [sum(row[8 * k:8 * k + 8]) > 0 for k in range(8)] == [True] * 4 + [False] * 4
    assert plan.meta["received"] == [4096 * 8] * 64
