"""torch.profiler traces of real multi-GPU jobs (tests/data/profiles/SOURCES.md) read in (sim/ingest/kineto.py):
the measured breakdown agrees with HolisticTraceAnalysis on the same traces; `distlab compare PLAN DIR` and
`distlab simulate --from-profile DIR` on them; broken traces exit 2 in one line."""
from __future__ import annotations

import gzip
import json
import os

import pytest
from cli_in_process import cli  # noqa: F401  (the fixture)

from distlab.sim.ingest.kineto import breakdown, load_profile

DATA = os.path.join(os.path.dirname(__file__), "data", "profiles")
DDP = os.path.join(DATA, "hta_a100_2rank_nccl")         # ResNet-50 DDP on 2 A100, rank 0 (NCCL 2.17.1)
SAMPLED = os.path.join(DATA, "hta_128rank_sampled")     # ranks 0 and 1 of a 128-GPU recommendation model job


@pytest.fixture(scope="module")
def hta_results():
    """HTA's own temporal breakdown and comm/comp overlap of both folders (a test-only dependency)."""
    hta = pytest.importorskip("hta.trace_analysis")
    import logging
    logging.getLogger("hta").setLevel(logging.ERROR)
    out = {}
    for folder in (DDP, SAMPLED):
        a = hta.TraceAnalysis(trace_dir=folder)
        out[folder] = (a.get_temporal_breakdown(visualize=False), a.get_comm_comp_overlap(visualize=False))
    return out


@pytest.mark.parametrize("folder", [DDP, SAMPLED])
def test_breakdown_and_overlap_agree_with_hta_within_1_percent(hta_results, folder):
    temporal, overlap = hta_results[folder]
    mine = {b["rank"]: b for b in (breakdown(t) for t in load_profile(folder).ranks.values())}
    assert sorted(mine) == sorted(temporal["rank"])
    for _, row in temporal.iterrows():
        b = mine[row["rank"]]
        for key in ("kernel_time", "idle_time", "compute_time", "non_compute_time"):
            assert b[f"{key}_us"] == pytest.approx(row[f"{key}(us)"], rel=0.01), (row["rank"], key)
    for _, row in overlap.iterrows():
        assert 100 * mine[row["rank"]]["comm_comp_overlap"] == pytest.approx(row["comp_comm_overlap_pctg"], rel=0.01)


def test_collectives_read_from_the_nccl_kernels_and_their_args():
    t = load_profile(DDP).ranks[0]
    comm = [e for e in t.events if e.kind == "communication"]
    assert {e.op for e in comm} == {"all_reduce", "broadcast"} and {e.algorithm for e in comm} == {"RING"}
    assert {e.protocol for e in comm} == {"LL"} and t.nccl_version == "2.17.1" and t.world_size == 2
    assert max(e.nbytes for e in comm) == 31502336 and {e.group for e in comm} == {(0, 1)}
    assert len(t.steps) == 2                         # ProfilerStep#4, #5 kept; #6 (the last) dropped as HTA does


def test_simulate_from_profile_then_compare_the_plan_against_the_profile(cli, tmp_path):
    plan = tmp_path / "ddp.json"
    rc, out, err = cli("simulate", "--from-profile", DDP, "--no-files", "--json", "--save-plan", plan)
    assert rc == 0, err
    d = json.loads(out)
    g = d["profile"]["guessed"]
    assert (g["world_size"], g["collectives"], g["dtypes"], g["cluster"]) == (2, 7, ["float32", "int64"], "dgx-a100")
    assert g["collective_bytes"] == 102441032        # ResNet-50's 25.6 M float32 gradients + DDP's broadcasts
    assert any("no trace here" in x for x in d["profile"]["not_guessed"])
    assert d["results"][0]["world_size"] == 2 and d["results"][0]["comm_s"] > 0
    both = tmp_path / "both.json"
    rc, out, err = cli("compare", plan, DDP, "--json", "--out", both)
    assert rc == 0, err
    d = json.loads(out)
    pairs = d["collectives"]
    assert [p["op"] for p in pairs].count("all_reduce") == 5 and all(p["measured_bytes"] == p["predicted_bytes"]
                                                                      for p in pairs)
    gemm = d["compute"][0]["kinds"]["gemm"]                 # every GEMM kernel matched to the plan's GEMM ops
    assert gemm["measured_kernels"] == gemm["matched_kernels"] == 181
    r0 = d["ranks"][0]
    assert r0["measured"]["compute_s"] == pytest.approx(r0["predicted"]["compute_s"], rel=0.02)  # taken as measured
    threads = {e["args"]["name"] for e in json.loads(both.read_text())["traceEvents"] if e["name"] == "thread_name"}
    assert any(t.startswith("measured stream") for t in threads) and "predicted comm" in threads
    rc, out, err = cli("compare", plan, DDP)
    assert rc == 0 and "collectives matched in issue order" in out and "overlap" in out
    assert "compute by kind" in out and "measured gemm x57" in out


def test_a_plan_from_the_sampled_128_rank_job_says_what_it_left_out():
    from distlab.sim.ingest.scenario import plan_from_profile
    plan, guessed, unknown = plan_from_profile(load_profile(SAMPLED))
    assert plan.world_size == 128 and guessed["traced_ranks"] == [0, 1] and guessed["collectives"] == 0
    assert any(x.startswith("10 x ncclKernel_SendRecv") for x in unknown)
    assert plan.ranks[2] == plan.ranks[0] and plan.ranks[3] == plan.ranks[1]


@pytest.mark.parametrize("content, says", [(b"{not json", "not valid JSON"), (b'{"a": 1}', "traceEvents"),
                                           (b"", "not valid JSON")])
def test_broken_traces_exit_2_in_one_line(cli, tmp_path, content, says):
    (tmp_path / "rank-0.json").write_bytes(content)
    rc, out, err = cli("compare", "scenarios/example-plan.json", tmp_path)
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_a_cut_gzip_trace_exits_2(cli, tmp_path):
    whole = open(os.path.join(SAMPLED, "rank-0.json.gz"), "rb").read()
    (tmp_path / "rank-0.json.gz").write_bytes(whole[: len(whole) // 2])
    rc, out, err = cli("simulate", "--from-profile", tmp_path, "--no-files")
    assert rc == 2 and "gzip" in err and len(err.strip().splitlines()) == 1, err
    with gzip.open(tmp_path / "rank-0.json.gz", "wt") as f:
        f.write(json.dumps({"traceEvents": []}))
    rc, out, err = cli("simulate", "--from-profile", tmp_path, "--no-files")
    assert rc == 2 and "no GPU kernels and no CPU ops" in err


@pytest.mark.parametrize("name, expected", [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", ("all_reduce", "RING", "LL")),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", ("all_gather", "RING", "LL")),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     ("reduce_scatter", "RING", "LL")),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", ("all_reduce", "RING", "LL")),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", ("send_recv", None, None)),
])
def test_nccl_kernel_names_of_both_generations(name, expected):
    """NCCL 2.19+ names (ncclDevKernel_{op}_{redop}_{type}_{algo}_{proto}, as in published nsys/profiler tables)
    and the older ncclKernel_{op}_{algo}_{proto}_{redop}_{type}."""
    from distlab.sim.ingest.kineto import _collective, gpu_kind
    got = _collective(name, {})
    assert gpu_kind(name) == "communication"
    assert (got.get("op"), got.get("algorithm"), got.get("protocol")) == expected
