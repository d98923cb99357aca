"""The plans of the compositions that existed before the parallelisms became transforms (sim/parallel/
parallelize.py): TP alone, FSDP2 x TP, HSDP x TP, DDP x TP, PP x TP (x DP), CP (x TP x FSDP2 x HSDP) and the
shipped tp/cp scenarios, each built through the API it had then (tp_plan, fsdp_tp_plan, ddp_tp_plan, pp_tp_plan,
cp_plan, scenario.build). tests/data/golden_compose.json holds the sha256 of each plan's JSON, saved at commit
afb5856 before the change; tests/test_golden_compose.py compares. Small models: building them all takes ~1 s."""
from __future__ import annotations

from distlab.sim.cluster import load_cluster
from distlab.sim.mesh import Mesh
from distlab.sim.models import gpt

LLAMA = gpt(layers=2, hidden=32, heads=8, kv_heads=4, seq_len=8, vocab=128, micro_batch=2, dtype="float32",
            arch="llama", ffn_hidden=64)
LLAMA6 = gpt(layers=6, hidden=32, heads=8, kv_heads=4, seq_len=16, vocab=128, micro_batch=1, arch="llama",
             ffn_hidden=64, dtype="bfloat16")
GPT2 = gpt(layers=2, hidden=64, heads=4, seq_len=16, vocab=256, micro_batch=2, dtype="float32", arch="gpt2")
LLAMA8 = gpt(layers=4, hidden=64, heads=8, kv_heads=8, seq_len=16, vocab=128, micro_batch=1, arch="llama",
             ffn_hidden=128, dtype="bfloat16")
CP_MODEL = gpt(layers=2, hidden=64, heads=8, kv_heads=4, seq_len=64, vocab=128, micro_batch=1, arch="llama",
               ffn_hidden=128, dtype="bfloat16")


def _tp(mesh, model=LLAMA, **kw):
    from distlab.sim.parallel.tp.plan import TPOptions, tp_plan
    return tp_plan(model, Mesh(mesh), TPOptions(**kw))


def _fsdp_tp(mesh, model=LLAMA, cluster=None, fsdp=None, **kw):
    from distlab.sim.parallel.fsdp.plan import FSDPOptions
    from distlab.sim.parallel.tp.compose import fsdp_tp_plan
    from distlab.sim.parallel.tp.plan import TPOptions
    return fsdp_tp_plan(model, Mesh(mesh), FSDPOptions(**(fsdp or {})), TPOptions(**kw), cluster=cluster)


def _ddp_tp(mesh, model=LLAMA, ddp=None, **kw):
    from distlab.sim.parallel.ddp.plan import DDPOptions
    from distlab.sim.parallel.tp.ddp import ddp_tp_plan
    from distlab.sim.parallel.tp.plan import TPOptions
    return ddp_tp_plan(model, Mesh(mesh), DDPOptions(**(ddp or {})), TPOptions(**kw))


def _pp_tp(mesh, spec, model=LLAMA, cluster=None, overhead=0.0, **kw):
    from distlab.sim.parallel.pipeline.plan import PipelineSpec
    from distlab.sim.parallel.tp.pipeline import pp_tp_plan
    from distlab.sim.parallel.tp.plan import TPOptions
    return pp_tp_plan(model, Mesh(mesh), PipelineSpec(**spec), TPOptions(**kw), cluster=cluster, overhead=overhead)


def _cp(mesh, model=CP_MODEL, cluster=None, fsdp=None, **kw):
    from distlab.sim.parallel.cp.plan import CPOptions, cp_plan
    from distlab.sim.parallel.fsdp.plan import FSDPOptions
    return cp_plan(model, Mesh(mesh), CPOptions(**kw), None if fsdp is None else FSDPOptions(**fsdp),
                   cluster=cluster)


def _scenario(path):
    import pathlib

    from distlab.sim import scenario as sc
    root = pathlib.Path(__file__).parent.parent
    return sc.build(sc.load(str(root / "scenarios" / path)), path).plan


def _dgx(nodes):
    return load_cluster("dgx-h100", nodes)


