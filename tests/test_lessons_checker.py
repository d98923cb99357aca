"""The answer checker's hints and units (issues 12.11 and 21): the closest usual factor within 1% names the
mistake, equivalent units are accepted, and a decimal comma is refused with a clear message."""
import pytest

from distlab.sim.lessons import check, question, solution
from distlab.sim.lessons.checker import _factor_hint
from distlab.sim.lessons.units import UnitError, parse


def test_each_prefix_mistake_gets_its_own_hint():
    # 01-ring-bytes is 112 MiB; 117.44 is 112 x 1.048576 (MB read as MiB), 114.69 is 112 x 1.024 (kB/KiB)
    assert "MB against MiB" in check("01-ring-bytes", "117.44 MiB").message
    assert "kB against KiB" in check("01-ring-bytes", "114.69 MiB").message
    # 02-busbw is 323.9 GB/s; 301.7 = 323.9 / 1.0737 (GiB where GB was asked)
    v = check("02-busbw", "301.7 GB/s")
    assert "GB against GiB" in v.message and "MB against MiB" not in v.message
    assert "TB against TiB" in _factor_hint(1.0995, 1.0)
    assert "bits against bytes" in check("03-nic", "3200 GB/s").message


def test_the_closest_factor_wins_and_only_within_one_percent():
    assert "kB against KiB" in _factor_hint(1.024, 1.0) and "MB against MiB" in _factor_hint(1.0486, 1.0)
    assert "GB against GiB" in _factor_hint(1 / 1.0737, 1.0)
    assert _factor_hint(1.036, 1.0) == "off by +4%"          # between kB/KiB and MB/MiB, 1.2% from each
    assert _factor_hint(1.039, 1.0) == "off by +4%"          # 0.9% from MB/MiB: too far to blame the units
    assert _factor_hint(1.5, 1.0) == "off by +50%" and "factor of 2" in _factor_hint(0.5, 1.0)


def test_equivalent_units_are_accepted():
    assert check("02-alpha-beta", "4.77 ms").ok and check("02-alpha-beta", "4770 us").ok
    assert check("02-alpha-beta", "0.00477 s").ok and check("02-alpha-beta", "4.77 msec").ok
    assert check("03-nic", "3200 Gb/s").ok and check("03-nic", "3200 Gbps").ok and check("03-nic", "400 GBps").ok
    assert check("07-memory", "1152 MiB").ok and check("04-error", "0.2x").ok
    v = check("02-alpha-beta", "0.00477 s")
    assert "= 4.77 ms" in v.message
    # a bare number is read in the unit asked for; one that fits another unit is named as such
    assert check("02-alpha-beta", 0.00477).status == "wrong unit"


def test_decimal_commas_are_refused_clearly():
    v = check("02-alpha-beta", "4,77 ms")
    assert v.status == "unreadable" and "decimal point" in v.message and "'4.77'" in v.message
    v = check("01-ring-bytes", "112,000 MiB")                   # 112000 or 112.000?
    assert v.status == "unreadable" and "ambiguous" in v.message and "112.000" in v.message
    with pytest.raises(UnitError, match="ambiguous"):
        parse("1,024 B")
    assert parse("1,048,576 B").value == 2**20 and parse("1,000.5 ms").value == 1000.5
    assert check("01-ring-bytes", "117,440,512 B").ok                # thousands separators: 112 MiB in bytes


def test_solutions_still_check():
    for ex_id in ("01-ring-bytes", "02-busbw", "06-zero3-memory", "06-zero1-memory"):
        assert check(ex_id, solution(ex_id)).ok


def test_a_usual_wrong_answer_is_named():
    """05-buckets asks for bucket_cap_mb=100; the default cap's count gets its own hint (issue 21)."""
    from distlab.sim.parallel.ddp.buckets import ddp_buckets
    from distlab.sim.models import model_from_spec
    default = len(ddp_buckets(model_from_spec("gpt2-medium"), None))
    v = check("05-buckets", default)
    assert v.status == "wrong" and "default cap" in v.message
    assert check("05-buckets", int(solution("05-buckets")) + 2).ok          # a prediction within 2


def test_a_rounded_parameter_count_is_not_blamed_on_units():
    """With Ψ = 7e9 instead of the stated 6.74e9 the answer is 3.9% off: the hint says so, not "GB against GiB"."""
    v = check("06-zero3-memory", f"{16 * 7e9 / 64 / 2**30:.3f} GiB")
    assert v.status == "wrong" and "off by +4%" in v.message and "against" not in v.message
    assert "6.74e9" in question("06-zero3-memory") and "6.74e9" in question("06-zero1-memory")


def test_the_banks_do_not_import_the_registry():
    """One-way (issue 30 item 5): sim/lessons/exercises.py imports the banks, no bank imports it (nor the package,
    whose __init__ imports it), and nothing loads a module by name to dodge that."""
    import ast
    from pathlib import Path

    from distlab.sim.lessons.exercises import BANKS
    for module in BANKS:
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ("distlab.sim.lessons.exercises", "distlab.sim.lessons"), \
                    f"{module.__name__} imports {node.module}"
            if isinstance(node, ast.Import):
                assert all(a.name != "distlab.sim.lessons.exercises" for a in node.names), module.__name__
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
                raise AssertionError(f"{module.__name__} loads a module by name")
    exercises_src = (Path(BANKS[0].__file__).parent / "exercises.py").read_text(encoding="utf-8")
    assert "import_module" not in exercises_src and "__import__" not in exercises_src


def test_an_exercise_without_measurements_is_computed_once():
    """sim/lessons/exercises.py: an expected value (and the usual wrong values) taking no measurement is computed
    at its first check and kept; one given measurements is computed every time, from what it is given."""
    from distlab.sim.lessons.exercises import _once, get
    calls = []
    value = _once(lambda **given: calls.append(given) or len(calls))
    assert value() == 1 and value() == 1 and calls == [{}]
    assert value(row=2) == 2 and value(row=3) == 3 and value() == 1          # with arguments: passed through
    kept = get("05-no-sync")
    assert kept.expected() == kept.expected() == int(solution("05-no-sync")) and get("05-no-sync") is kept
    assert check("02-your-busbw", "1 GB/s", row={"op": "all_reduce", "world_size": 2, "bytes": 2**20,
                                                  "time_s": 1e-3}).ok                        # 1.05 GB/s measured
    assert not check("02-your-busbw", "1 GB/s", row={"op": "all_reduce", "world_size": 2, "bytes": 2**20,
                                                      "time_s": 2e-3}).ok                    # 0.52 GB/s measured
