"""Runtime side of DDP: model extraction and construction, and one short predicted-vs-measured run."""
import pytest

torch = pytest.importorskip("torch")

from distlab.runtime.modules.bridge import build_module, example_input, extract  # noqa: E402
from distlab.sim import models as m  # noqa: E402
from distlab.sim.parallel.ddp.buckets import ddp_buckets  # noqa: E402

# the modules run in this process on one intra-op thread (tests/conftest.py one_torch_thread): their parameters,
# ready order and FLOPs do not depend on threads
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_extract_matches_the_sim_mlp():
    model = m.mlp(64, 128, 32, batch=16)
    module = build_module(model)
    got = extract(module, example_input(model))
    assert [(p.name, p.shape) for p in got.params] == [(p.name, p.shape) for p in model.params]
    assert got.ready == model.ready_order()
    assert [layer.fwd_flops for layer in got.layers] == [layer.fwd_flops for layer in model.layers]
    assert [layer.bwd_flops for layer in got.layers] == [layer.bwd_flops for layer in model.layers]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_built_transformer_has_the_described_params_and_ready_order(arch):
    model = m.gpt(layers=2, hidden=32, heads=4, seq_len=8, vocab=50, arch=arch, kv_heads=2, dtype="float32")
    module = build_module(model)
    assert sum(p.numel() for p in module.parameters()) == model.num_params
    got = extract(module, example_input(model))
    assert got.ready == model.ready_order()          # the order DDP rebuilds buckets in


def test_extract_dedups_shared_and_skips_frozen():
    lin = torch.nn.Linear(8, 8)
    net = torch.nn.Sequential(lin, torch.nn.ReLU(), lin, torch.nn.Linear(8, 4))
    net[3].bias.requires_grad_(False)
    got = extract(net, torch.randn(2, 8))
    assert [p.name for p in got.params] == ["0.weight", "0.bias", "3.weight"]
    assert len(ddp_buckets(got)) == 1


@pytest.mark.slow
def test_validate_ddp_short_run():
    from distlab.runtime.parallel.ddp.validate import validate_ddp
    scenario = {"model": {"kind": "mlp", "widths": [256] * 5, "batch": 32},
                "parallelism": {"kind": "ddp", "bucket_cap_mb": 0.3}, "cluster": "localhost-cpu"}
    r = validate_ddp(scenario, nproc=2, steps=2, warmup=1)
    assert r["buckets_match"] and len(r["measured_buckets"]) == 2
    whats = [row["what"] for row in r["rows"]]
    assert whats[:3] == ["step", "forward", "backward"] and "bucket 1 launch" in whats
    assert all(row["measured_s"] > 0 and row["predicted_s"] > 0 for row in r["rows"])
    measured = r["measured"]
    assert {o.name for o in measured.ops if o.kind == "collective"} == {"bucket 0", "bucket 1"}
    assert measured.meta["source"] == "measured" and r["predicted"].meta["source"] == "simulated"
    probe = r["results"][0]["interference"]      # runtime/measure/compute_probe.py, one round per step: on the cluster
    assert probe["interference_rounds"] == 3 and r["cluster"].interference == round(probe["interference"], 3)
    assert r["cluster"].comm_interference == round(probe["comm_interference"], 3) >= 1
