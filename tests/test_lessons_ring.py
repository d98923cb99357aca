"""Lesson 01's hand-written ring all-reduce (the notebook's own cell, torch.tensor_split) is right for every
tensor length 1-17 on n = 2-5 real gloo ranks (issue 21, fact 4), where x.chunk(n) returns fewer than n chunks."""
import json
import os

import pytest

torch = pytest.importorskip("torch")

LESSON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lessons",
                      "01_processes_and_collectives.ipynb")
LENGTHS = list(range(1, 18))


def ring_source() -> str:
    """The code of lesson 01's `%%writefile work/my_ring.py` cell, as a learner runs it."""
    with open(LESSON, encoding="utf-8") as f:
        cells = json.load(f)["cells"]
    (src,) = ["".join(c["source"]) for c in cells if "".join(c["source"]).startswith("%%writefile work/my_ring.py")]
    return src.split("\n", 1)[1]


def test_chunk_can_return_fewer_chunks_than_asked_and_tensor_split_cannot():
    short = {k for k in LENGTHS for n in range(2, 6) if len(torch.zeros(k).chunk(n)) < n}
    assert {5, 6, 9} <= short                                     # the examples for n = 4
    assert all(len(torch.tensor_split(torch.zeros(k), n)) == n for k in LENGTHS for n in range(2, 6))
    code = [line.split("#")[0] for line in ring_source().splitlines()]
    assert any("tensor_split" in c for c in code) and not any(".chunk(" in c for c in code)


@pytest.mark.slow
def test_the_lesson_ring_matches_all_reduce_for_every_length(tmp_path):
    """One launch of 5 gloo ranks runs the ring on its first n ranks for n = 2..5, every length 1-17."""
    from distlab.runtime.lessons import check_all_reduce
    path = tmp_path / "my_ring.py"
    path.write_text(ring_source())
    rows = check_all_reduce(f"{path}:ring_all_reduce", nproc=5, numel=LENGTHS, world_sizes=[2, 3, 4, 5])
    assert sorted((r["world_size"], r["numel"], r["rank"]) for r in rows) == \
        [(n, k, r) for n in range(2, 6) for k in LENGTHS for r in range(n)]
    bad = [(r["world_size"], r["numel"], r["rank"], r["max_abs_error"]) for r in rows if not r["ok"]]
    assert not bad, f"ring all-reduce wrong for (ranks, length, rank, error) {bad}"
    assert all(r["sends"] == r["recvs"] == 2 * (r["world_size"] - 1) for r in rows)

