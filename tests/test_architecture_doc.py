"""docs/architecture.md names every package of the tree, once, and its table is the one the imports give today
(scripts/architecture.py writes it, and the picture, from the code)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "architecture.md").read_text()
spec = importlib.util.spec_from_file_location("architecture", ROOT / "scripts" / "architecture.py")
architecture = importlib.util.module_from_spec(spec)
spec.loader.exec_module(architecture)


def test_every_package_has_its_paragraph_and_no_paragraph_names_a_package_that_is_gone():
    paragraphs = re.findall(r"^\*\*([\w/ ]+)\*\*: ", DOC, re.M)
    assert sorted(paragraphs) == sorted(architecture.package_names())
    assert len(paragraphs) == len(set(paragraphs))


def test_the_table_lists_the_same_packages_and_the_picture_is_there():
    rows = re.findall(r"^\| ([\w/ ]+) \| ", DOC, re.M)
    assert [r for r in rows if r != "package"] == architecture.package_names()
    assert (ROOT / "docs" / "architecture.png").stat().st_size > 10_000


def test_the_table_is_what_the_imports_give():
    """Stale after an import between packages was added or removed: run python scripts/architecture.py."""
    assert architecture.with_table(DOC, architecture.table(architecture.package_graph())) == DOC
