"""The FP8 recipe as a key of scenarios (``fp8_recipe``) and a flag of `distlab simulate` (``--fp8-recipe``): it
prices the float8 GEMMs as sim/compute/fp8.py says that recipe runs them, the YAML key and the flag give one
answer, and a recipe the GPU cannot run is one line naming the key or the flag, exit 2 (issue 39 item 3)."""
import json

import pytest
import yaml

from cli_in_process import cli  # noqa: F401 (the fixture)
from distlab.sim import scenario as sc

FP8 = {"model": {"preset": "llama3-8b", "layers": 2, "seq_len": 2048, "micro_batch": 1}, "mesh": {"dp_shard": 8},
       "fsdp": {"param_dtype": "float8_e4m3fn"}, "cluster": "dgx-h100", "nodes": 1}


def compute_s(recipe=None) -> float:
    return sc.simulate({**FP8, **({"fp8_recipe": recipe} if recipe else {})}).summary["compute_s"]


def test_the_recipe_prices_the_float8_gemms():
    """TE's delayed scaling (one fused cast-transpose per tensor) is cheaper than torchao's tensorwise casts (the
    default), and torchao's rowwise (a slower GEMM and a rescale pass) dearer."""
    default, delayed, tensorwise, rowwise = (compute_s(r) for r in (None, "te-delayed", "torchao-tensorwise",
                                                                     "torchao-rowwise"))
    assert default == tensorwise
    assert delayed < tensorwise < rowwise


def test_the_key_and_the_flag_give_one_answer(cli, tmp_path):
    path = tmp_path / "fp8.yaml"
    path.write_text(yaml.safe_dump({**FP8, "fp8_recipe": "te-current"}))
    rc, out, err = cli("simulate", str(path), "--json", "--no-files")
    assert rc == 0, err
    by_key = json.loads(out)
    path.write_text(yaml.safe_dump(FP8))
    rc, out, err = cli("simulate", str(path), "--fp8-recipe", "te-current", "--json", "--no-files")
    assert rc == 0, err
    by_flag = json.loads(out)
    step = by_key["results"][0]["step_s"]
    assert step == by_flag["results"][0]["step_s"]
    assert step != pytest.approx(sc.simulate(FP8).summary["step_s"], rel=1e-3)


@pytest.mark.parametrize("change,how,words", [
    ({"cluster": "dgx-a100"}, "te-delayed", ["needs FP8 tensor cores", "a100 has none"]),
    ({}, "mxfp8", ["needs Blackwell", "te-delayed"]),
    ({}, "fp4", ["unknown fp8_recipe 'fp4'", "te-current", "torchao-rowwise"]),
])
@pytest.mark.parametrize("as_flag", [False, True])
def test_a_recipe_the_gpu_cannot_run_is_one_line_exit_2(cli, tmp_path, change, how, words, as_flag):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**FP8, **change, **({} if as_flag else {"fp8_recipe": how})}))
    rc, out, err = cli("simulate", str(path), "--no-files", *(("--fp8-recipe", how) if as_flag else ()))
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert ("--fp8-recipe:" if as_flag else "fp8_recipe:") in err and all(w in err for w in words), err