CASES = {
    "tp2-sp": lambda: _tp({"tp": 2}),
    "tp4-plain": lambda: _tp({"tp": 4}, sequence_parallel=False),
    "tp2-sp-loss-parallel": lambda: _tp({"tp": 2}, loss_parallel=True),
    "tp2-plain-loss-parallel": lambda: _tp({"tp": 2}, sequence_parallel=False, loss_parallel=True),
    "tp2-sp-selective": lambda: _tp({"tp": 2}, recompute="selective"),
    "tp4-sp-full": lambda: _tp({"tp": 4}, recompute="full"),
    "tp2-dp2-replicas": lambda: _tp({"dp": 2, "tp": 2}),
    "tp2-gpt2-plain": lambda: _tp({"tp": 2}, model=GPT2, sequence_parallel=False),
    "tp2-gpt2-sp": lambda: _tp({"tp": 2}, model=GPT2),
    "fsdp2-tp2-sp": lambda: _fsdp_tp({"dp_shard": 2, "tp": 2}),
    "fsdp2-tp2-plain": lambda: _fsdp_tp({"dp_shard": 2, "tp": 2}, sequence_parallel=False),
    "fsdp4-tp2-full-noreshard": lambda: _fsdp_tp({"dp_shard": 4, "tp": 2}, recompute="full",
                                                 fsdp={"reshard_after_forward": False}),
    "fsdp2-tp2-bf16-nooverlap": lambda: _fsdp_tp({"dp_shard": 2, "tp": 2}, model=LLAMA6,
                                                 fsdp={"overlap": False, "param_dtype": "bfloat16",
                                                       "reduce_dtype": "float32"}),
    "hsdp1x2-tp2": lambda: _fsdp_tp({"dp_replicate": 1, "dp_shard": 2, "tp": 2}),
    "hsdp2x2-tp2": lambda: _fsdp_tp({"dp_replicate": 2, "dp_shard": 2, "tp": 2}),
    "fsdp8-tp2-relabelled": lambda: _fsdp_tp({"dp_shard": 8, "tp": 2}, model=LLAMA6, cluster=_dgx(2)),
    "hsdp2x8-tp2-relabelled": lambda: _fsdp_tp({"dp_replicate": 2, "dp_shard": 8, "tp": 2}, model=LLAMA6,
                                               cluster=_dgx(4), recompute="full"),
    "ddp2-tp2-sp": lambda: _ddp_tp({"dp": 2, "tp": 2}),
    "ddp2-tp2-plain": lambda: _ddp_tp({"dp": 2, "tp": 2}, sequence_parallel=False),
    "ddp2-tp2-small-buckets-bf16": lambda: _ddp_tp({"dp": 2, "tp": 2}, ddp={"bucket_cap_mb": 0.02,
                                                                             "compress": "bf16"}),
    "pp2-tp2-1f1b-sp": lambda: _pp_tp({"pp": 2, "tp": 2}, {"schedule": "1f1b", "stages": 2, "microbatches": 3}),
    "pp2-tp2-gpipe-plain": lambda: _pp_tp({"pp": 2, "tp": 2}, {"schedule": "gpipe", "stages": 2, "microbatches": 2},
                                          sequence_parallel=False),
    "dp2-pp2-tp2-gpipe": lambda: _pp_tp({"dp": 2, "pp": 2, "tp": 2},
                                        {"schedule": "gpipe", "stages": 2, "microbatches": 2, "data_parallel": 2}),
    "pp3-tp2-interleaved-split": lambda: _pp_tp({"pp": 3, "tp": 2},
                                                {"schedule": "interleaved", "stages": 3, "microbatches": 3,
                                                 "virtual_stages": 2, "split": [1, 1, 1, 1, 1, 1]}, model=LLAMA6),
    "pp4-tp2-uneven-overhead": lambda: _pp_tp({"pp": 4, "tp": 2}, {"stages": 4, "microbatches": 4,
                                                                   "split": [1, 2, 2, 1]}, model=LLAMA6,
                                              overhead=1e-4, recompute="selective"),
    "pp1-tp2-grad-accum": lambda: _pp_tp({"dp": 2, "pp": 1, "tp": 2}, {"stages": 1, "microbatches": 3,
                                                                       "data_parallel": 2, "schedule": "gpipe"}),
    "dp2-pp2-tp8-relabelled": lambda: _pp_tp({"dp": 2, "pp": 2, "tp": 8},
                                             {"schedule": "1f1b", "stages": 2, "microbatches": 2,
                                              "data_parallel": 2}, model=LLAMA8, cluster=_dgx(4)),
    "cp2": lambda: _cp({"cp": 2}),
    "cp2-alltoall-full": lambda: _cp({"cp": 2}, rotate_method="alltoall", recompute="full"),
    "cp2-unbalanced-nooverlap": lambda: _cp({"cp": 2}, load_balance=False, overlap=False),
    "fsdp2-cp2": lambda: _cp({"dp_shard": 2, "cp": 2}),
    "hsdp2x2-cp2": lambda: _cp({"dp_replicate": 2, "dp_shard": 2, "cp": 2}),
    "cp2-tp2": lambda: _cp({"cp": 2, "tp": 2}),
    "fsdp2-cp2-tp2-full": lambda: _cp({"dp_shard": 2, "cp": 2, "tp": 2}, recompute="full"),
    "hsdp2x2-cp2-tp2-relabelled": lambda: _cp({"dp_replicate": 2, "dp_shard": 2, "cp": 2, "tp": 2},
                                              cluster=_dgx(2)),
    "cp2-fsdp-noreshard": lambda: _cp({"dp_shard": 2, "cp": 2}, fsdp={"reshard_after_forward": False}),
    "scenario-tp-cpu": lambda: _scenario("tp-cpu.yaml"),
    "scenario-cp-cpu": lambda: _scenario("cp-cpu.yaml"),
    "scenario-tp-fsdp-llama3-8b": lambda: _scenario("tp-fsdp-llama3-8b.yaml"),
}


def digest(plan) -> str:
    import hashlib
    return hashlib.sha256(plan.to_json().encode()).hexdigest()


if __name__ == "__main__":        # python tests/golden_compose_cases.py > tests/data/golden_compose.json
    import json
    print(json.dumps({name: digest(build()) for name, build in CASES.items()}, indent=1, sort_keys=True))
