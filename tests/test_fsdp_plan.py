"""The fsdp plan builder: FSDP2's collective order and bytes (padding, mixed precision, HSDP, reshard, ZeRO
stages), that every variant simulates, and bad input as one line with exit code 2."""
import pytest

from distlab.sim.kernel.engine import simulate
from distlab.sim.errors import ConfigError
from distlab.sim.parallel.fsdp.plan import build_fsdp, collective_sequence, padded_numel, units_of
from distlab.sim.models import gpt, mlp
from distlab.sim.plan import Collective

from conftest import one_node, multi_node
from cli_in_process import cli  # noqa: F401 - the fixture: `distlab ARGS` in this process (no interpreter start)

TINY = gpt(layers=3, hidden=16, heads=2, seq_len=8, vocab=51, micro_batch=2, dtype="float32", arch="llama")
ROOT = (52 * 16 + 16 + 52 * 16) * 4          # embed 51->52 rows (padded to 2 ranks), norm_f, lm_head 51->52
BLOCK = (4 * 16 * 16 + 3 * 64 * 16 + 2 * 16) * 4     # q k v o, gate up down, two norms: 16512 bytes


def seq(plan, rank=0):
    return [(op, b) for op, b, _ in collective_sequence(plan, rank)]


def test_units_root_first_then_blocks():
    units = units_of(TINY)
    assert [u.name for u in units] == ["root", "h.0", "h.1", "h.2"]
    assert [p.name for p in units[0].params] == ["embed.tok.weight", "norm_f.weight", "lm_head.weight"]
    assert units_of(mlp(4, 4, 4))[0].params == []          # a root without parameters issues nothing


def test_default_sequence_and_padded_bytes():
    assert ROOT == 6720 and BLOCK == 16512        # as captured from real fully_shard (tests/test_fsdp_runtime.py)
    AG, RS = "all_gather", "reduce_scatter"
    assert seq(build_fsdp(TINY, 2)) == [(AG, ROOT), (AG, BLOCK), (AG, BLOCK), (AG, BLOCK),
                                        (AG, BLOCK), (AG, BLOCK), (RS, BLOCK), (AG, BLOCK), (RS, BLOCK),
                                        (RS, BLOCK), (RS, ROOT)]


def test_no_reshard_after_forward_skips_backward_all_gathers():
    AG, RS = "all_gather", "reduce_scatter"
    assert seq(build_fsdp(TINY, 2, {"reshard_after_forward": False})) == (
        [(AG, ROOT)] + [(AG, BLOCK)] * 3 + [(RS, BLOCK)] * 3 + [(RS, ROOT)])


def test_mixed_precision_gathers_in_param_dtype_reduces_in_reduce_dtype():
    s = collective_sequence(build_fsdp(TINY, 2, {"param_dtype": "bfloat16", "reduce_dtype": "float32"}))
    assert {(op, d) for op, _, d in s} == {("all_gather", "bfloat16"), ("reduce_scatter", "float32")}
    assert s[0][1] == ROOT // 2 and s[-1][1] == ROOT


def test_backward_prefetch_depth_moves_all_gathers_earlier():
    ops = [op for op, _ in seq(build_fsdp(TINY, 2, {"backward_prefetch": 2}))]
    assert ops[4:] == ["all_gather", "all_gather", "all_gather", "reduce_scatter", "reduce_scatter",
                       "reduce_scatter", "reduce_scatter"]


def test_padding_to_a_multiple_of_the_shard_group():
    assert padded_numel((51, 16), 4) == 52 * 16 and padded_numel((16,), 3) == 18 and padded_numel((8, 2), 8) == 16
    plan = build_fsdp(TINY, 3)
    assert seq(plan)[0] == ("all_gather", (51 * 16 + 18 + 51 * 16) * 4)      # 51 rows divide by 3; 16 -> 18


def test_hsdp_shards_in_groups_and_all_reduces_across_replicas():
    plan = build_fsdp(TINY, 8, {"shard_size": 4})
    cols = [o for o in plan.ranks[5] if isinstance(o, Collective)]
    assert {o.group for o in cols if o.op != "all_reduce"} == {(4, 5, 6, 7)}
    ars = [o for o in cols if o.op == "all_reduce"]
    assert [o.group for o in ars] == [(1, 5)] * 4
    rs = [o for o in cols if o.op == "reduce_scatter"]
    assert [a.bytes * 4 for a in ars] == [r.bytes for r in rs]


