"""Issue 12.4 and 12.12: nccl-tests columns printed row by row, busbw plots, and the small things (--root,
whole elements, absurd sizes, bf16 compression, "rank 0 calls")."""
from __future__ import annotations

import pytest

from distlab.runtime.cli import main
from distlab.sim.errors import ConfigError
from distlab.sim.io import parse_size, parse_size_range
from distlab.sim.plan import Collective, Plan


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc, err, *words):
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


def data_rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip() and not line.startswith(("#", "wrote"))]


def test_collective_prints_nccl_tests_columns(capsys):
    rc, out, err = run(capsys, "collective", "all_reduce", "--sizes", "1KiB:4KiB", "--algo", "ring")
    assert rc == 0, err
    header = [line for line in out.splitlines() if line.startswith("#")]
    names = next(i for i, line in enumerate(header) if line.split()[1:2] == ["size"])    # after the comment
    assert header[names].split()[1:6] == ["size", "count", "type", "redop", "root"]
    assert header[names].split()[-3:] == ["time", "algbw", "busbw"]
    assert "(GB/s)" in header[names + 1] and "(us)" in header[names + 1]
    rows = data_rows(out)
    assert [(int(r[0]), int(r[1]), r[2], r[3], r[4], r[5]) for r in rows] == [
        (1024, 256, "float32", "sum", "-1", "ring"), (2048, 512, "float32", "sum", "-1", "ring"),
        (4096, 1024, "float32", "sum", "-1", "ring")]
    rc, out, err = run(capsys, "collective", "broadcast", "--size", "6B", "--dtype", "float16", "--root", "2")
    assert rc == 0, err
    assert data_rows(out)[0][:5] == ["6", "3", "float16", "none", "2"]


def test_rows_are_printed_as_each_size_finishes(capsys, monkeypatch):
    """The third size fails: the first two rows are already on stdout (nothing waits for the whole sweep)."""
    import distlab.sim.kernel.engine as engine
    real, calls = engine.simulate_collective, []

    def third_fails(op, size, *a, **kw):
        calls.append(size)
        if len(calls) == 3:
            raise ConfigError("stop here", "test")
        return real(op, size, *a, **kw)
    monkeypatch.setattr(engine, "simulate_collective", third_fails)
    rc, out, err = run(capsys, "collective", "all_gather", "--sizes", "1KiB:8KiB")
    assert rc == 2 and "stop here" in err
    assert [int(r[0]) for r in data_rows(out)] == [1024, 2048]


def test_busbw_plot_sizes_auto_zero_and_error_bars():
    from distlab.sim.plots import busbw_figure
    rows = [{"op": "all_reduce", "bytes": b, "algorithm": a, "time_s": 1e-4, "busbw_GBps": b / 1e5}
            for b, a in ((2**10, "tree"), (2**20, "tree"), (2**30, "ring"))]
    fig = busbw_figure(rows, "t", auto=True)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1 KiB", "1 MiB", "1 GiB"]
    assert ax.get_ylim()[0] == 0
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["tree (chosen by auto)", "ring (chosen by auto)"]
    assert not ax.containers                                               # no repeats: no error bars
    measured = [dict(r, time_min_s=0.5e-4, time_max_s=2e-4) for r in rows]
    ax = busbw_figure(measured, "t").axes[0]
    bars, = ax.containers
    segments = bars.lines[2][0].get_segments()
    got = [float(y) for s in segments for y in s[:, 1]]                  # flat: pytest >= 9.2 refuses nested approx
    assert got == pytest.approx([y for r in rows for y in (r["busbw_GBps"] / 2, r["busbw_GBps"] * 2)])  # slow..fast


def test_root_only_for_rooted_collectives(capsys):
    rc, _, err = run(capsys, "collective", "all_reduce", "--root", "1")
    one_line_error(rc, err, "--root", "all_reduce has no root")
    rc, _, err = run(capsys, "collective", "reduce", "--root", "99")
    one_line_error(rc, err, "--root", "outside the world")


def test_whole_elements_and_absurd_sizes(capsys):
    rc, _, err = run(capsys, "collective", "all_reduce", "--size", "6B")
    one_line_error(rc, err, "6 B is not a whole number of float32 elements", "multiples of 4 B")
    rc, _, err = run(capsys, "collective", "all_reduce", "--sizes", "2B:64B")
    one_line_error(rc, err, "--sizes", "2 B is not a whole number of float32 elements")
    rc, _, err = run(capsys, "bench", "--sizes", "1MiB,1000001B", "--nproc", "2")
    one_line_error(rc, err, "1000001 B is not a whole number of float32 elements")
    for text in ("1e40GiB", "1e400B", "2PiB", "1025TiB"):
        with pytest.raises(ConfigError):
            parse_size(text)
    rc, _, err = run(capsys, "collective", "all_reduce", "--size", "1e40GiB")
    one_line_error(rc, err, "larger than 1 PiB")
    assert parse_size("1TiB") == 2**40 and parse_size_range("8B:32B", dtype="float64") == [8, 16, 32]


def test_bf16_compression_as_torchs_hook(capsys):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    assert callable(default_hooks.bf16_compress_hook)                     # what --compress bf16 stands for

    from distlab.sim import models as m
    from distlab.sim.parallel.ddp.plan import DDPOptions, ddp_plan
    model = m.mlp(256, 256, 256)
    plan, info = ddp_plan(model, 2, DDPOptions(compress="bf16", bucket_cap_mb=0.2))
    colls = [o for o in plan.ranks[0] if isinstance(o, Collective)]
    assert {o.dtype for o in colls} == {"bfloat16"}
    assert [o.bytes for o in colls] == [b["bytes"] // 2 for b in info["buckets"]]
    with pytest.raises(ConfigError, match="allowed: fp16, bf16"):
        DDPOptions(compress="int8").validate()
    rc, out, err = run(capsys, "simulate", "--compress", "bf16", "--no-files")
    assert rc == 0, err


def test_bf16_compression_needs_nccl_as_in_torch(tmp_path):
    """torch's DDP refuses bf16_compress_hook without NCCL; the runtime says so before starting ranks."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from distlab.runtime.parallel.ddp.run import measure
    from distlab.sim import models as m
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        with pytest.raises(TypeError, match="NCCL"):
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    finally:
        dist.destroy_process_group()
    with pytest.raises(ConfigError, match="bf16 compression needs NCCL"):
        measure(m.mlp(8, 8), {"compress": "bf16"}, backend="gloo")


def test_check_speaks_of_one_rank_in_the_singular(capsys, tmp_path):
    mismatch, missing = tmp_path / "mismatch.json", tmp_path / "missing.json"
    Plan([[Collective("all_reduce", 1024)], [Collective("broadcast", 1024)]]).save(str(mismatch))
    Plan([[Collective("all_reduce", 1024)], []]).save(str(missing))
    rc, out, _ = run(capsys, "check", mismatch)
    assert rc == 1 and "rank 1 calls broadcast(1 KiB, root 0); rank 0 calls all_reduce(1 KiB)" in out
    rc, out, _ = run(capsys, "check", missing)
    assert rc == 1 and "would hang: rank 0 waits in all_reduce #0 on group [0,1]; rank 1 never calls it" in out
