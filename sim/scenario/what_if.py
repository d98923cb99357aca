"""What torch 2.13's separate reduce-scatter group buys on a cluster: the FSDP step simulated both ways (lesson 06's
prediction exercise; docs/communicators.md).

    >>> rows = reduce_scatter_group_what_if({"model": {"preset": "llama3-8b", "layers": 4, "seq_len": 1024},
    ...     "fsdp": {"param_dtype": "bfloat16"}, "cluster": "dgx-h100", "nodes": 1})
    >>> [r["separate_reduce_scatter_group"] for r in rows], rows[0]["ag_rs_overlap_s"], rows[1]["ag_rs_overlap_s"] > 0
    ([False, True], 0.0, True)

On one process group NCCL runs the backward all-gathers and the reduce-scatters one at a time
(sim/kernel/communicators.py); on two they move data at once over the same links, each slower. A study of
scenarios, so it lives beside the scenario (sim/parallel/ never imports it: tests/test_import_graph.py).
"""
from __future__ import annotations


def reduce_scatter_group_what_if(scenario) -> list[dict]:
    """The scenario's FSDP step with the reduce-scatters on the shard group (FSDP2's default) and on a group of
    their own (torch 2.13 ``set_separate_reduce_scatter_group``, docs/communicators.md): per setting the step,
    the seconds rank 0's backward all-gathers and reduce-scatters moved data at once, and the seconds its
    reduce-scatters moved data. A prediction exercise: which is faster, and by how much? ``scenario``: a Scenario
    (a mapping is parsed once); each setting is it with the one option changed (sim/scenario ``vary``)."""
    from distlab.sim import scenario as sc
    from distlab.sim.analysis import collective_overlap_s
    base = sc.scenario_of(scenario, "what-if")
    rows = []
    for separate in (False, True):
        r = sc.simulate(sc.vary(base, "separate_reduce_scatter_group", separate, "what-if"), "what-if")
        rs = [(o.launch, o.end) for o in r.trace.for_rank(0) if o.op == "reduce_scatter" and o.launch is not None]
        rows.append({"separate_reduce_scatter_group": separate, "step_s": r.summary["step_s"],
                     "ag_rs_overlap_s": collective_overlap_s(r.trace, 0, "backward", "reduce_scatter"),
                     "reduce_scatter_s": sum(b - a for a, b in rs)})
    return rows
