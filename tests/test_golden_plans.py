"""The plans of the shipped scenarios (and HSDP, reshard-to-a-group, ZeRO 1/2, pipeline+DP variants) are
byte-identical to the plans the builders produced before the device mesh and the workload registry
(tests/data/golden_plans.json: each scenario and the sha256 of its plan's JSON, saved before the change).
Changed on purpose since (issue 21, fact 21): pipeline-gpt2, pipeline-gpt2-1f1b-dp2, pipeline-gpt2-gpipe and
pipeline-gpt2-zbh1 now all-reduce GPT-2's tied embedding gradient between the first and last stage's ranks
(sim/parallel/pipeline/tied.py); pipeline-gpt2-zbv is unchanged (its V puts both stages on rank 0). Issue 29:
fsdp-llama-7b-reshard8's backward all-gathers name their process group ("post_forward h.N": FSDP2 makes a
DeviceMesh per fully_shard call with an int reshard_after_forward): its digest was saved again (only the
names differ).
Changed on purpose since (issue 29.4, the activation memory of the models people train, sim/models/activations.py;
tests/test_activations.py, tests/test_activations_torch.py): every plan of a transformer (ddp-gpt2-small,
default, ddp-llama-70b, fsdp-cpu, the fsdp-llama-7b family, the gpt2 pipelines) differs from before only in the
activation bytes: the ``bytes`` of each layer's forward and backward compute op, the FSDP plans' activation memory
events (plus one event: the head's logits held during its backward) and the pipelines' per-stage
``activation_bytes``; the collectives, the ops and their order are unchanged. The MLP plans (ddp-cpu,
pipeline-cpu) are unchanged.
Changed on purpose since (issue 28, float32 priced as float32; tests/test_compute_dtype.py): the compute ops of
float32 models (ddp-cpu, ddp-gpt2-small, default, fsdp-cpu, pipeline-cpu and the gpt2 pipelines) carry
``"dtype": "float32"``, the dtype their matmuls run in; with that key removed every plan equals the one before
(checked op by op over all plans and composed cases).
Changed on purpose since (issue 43.1, the default trains in bf16): scenarios/ddp-gpt2-small.yaml and `distlab
simulate`'s default set DDP's ``autocast: bfloat16``; the golden default is the plan without it, and with it only
the compute ops' dtype and the recorded options differ (checked below). A plan without autocast records no
``autocast`` key, so every plan from before is byte-identical.
Changed on purpose since (issue 39.1, one compute model in every builder: sim/parallel/layers.py ``kernel_layers``;
tests/test_kernels_everywhere.py): every plan of a transformer built by DDP, FSDP2 / ZeRO / HSDP or the pipeline
(ddp-gpt2-small, ddp-llama-70b, default, fsdp-cpu, the fsdp-llama-7b family, the gpt2 pipelines) runs each layer
as TP's segments on one rank: its one FLOPs-and-bytes op became the layer's kernels (GEMMs by shape,
FlashAttention, memory-bound norms, embedding and loss; a pipeline action's ops are named after it, "0F1 fwd
h.0.attn"), and FSDP2's AdamW runs on DTensors (``launches``); the collectives, their order and sizes are
unchanged. The MLP plans (ddp-cpu, pipeline-cpu) are unchanged."""
import hashlib
import json
import pathlib

import pytest

from distlab.sim import scenario as sc

GOLDEN = json.loads((pathlib.Path(__file__).parent / "data" / "golden_plans.json").read_text())


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_plan_is_byte_identical_to_before(name):
    plan = sc.build(GOLDEN[name]["scenario"], name).plan
    assert hashlib.sha256(plan.to_json().encode()).hexdigest() == GOLDEN[name]["plan_sha256"]


SCENARIOS = pathlib.Path(__file__).parent.parent / "scenarios"
SHIPPED = sorted(p.stem for p in SCENARIOS.glob("*.yaml") if p.stem in GOLDEN)     # those from before the change


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_scenarios_in_the_new_format_give_the_golden_plans(name):
    """scenarios/*.yaml are written with mesh: and a section per parallelism; their plans equal the plans of
    the old-format scenarios saved before the change."""
    path = pathlib.Path(__file__).parent.parent / "scenarios" / f"{name}.yaml"
    assert "parallelism:" not in path.read_text()
    d = sc.load(str(path))
    d["cluster"] = GOLDEN[name]["scenario"]["cluster"]
    autocast = (d.get("ddp") or {}).pop("autocast", None)     # issue 43: ddp-gpt2-small trains under bf16 autocast
    plan = sc.build(d, name).plan
    assert hashlib.sha256(plan.to_json().encode()).hexdigest() == GOLDEN[name]["plan_sha256"]
    if autocast:                    # with it, only the compute ops' dtype and the recorded options differ
        d["ddp"]["autocast"] = autocast
        mixed = json.loads(sc.build(d, name).plan.to_json())
        before = json.loads(plan.to_json())
        assert mixed["meta"]["options"] == {**before["meta"]["options"], "autocast": autocast}
        # bfloat16 is not written; a kernel op's bytes are its operands' in the dtype it runs in (issue 39.1)
        bare = lambda op: {k: v for k, v in op.items() if k not in ("dtype", "bytes")}  # noqa: E731
        halved = 0
        for r0, r1 in zip(before["ranks"], mixed["ranks"]):
            assert len(r0) == len(r1)
            for a, b in zip(r0, r1):
                if a["kind"] == "compute" and a.get("dtype") == "float32":
                    assert bare(a) == bare(b) and b.get("dtype", "bfloat16") == autocast
                    assert b.get("bytes", 0) <= a.get("bytes", 0)
                    halved += b.get("bytes", 0) < a.get("bytes", 0)
                else:
                    assert a == b
        assert halved, "autocast moved no operand to 16 bits"