def test_reshard_to_a_smaller_group_gathers_backward_within_it():
    plan = build_fsdp(TINY, 8, {"reshard_after_forward": 2})
    ags = [o for o in plan.ranks[3] if isinstance(o, Collective) and o.op == "all_gather"]
    assert {o.group for o in ags if o.name.endswith("backward")} == {(2, 3)}
    assert {o.group for o in ags if o.name.endswith("forward")} == {tuple(range(8))}
    assert build_fsdp(TINY, 8, {"reshard_after_forward": 8}).meta["reshard_after_forward"] is True


def test_zero_stages_1_and_2():
    for z in (1, 2):
        plan = build_fsdp(TINY, 2, {"zero": z})
        ops = plan.ranks[0]
        kinds = [(o.op, o.name.split()[-1]) for o in ops if isinstance(o, Collective)]
        assert [k for k in kinds if k[0] == "all_gather"] == [("all_gather", "update")] * 4
        assert sum(1 for k in kinds if k[0] == "reduce_scatter") == 4
        last_bwd = max(i for i, o in enumerate(ops) if getattr(o, "name", "").startswith("bwd "))
        first_rs = min(i for i, o in enumerate(ops) if isinstance(o, Collective) and o.op == "reduce_scatter")
        assert (first_rs > last_bwd) == (z == 1)      # ZeRO-1 reduces after backward, ZeRO-2 during it


@pytest.mark.parametrize("opts", [{}, {"reshard_after_forward": False}, {"zero": 1}, {"zero": 2},
                                  {"shard_size": 4}, {"reshard_after_forward": 2}, {"prefetch": 0},
                                  {"backward_prefetch": 3, "prefetch": 2}, {"param_dtype": "bfloat16"}])
def test_every_variant_simulates(opts):
    model = gpt(layers=4, hidden=256, heads=4, seq_len=128, vocab=1000, micro_batch=2, arch="llama")
    trace = simulate(build_fsdp(model, 8, opts), multi_node(2, 4), record_transfers=False)
    serial = simulate(build_fsdp(model, 8, {**opts, "overlap": False}), multi_node(2, 4), record_transfers=False)
    assert 0 < trace.makespan <= serial.makespan * 1.0001


def test_overlap_hides_communication():
    from distlab.sim.result import step_summary as summarize
    model = gpt(layers=4, hidden=1024, heads=8, seq_len=2048, vocab=1000, micro_batch=8, arch="llama")
    s = summarize(simulate(build_fsdp(model, 8), one_node(8), record_transfers=False))
    assert s["overlap_pct"] > 50


@pytest.mark.parametrize("opts,where", [({"zero": 4}, "zero"), ({"zero": "3"}, "zero"),
                                        ({"shard_size": 3}, "shard_size"),
                                        ({"reshard_after_forward": 3}, "reshard_after_forward"),
                                        ({"param_dtype": "fp8"}, "param_dtype"), ({"bucket": 1}, "parallelism")])
def test_bad_options_are_config_errors(opts, where):
    with pytest.raises(ConfigError) as e:
        build_fsdp(TINY, 8, opts)
    assert where in str(e.value) and "\n" not in str(e.value)


def _scenario(tmp_path, par, cluster="dgx-h100", model="{preset: gpt2-small, micro_batch: 2}"):
    p = tmp_path / "s.yaml"
    p.write_text(f"model: {model}\nparallelism: {par}\ncluster: {cluster}\n")
    return str(p)


def test_cli_simulate_fsdp(cli, tmp_path):
    rc, out, err = cli("simulate", _scenario(tmp_path, "{kind: fsdp, zero: 3}"), "--out", str(tmp_path / "o"))
    assert rc == 0, err
    for text in ("step time", "exposed communication", "peak memory", "activations", "fits the GPU"):
        assert text in out
    assert (tmp_path / "o" / "timeline.png").stat().st_size > 0


def test_cli_flags_what_does_not_fit(cli, tmp_path):
    rc, out, _ = cli("simulate", _scenario(tmp_path, "{kind: fsdp, zero: 1}", model="llama-70b"), "--no-files")
    assert rc == 0 and "warning: does not fit" in out and "optimizer" in out


@pytest.mark.parametrize("par,text", [("{kind: fsdp, shard_size: 3}", "shard group size 3 must divide"),
                                      ("{kind: fsdp, zero: 5}", "unknown ZeRO stage 5")])
def test_cli_bad_input_one_line_exit_2(cli, tmp_path, par, text):
    rc, out, err = cli("simulate", _scenario(tmp_path, par), "--no-files")
    assert rc == 2 and text in err and len(err.strip().splitlines()) == 1
