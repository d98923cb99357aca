"""Golden plans of the compositions built before the parallelisms became transforms (tests/golden_compose_cases.py):
every plan is byte-identical to the one saved before the change (tests/data/golden_compose.json)."""
import json
import pathlib

import pytest

from golden_compose_cases import CASES, digest

GOLDEN = json.loads((pathlib.Path(__file__).parent / "data" / "golden_compose.json").read_text())


def test_every_case_has_a_golden_digest():
    assert set(GOLDEN) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_composed_plan_is_byte_identical_to_before(name):
    assert digest(CASES[name]()) == GOLDEN[name]
