"""Issue 43 (first hour, item 1 and 5): a pipeline's micro-batches follow the global batch (``global_batch`` key,
``--global-batch``; sim/scenario/batch.py), refused in one line naming what the user wrote when they do not come
out whole; a YAML ``nodes``/``world_size`` over the limit names the key and the real limit; ``--microbatches``
without a pp dimension names the flag. Sim-only, in this process."""
from __future__ import annotations

import json

import pytest
import yaml

from cli_in_process import run_in_process
from distlab.sim import scenario as sc
from distlab.sim.cluster import MAX_RANKS
from distlab.sim.errors import ConfigError

PIPE = {"model": {"preset": "gpt2-small", "micro_batch": 2}, "mesh": {"pp": 4, "dp_shard": 2}}


def test_a_pipelines_microbatches_follow_the_global_batch():
    s = sc.from_dict({**PIPE, "global_batch": 64})
    assert s.batch.global_batch == 64 and s.parallelisms["pipeline"].microbatches == 64 // (2 * 2)
    assert sc.from_dict(PIPE).parallelisms["pipeline"].microbatches == 2 * 4      # no global batch: 2 x pp x v
    flags = sc.from_dict({**PIPE, "pipeline": {"microbatches": 16}})
    assert flags.parallelisms == s.parallelisms                                   # the same layout either way


def test_the_global_batch_is_printed_and_reaches_the_step(capsys):
    rc, out, err = run_in_process(capsys, "simulate", "--mesh", "pp=4,dp_shard=2", "--micro-batch", "2",
                                  "--global-batch", "64", "--no-files", "--json")
    assert rc == 0, err
    r = json.loads(out)["results"][0]
    assert r["global_batch"] == 64 and r["options"]["pipeline"]["microbatches"] == 16


@pytest.mark.parametrize("extra,words", [
    ({"global_batch": 62}, "is not dp 2 x micro-batch 2 x m; allowed: 16, 20"),
    ({"global_batch": 8}, "= 2 < pp 4"),                             # m = 8 / (2 x 2) < pp
    ({"global_batch": 64, "pipeline": {"microbatches": 4}}, "x microbatches 4 = 16"),
    ({"global_batch": 0}, "from 1 to"),
])
def test_a_global_batch_that_does_not_fit_is_refused_naming_the_key(extra, words):
    with pytest.raises(ConfigError) as e:
        sc.from_dict({**PIPE, **extra})
    assert e.value.where == "scenario: global_batch" and words in str(e.value), str(e.value)


def test_without_a_pipeline_the_global_batch_must_be_what_the_layout_trains():
    ddp = {"model": {"preset": "gpt2-small", "micro_batch": 2}, "ddp": {"grad_accum": 2}, "world_size": 4}
    assert sc.from_dict({**ddp, "global_batch": 16}).batch.global_batch == 16        # 4 x 2 x 2
    with pytest.raises(ConfigError, match="dp 4 x micro-batch 2 x grad_accum 2 = 16"):
        sc.from_dict({**ddp, "global_batch": 12})


FLAG_ERRORS = [  # argv, the flag the error must start with, words it must hold
    (("--mesh", "pp=4,dp_shard=2", "--micro-batch", "2", "--global-batch", "62"), "--global-batch", "x m;"),
    (("--global-batch", "60"), "--global-batch", "is not dp 8 x micro-batch 8"),
    (("--global-batch", "100000000000"), "--global-batch", "allowed: 1 to"),
    (("--microbatches", "8"), "--microbatches", "needs a pp dimension in --mesh"),
    (("--mesh", "dp_shard=8", "--schedule", "gpipe"), "--schedule", "needs a pp dimension in --mesh"),
]


@pytest.mark.parametrize("argv,flag,words", FLAG_ERRORS, ids=lambda x: " ".join(x) if isinstance(x, tuple) else None)
def test_flag_errors_name_the_flag_typed(argv, flag, words, capsys):
    rc, out, err = run_in_process(capsys, "simulate", *argv, "--no-files")
    assert rc == 2 and err.count("\n") == 1, err
    message = err.split(": error: ", 1)[1]
    assert message.startswith(f"{flag}: ") and words in message and "pipeline section" not in message, message
    assert len(err.rstrip("\n")) <= 100, err


@pytest.mark.parametrize("key,value,limit", [("nodes", 100000, MAX_RANKS // 8), ("world_size", 10**12, MAX_RANKS)])
def test_a_yaml_count_over_the_limit_names_the_key_and_the_real_limit(key, value, limit, tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"model": "gpt2-small", "ddp": {}, key: value}))
    rc, out, err = run_in_process(capsys, "simulate", str(path), "--no-files")
    assert rc == 2 and err.count("\n") == 1, err
    assert f"{path}: {key}: {value} is out of range; allowed: 1 to {limit:,}" in err, err


def test_the_report_says_what_set_the_micro_batches(capsys):
    said = {}
    for extra in ((), ("--global-batch", "256"), ("--microbatches", "4")):
        rc, out, err = run_in_process(capsys, "simulate", "--mesh", "pp=4,dp_shard=2", "--no-files", "--json", *extra)
        assert rc == 0, err
        said[extra[:1]] = json.loads(out)["results"][0]["assumptions"].get("microbatches_from")
    assert said == {(): "2 x pp x v", ("--global-batch",): "global_batch", ("--microbatches",): None}
