"""Issue 33: README.md is a front page (under 220 lines, the quickstart CI runs, worked examples that are what the
commands print now), the depth is in docs/, and docs/accuracy.md is written by the benchmarks themselves."""
from __future__ import annotations

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
# pages the other helpers of a round write, linked from the front page before they are merged in (none now)
OTHER_PAGES: set[str] = set()


def test_readme_is_a_front_page_whose_quickstart_ci_runs():
    assert len(README.splitlines()) <= 200          # the lead adds the other helpers' pointers at merge: room kept
    first = re.search(r"```bash\n(.*?)```", README, re.S).group(1).splitlines()
    ci = (ROOT / ".ci" / "run").read_text()
    quickstart = ci[ci.index("# --- the README's Quickstart"):ci.index("echo \"ci: quickstart")].splitlines()[1:]
    assert [line.replace("pip install -q ", "pip install ") for line in quickstart if line.strip()] == first[:2]
    assert first[2] == "python -m pytest -q" and "python -m pytest -q" in ci


def test_every_page_the_readme_links_exists():
    pages = set(re.findall(r"docs/([\w-]+\.md)", README))
    assert {"accuracy.md", "calibration.md", "network.md", "plans.md", "multinode.md", "extending.md"} <= pages
    for page in pages - OTHER_PAGES:
        assert (ROOT / "docs" / page).is_file(), page
    for path in re.findall(r"\b((?:scenarios|benchmarks|scripts)/[\w./-]+\.(?:yaml|py|sh))", README):
        assert (ROOT / path).is_file(), path


def test_readme_examples_are_what_the_commands_print():
    """Every simulator command shown with its output prints that output now (scripts/readme_examples.py)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("readme_examples", ROOT / "scripts" / "readme_examples.py")
    examples = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(examples)
    shown = list(examples.blocks(README))
    assert len(shown) >= 2
    assert examples.main(["--check"]) == 0


def test_readme_measured_example_is_what_validate_printed():
    """Every console block is a command with its output (no placeholder left); the measured one, `distlab
    validate --nproc 2`, is what print_validation writes: the summary, the overlap plan's rows and factors at 2 and
    3 ranks, the load, and the verdict."""
    blocks = re.findall(r"```console\n(.*?)```", README, re.S)
    assert len(blocks) >= 3
    for block in blocks:
        lines = block.splitlines()
        assert lines[0].startswith("$ distlab ") and [x for x in lines if not x.startswith("$ ")], lines[0]
        assert not re.search(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b", block), "a placeholder in the README"
    validate = next(b for b in blocks if b.startswith("$ distlab validate --nproc 2"))
    assert validate.splitlines()[1].startswith("calibrated on 2 ranks with ")
    assert "|error| per kind and world size" in validate
    flat = " ".join(validate.split())
    for ranks in (2, 3):
        assert re.search(rf"^overlap plan +{ranks} +1 +\d+\.\d%", validate, re.M), ranks
        assert re.search(rf"^compute\+all_reduce +{ranks} +4 MiB +[\d.]+ +[\d.]+ +[-+][\d.]+% ", validate, re.M)
        assert re.search(rf"overlap plan on {ranks} ranks: interference [\d.]+, comm_interference [\d.]+ \(error "
                         r"without them [-+][\d.]+%\); repeats( \d+,)+ \d+ ms", flat), ranks
    assert re.search(r"load before: average [\d.]+ on \d+ cores, other processes [\d.]+ cores", flat)
    assert re.search(r"^ *(trustworthy|NOT TRUSTWORTHY)", validate, re.M)


def test_readme_prose_agrees_with_the_outputs_and_files_it_describes():
    """The 70B example's 'X GiB of 80 fit' is its block's total, and the notebook count is lessons/'s."""
    fit = re.search(r"so ([\d.]+) GiB of 80 fit", README).group(1)
    total = re.search(r"^peak memory per GPU \(total\) +[\d.]+ GB = ([\d.]+) GiB$", README, re.M).group(1)
    assert f"{float(total):.1f}" == fit, (fit, total)
    notebooks = len(list((ROOT / "lessons").glob("*.ipynb")))
    counts = re.findall(r"(\d+) notebooks", README)
    assert counts and all(int(n) == notebooks for n in counts), (counts, notebooks)


def test_readme_quotes_figures_only_from_commands_users_run():
    """A percentage or a time on the front page sits in the output of a distlab command shown with it."""
    outside = re.sub(r"```console\n.*?```", "", README, flags=re.S)
    assert not re.findall(r"[-+]?\d+(?:\.\d+)?\s?%(?! of)", outside.replace("10% of the cores", ""))


def test_accuracy_md_is_written_by_the_benchmarks():
    """Each section of docs/accuracy.md has the header benchmarks/accuracy_doc.py writes (command, date, commit,
    machine, load) and names a benchmark that has --markdown; its commit is in this repository's history."""
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from accuracy_doc import TITLE, replace_section
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    text = (ROOT / "docs" / "accuracy.md").read_text()
    assert text.startswith(TITLE)
    sections = re.findall(r"<!-- begin (\S+) -->\n(.*?)<!-- end \1 -->", text, re.S)
    assert sections
    for name, body in sections:
        script = ROOT / "benchmarks" / f"{name}.py"
        assert script.is_file() and "--markdown" in script.read_text(), name
        head = body.split("```")[0]
        assert re.search(rf"^- command: `python benchmarks/{name}\.py [^`]*--markdown", head, re.M), name
        for key in ("date", "machine", "load before", "load during"):
            assert re.search(r"^- (trustworthy|NOT TRUSTWORTHY)", head, re.M), name
            assert re.search(rf"^- {key}: \S", head, re.M), (name, key)
        commit = re.search(r"^- commit: ([0-9a-f]{40})(\+changes)?$", head, re.M)
        assert commit, name
        known = subprocess.run(["git", "cat-file", "-e", commit.group(1) + "^{commit}"], cwd=ROOT,
                               capture_output=True)
        assert known.returncode == 0, (name, "commit not in this repository")
        assert body.count("```") == 2, name                  # what the script printed, verbatim
    assert replace_section(text, sections[0][0], sections[0][1]) == text      # rewriting a section keeps the rest
