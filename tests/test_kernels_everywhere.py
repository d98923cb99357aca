"""Every builder prices a transformer's layers by their kernels (issue 39.1, sim/parallel/layers.py
``kernel_layers``): DDP, FSDP2 / HSDP / ZeRO, every pipeline schedule, TP, CP, EP and a composition, on every
shipped model (the MoE presets included), leave no FLOPs in ops without GEMM shapes or an attention call, but
AdamW's memory-bound update, whose time is its bytes on every GPU preset; and on every shipped GPU preset no
builder's step says its compute is an upper bound for want of kernel shapes. Plans are GPU-independent, so they
are checked once per builder x model (4 layers, 1,024 tokens: the shapes of the preset); the notes are checked
on a simulated step of each builder on every GPU preset."""
import pytest

from distlab.sim import scenario as sc
from distlab.sim.cluster import PRESETS
from distlab.sim.compute.fitted import constants
from distlab.sim.compute.kernels import hbm_Bps, kernel_model, launch_s, op_seconds
from distlab.sim.errors import ConfigError
from distlab.sim.models.presets import preset_names
from distlab.sim.plan import Compute

GPU_CLUSTERS = sorted({c.gpu.name: name for name, c in sorted(PRESETS.items(), reverse=True)
                       if c.gpu.arch != "cpu"}.values())          # one cluster preset per GPU preset
BUILDERS = {
    "ddp": {"ddp": {}, "world_size": 2},
    "ddp-grad-accum": {"ddp": {"grad_accum": 2}, "world_size": 2},
    "fsdp": {"mesh": {"dp_shard": 2}, "fsdp": {}, "world_size": 2},
    "hsdp": {"mesh": {"dp_replicate": 2, "dp_shard": 2}, "fsdp": {}, "world_size": 4},
    "zero1": {"mesh": {"dp_shard": 2}, "fsdp": {"zero": 1}, "world_size": 2},
    "pipeline": {"mesh": {"pp": 2}, "pipeline": {"schedule": "1f1b", "microbatches": 2}, "world_size": 2},
    "tp": {"mesh": {"tp": 2}, "tp": {}, "world_size": 2},
    "cp": {"mesh": {"cp": 2}, "cp": {}, "world_size": 2},
    "cp-alltoall-full": {"mesh": {"cp": 2}, "cp": {"rotate_method": "alltoall", "recompute": "full"},
                         "world_size": 2},
    "ep": {"mesh": {"ep": 2}, "ep": {}, "world_size": 2},
    "pp-fsdp-cp-tp": {"mesh": {"pp": 2, "dp_shard": 2, "cp": 2, "tp": 2}, "world_size": 16},
    "grad-accum-fsdp": {"mesh": {"pp": 1, "dp_shard": 2}, "pipeline": {"microbatches": 2},
                        "fsdp": {"reshard_after_forward": False}, "world_size": 2},
}
SCHEDULES = {"gpipe": 1, "1f1b": 1, "interleaved": 2, "zbh1": 1, "zbv": 2, "dualpipev": 2, "loopedbfs": 2}


def model(name: str) -> dict:
    return {"preset": name, "layers": 4, "seq_len": 1024, "micro_batch": 1}


def flops_without_kernels(plan) -> list:
    """(op name, FLOPs) of every Compute with FLOPs but neither GEMMs nor an attention call (AdamW apart)."""
    return [(o.name, o.flops) for ops in plan.ranks for o in ops if isinstance(o, Compute) and o.flops
            and o.seconds is None and not o.gemms and o.attention is None and not o.name.startswith("optimizer")]


def test_every_builder_on_every_model_prices_kernels():
    built = {b: 0 for b in BUILDERS}
    for name in preset_names():
        for builder, d in BUILDERS.items():
            try:
                plan = sc.build({"model": model(name), "cluster": "dgx-h100", **d}, f"{builder} x {name}").plan
            except ConfigError as e:                   # refused with one line: TP/CP of an MoE, EP of a dense model
                assert any(w in str(e) for w in ("experts", "structure", "divide")), (builder, name, str(e))
                continue
            built[builder] += 1
            assert flops_without_kernels(plan) == [], (builder, name)
            adamw = [o for o in plan.ranks[0] if isinstance(o, Compute) and o.name.startswith("optimizer")]
            for cluster in GPU_CLUSTERS:                # AdamW: its bytes, never its FLOPs at a GEMM rate
                gpu = PRESETS[cluster].gpu
                for o in adamw:
                    kernels = 1 if o.launches is None else o.launches
                    assert op_seconds(o, gpu) == pytest.approx(o.bytes / hbm_Bps(gpu) + kernels * launch_s(gpu))
    assert all(built.values()), built
    assert built["ep"] == 2 and built["fsdp"] == len(preset_names())      # both MoE presets, every model


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_every_pipeline_schedule_prices_kernels(schedule):
    for name in ("llama3-8b", "mixtral-8x7b"):
        d = {"model": model(name), "cluster": "dgx-h100", "mesh": {"pp": 2}, "world_size": 2,
             "pipeline": {"schedule": schedule, "microbatches": 4, "virtual_stages": SCHEDULES[schedule]}}
        plan = sc.build(d, schedule).plan
        assert flops_without_kernels(plan) == [], (schedule, name)
        assert any(o.gemms for o in plan.ranks[0] if isinstance(o, Compute))


@pytest.mark.parametrize("cluster", GPU_CLUSTERS)
def test_no_gpu_preset_hears_of_an_upper_bound(cluster):
    for builder, d in BUILDERS.items():
        name = "mixtral-8x7b" if builder == "ep" else "llama3-8b"
        m = {**model(name), "layers": 2}
        if builder == "pp-fsdp-cp-tp":
            d = {**d, "mesh": {"pp": 2, "dp_shard": 1, "cp": 2, "tp": 2}, "world_size": 8}
        if cluster.startswith("gb200") and d["world_size"] % 4:      # GB200 jobs are whole compute trays of 4
            d = {**d, "world_size": 2 * d["world_size"]}
            if "dp_shard" in d.get("mesh", {}):
                d = {**d, "mesh": {**d["mesh"], "dp_shard": 2 * d["mesh"]["dp_shard"]}}
        s = sc.simulate({"model": m, "cluster": cluster, **d}, f"{builder} on {cluster}").summary
        notes = [n for n in s["compute_notes"] if "upper bound" in n or "without kernel shapes" in n]
        generation = kernel_model(PRESETS[cluster].gpu).generation
        if not constants(generation).fitted_on:       # a generation nothing was fitted on says that (issue 39.4)
            notes = [n for n in notes if "no published row fitted" not in n and "no published MFU" not in n]
        assert notes == [], (builder, cluster, notes)
