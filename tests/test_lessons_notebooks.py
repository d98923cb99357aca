"""Every lesson notebook follows the conventions of lessons/README.md and runs top to bottom on CPU (nbclient),
each within 3 minutes on a 2-core machine, and no exercise's answer is shown before the cell that checks it.

The notebooks run with DISTLAB_LESSONS_QUICK=1: the real-run helpers (runtime/lessons/, runtime/lessons/pitfalls.py)
then repeat less (fewer iterations and steps), so every cell still executes, only cheaper."""
import glob
import math
import os
import re
import time

import pytest

nbformat = pytest.importorskip("nbformat")

LESSONS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lessons")
NOTEBOOKS = sorted(glob.glob(os.path.join(LESSONS, "[0-9][0-9]_*.ipynb")))
LIMIT_S = 180
QUICK = "DISTLAB_LESSONS_QUICK"
# Lessons whose cells start real ranks (torch.distributed); the others are simulator-only and fast.
SLOW = {"01_processes_and_collectives.ipynb", "02_what_a_collective_costs.ipynb", "03_topologies.ipynb",
        "04_validate_on_your_machine.ipynb", "05_ddp.ipynb", "06_fsdp_zero.ipynb", "07_pipeline.ipynb",
        "08_pitfalls.ipynb", "09_device_mesh_and_dtensor.ipynb", "11_plan_a_run.ipynb",
        "12_failures_at_scale.ipynb", "14_shared_cluster.ipynb", "15_mixed_precision_fp8.ipynb"}


def _ids():
    return [os.path.basename(p) for p in NOTEBOOKS]


def test_the_lessons_are_there_and_indexed():
    names = _ids()
    assert names[:7] == ["01_processes_and_collectives.ipynb", "02_what_a_collective_costs.ipynb",
                         "03_topologies.ipynb", "04_validate_on_your_machine.ipynb", "05_ddp.ipynb",
                         "06_fsdp_zero.ipynb", "07_pipeline.ipynb"]
    assert [int(n[:2]) for n in names] == sorted({int(n[:2]) for n in names})   # numbered, unique (09-11 to come)
    with open(os.path.join(LESSONS, "README.md")) as f:
        readme = f.read()
    positions = [readme.find(f"]({n})") for n in names]
    assert all(p > 0 for p in positions) and positions == sorted(positions), "README index lists every lesson in order"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids())
def test_conventions(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.nbformat == 4 and nb.metadata["kernelspec"]["name"] == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, "outputs are not committed (strip them)"
            assert len(cell.source.splitlines()) <= 30, "notebooks stay thin: long logic belongs in the library"
    md = [c.source for c in nb.cells if c.cell_type == "markdown"]
    assert re.match(r"# \d\d · ", md[0]) and "**Goals.**" in md[0]
    assert "## Recap" in md[-1]
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert len(re.findall(r'^check\("\d\d-', code, re.M)) >= 2, "two or more checked exercises"
    assert re.search(r"plot_\w+\(", code), "at least one figure from the library"
    assert "from distlab.runtime." in code, "uses the real runtime"
    assert "distlab.sim." in code, "uses the simulator"


PARALLEL = 2                    # notebooks executed at once: a kernel is serial and its ranks often wait


# ipykernel logs "Kernel is running over TCP without encryption" as a warning at every start (ipykernel/kernelapp.py
# init_sockets), and the kernels' stderr landed between pytest's dots (issue 33): their log shows errors only
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=ERROR"]


def _execute(path, workdir):
    """Run the notebook in a fresh kernel with DISTLAB_LESSONS_QUICK=1 (the kernel's environment only):
    (executed notebook, seconds)."""
    from nbclient import NotebookClient
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=LIMIT_S, kernel_name="python3", resources={"metadata": {"path": workdir}},
                            extra_arguments=KERNEL_ARGUMENTS)
    t0 = time.monotonic()
    client.execute(env={**os.environ, QUICK: "1"})      # smaller real runs, same cells
    return nb, time.monotonic() - t0


@pytest.fixture(scope="module")
def executed(request, tmp_path_factory):
    """Every notebook this session selected, executed once (both tests below read the same executed copy),
    ``PARALLEL`` at a time in background threads, each in its own kernel and folder: the tests wait for theirs.
    Two kernels at once keep both cores of a small machine busy (a notebook alone mostly waits on one)."""
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from concurrent.futures import ThreadPoolExecutor
    wanted = []
    for item in request.session.items:
        path = getattr(item, "callspec", None) and item.callspec.params.get("path")
        if item.module is request.module and path and item.originalname != "test_conventions" \
                and path not in wanted:
            wanted.append(path)
    pool = ThreadPoolExecutor(max_workers=PARALLEL, thread_name_prefix="notebook")
    futures = {p: pool.submit(_execute, p, str(tmp_path_factory.mktemp("nb-" + os.path.basename(p)[:2])))
               for p in wanted}
    try:
        yield futures
    finally:
        for f in futures.values():
            f.cancel()
        pool.shutdown(wait=True)


def _marks(path):
    return [pytest.mark.slow] if os.path.basename(path) in SLOW else []


@pytest.mark.parametrize("path", [pytest.param(p, marks=_marks(p)) for p in NOTEBOOKS], ids=_ids())
def test_runs_top_to_bottom(path, executed):
    nb, elapsed = executed[path].result()
    print(f"{os.path.basename(path)}: {elapsed:.1f} s")
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "a figure is shown"
    verdicts = [o for o in outputs if "distlab-verdict" in o.get("data", {}).get("text/html", "")]
    assert len(verdicts) >= 2, "exercise verdicts are shown"
    # a real run's prediction outside the tolerance its lesson states (sim/lessons/plan_run.py real_run_verdict)
    missed = [o for o in outputs if "outside the lesson's tolerance" in _text(o)]
    assert not missed, "a prediction outside the lesson's tolerance: " + _text(missed[0])[:300]
    assert elapsed < LIMIT_S, f"{os.path.basename(path)} took {elapsed:.0f} s (limit {LIMIT_S} s)"


LESSON_09 = os.path.join(LESSONS, "09_device_mesh_and_dtensor.ipynb")


@pytest.mark.slow
def test_09_real_collectives_are_the_plans(executed):
    """Lesson 09's real TP run (quick mode: no warm-up step) issues the simulated plan's collectives: every row of
    its table has CommDebugMode's count equal to the plan's and the same sequence ("yes")."""
    if LESSON_09 not in executed:
        pytest.skip("lesson 09 not executed in this session")
    nb, _ = executed[LESSON_09].result()
    cell = next(c for c in nb.cells if c.cell_type == "code" and "commdebug_table(real)" in c.source)
    html = next(o["data"]["text/html"] for o in cell.outputs if "<table" in o.get("data", {}).get("text/html", ""))
    rows = [re.findall(r"<td>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", html, re.S)]
    rows = [r for r in rows if len(r) == 5]
    assert len(rows) >= 6 and all(r[2] == r[3] and r[4] == "yes" for r in rows), rows


@pytest.mark.parametrize("path", [pytest.param(p, marks=_marks(p)) for p in NOTEBOOKS], ids=_ids())
def test_widgets_are_readable_without_a_kernel(path, executed):
    """A saved notebook read without a kernel (GitHub, nbviewer; this headless run) shows each widget's state:
    its cell's output carries a PNG and a table beside the live widget (sim/lessons/widgets.py
    ``_repr_mimebundle_``), not only "VBox(children=...)"."""
    nb, _ = executed[path].result()
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and re.search(r"^\w+Widget\(", cell.source, re.M):
            data = [o.get("data", {}) for o in cell.outputs]
            assert any("image/png" in d and "<table" in d.get("text/html", "") for d in data), \
                f"{os.path.basename(path)} cell {i}: no static figure and table of the widget"
            assert not any(d.get("text/plain", "").startswith("VBox(") for d in data)


# --- predictions first: no exercise's answer in any output above its check cell --------------------------------
_TOKEN = re.compile(r"(?<![\w.])([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?:\s?(%|x\b|[A-Za-zµμ]+(?:/s)?))?")


def _text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    data = output.get("data", {})
    if "distlab-verdict" in data.get("text/html", ""):
        return ""                                                    # a verdict cell's own answer
    return data.get("text/plain", "") + " " + re.sub(r"<[^>]+>", " ", data.get("text/html", ""))


def _shown_answers(text: str, ex_id: str, ex, strong_only: bool) -> list[str]:
    """Tokens of ``text`` that give away exercise ``ex_id``'s answer: a number with a unit of the right kind that
    the checker accepts ("4.77 ms", "27.3%"), or a bare number within 0.5% of the answer. A small whole number or
    a word (a count, a choice) appears everywhere ("4 ranks"), so it counts only when ``strong_only`` is False
    (outputs of the exercise's own section). ``ex``: the exercise, with the answer the executed notebook showed
    when it did (``_exercises``)."""
    from distlab.sim.lessons.checker import check_answer, solution_text
    from distlab.sim.lessons.units import UnitError, parse
    if ex.unit == "choice":
        if strong_only:
            return []
        return [w for w in set(re.findall(r"[\w.-]+", text)) if w.lower() in ex.choices and
                check_answer(ex, w, {}).ok]
    want = parse(solution_text(ex, {})).value
    hits = []
    for number, unit in set(_TOKEN.findall(text)):
        quantity = None
        if unit:
            try:
                quantity = parse(f"{number} {unit}")
            except UnitError:
                quantity = None                                      # "16 microbatches": a bare number
        if quantity is not None and quantity.unit is not None:
            if ex.unit != "count" and quantity.dimension == ex.dimension and check_answer(ex, str(quantity), {}).ok:
                scale = quantity.to(ex.unit) / quantity.value if quantity.value else 1.0
                if not strong_only or _is_answer_as_printed(number, want / scale):
                    hits.append(f"{number} {unit}")
            continue
        value = float(number)
        digits = len(re.sub(r"[^0-9]", "", number.lower().split("e")[0]).strip("0"))
        if strong_only and (digits < 3 or ex.unit == "count"):
            continue
        if strong_only and not _is_answer_as_printed(number, want):
            continue
        if math.isclose(value, want, rel_tol=0 if ex.unit == "count" else 0.005, abs_tol=1e-12):
            hits.append(number)
    return hits


def _is_answer_as_printed(number: str, want: float) -> bool:
    """``number`` is ``want`` rounded to the digits ``number`` shows ("5.693" for 5.6929; not "5.705"). Outside
    the exercise's own section only this counts: a measurement printed in an earlier section (a CI run once showed
    5.705 ms measured where the answer is 5.693 ms) lands within the checker's tolerance by chance, never on
    the answer's own digits but by a rarer chance."""
    mantissa, _, exponent = number.lower().lstrip("+-").partition("e")
    decimals = len(mantissa.partition(".")[2])
    half_ulp = 0.5 * 10.0 ** (int(exponent or 0) - decimals)
    return abs(abs(float(number)) - abs(want)) <= half_ulp * (1 + 1e-9)


def _shown_expected(nb) -> dict:
    """Exercise id -> the expected value its verdict carries in the executed notebook ``nb`` (data-expected: in
    quick mode every verdict whose value the library computes carries it, sim/lessons/checker.py), as the
    library computed it in the notebook's kernel: the scans read it there instead of computing it again here
    (lesson 11's answers come from a planner search). A number is read back exactly (str of a float is its repr)."""
    import ast
    shown = {}
    for cell in nb.cells:
        for o in cell.get("outputs", []) if cell.cell_type == "code" else []:
            html = o.get("data", {}).get("text/html", "")
            m = re.search(r'class="distlab-verdict[^"]*" data-expected="([^"]*)".*?\[(\d\d-[\w-]+)\]', html, re.S)
            if m:
                import html as html_module
                text = html_module.unescape(m.group(1))
                try:
                    value = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    value = text
                shown.setdefault(m.group(2), value)
    return shown


def _exercises(nb=None) -> dict:
    """The exercises, each of those that take no measurement with the expected value the executed notebook ``nb``
    shows (``_shown_expected``; traps dropped: they name a wrong answer, never change whether one is right);
    the others as the library computes them."""
    from dataclasses import replace

    from distlab.sim.lessons import exercises
    table = exercises()
    shown = _shown_expected(nb) if nb is not None else {}
    for ex_id, value in shown.items():
        ex = table.get(ex_id)
        if ex is not None and not ex.needs and (isinstance(value, str) == (ex.unit == "choice")):
            table[ex_id] = replace(ex, expected=lambda value=value: value, traps=None)
    return table


def _revealed(nb) -> list[str]:
    table = _exercises(nb)
    problems, earlier, tables, section = [], [], [], 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            section += len(re.findall(r"^## ", cell.source, re.M))     # a heading may follow a paragraph
            continue
        texts = [_text(o) for o in cell.outputs]
        for ex_id in re.findall(r'^check\("(\d\d-[\w-]+)"', cell.source, re.M):
            ex = table[ex_id]
            if ex.prediction:                                            # asked before the run, checked after it
                problems += _prediction_revealed(nb, i, cell, ex_id, ex, texts, earlier)
                continue
            if ex.needs:                                 # read off your own run, not predicted: not allowed
                problems.append(f"{ex_id} (cell {i}): takes your measurement but is not a prediction")
                continue
            shown = earlier + [(i, section, t) for t in texts]
            for j, sec, text in shown:
                hits = _shown_answers(text, ex_id, ex, strong_only=sec != section)
                if hits:
                    problems.append(f"{ex_id} (cell {i}): accepted answer {hits[0]!r} already in cell {j}'s output")
                    break
            summed = [j for j, html in tables if ex.unit == "count" and _column_sums_to(html, ex)]
            if summed:
                problems.append(f"{ex_id} (cell {i}): a column of cell {summed[0]}'s table sums to the answer")
        earlier += [(i, section, t) for t in texts if t.strip()]
        tables += [(i, o["data"]["text/html"]) for o in cell.outputs
                   if "<table" in o.get("data", {}).get("text/html", "")]
    return problems


def _column_sums_to(html: str, ex) -> bool:
    """A count of 10 or more that an earlier table gives by adding up one of its columns (a table of calls per
    phase above "how many calls in all?")."""
    want = float(ex.expected())
    if want < 10:
        return False
    rows = [re.findall(r"<td>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", html, re.S)]
    rows = [r for r in rows if r]
    for col in range(max((len(r) for r in rows), default=0)):
        cells = [r[col] for r in rows if col < len(r) and re.fullmatch(r"\d+", r[col].strip())]
        if len(cells) >= 2 and sum(int(c) for c in cells) == want:
            return True
    return False


def _prediction_revealed(nb, i, cell, ex_id, ex, texts, earlier) -> list[str]:
    """A 'your machine' prediction (``prediction=True``): ``check(ID, VAR, row=...)`` in cell ``i`` after the run,
    VAR assigned in an earlier cell (the prediction), and the measured value (the unanswered verdict's
    data-expected) in no output above that cell, as a quantity of the right kind within 0.5% (bare numbers are
    not counted: a CI run once measured 1.035 GB/s where an unrelated earlier output printed 1.035)."""
    from distlab.sim.lessons.units import UnitError, parse
    var = re.search(rf'^check\("{ex_id}",\s*(\w+)', cell.source, re.M)
    asked = [j for j, c in enumerate(nb.cells[:i]) if c.cell_type == "code" and var and
             re.search(rf"^{var.group(1)}\s*=", c.source, re.M)]
    if not asked:
        return [f"{ex_id} (cell {i}): no earlier cell asks for the prediction it checks"]
    shown = [re.search(r'data-expected="([^"]+)"', o.get("data", {}).get("text/html", "")) for o in cell.outputs]
    values = [m.group(1) for m in shown if m]
    if not values:
        return [f"{ex_id} (cell {i}): its verdict does not say what was measured"]
    if ex.unit == "choice":                     # a word ("restart"): the run's own outputs come after the guess
        return []
    values = [float(v) for v in values]
    want, problems = values[0], []
    for j, _, text in earlier:
        if j >= asked[0]:
            continue
        for number, unit in set(_TOKEN.findall(text)):
            try:
                q = parse(f"{number} {unit}") if unit else None
            except UnitError:
                q = None
            ratio = lambda u: u in ("x", "×")             # a speed-up (1.00x) is not a share (100 %)
            if q is not None and q.unit is not None:
                value = q.to(ex.unit) if q.dimension == ex.dimension and ratio(unit) == ratio(ex.unit) else None
            else:
                value = None      # a bare number: a run's measurement may equal any earlier one by chance
            if value is not None and math.isclose(value, want, rel_tol=0.005):
                problems.append(f"{ex_id}: the measured {number} {unit} is in cell {j}'s output, before the "
                                f"prediction (cell {asked[0]})")
    return problems


@pytest.mark.parametrize("path", [pytest.param(p, marks=_marks(p)) for p in NOTEBOOKS], ids=_ids())
def test_no_answer_is_shown_before_its_check(path, executed):
    nb, _ = executed[path].result()
    assert not _revealed(nb), "predict first: " + "; ".join(_revealed(nb))


def test_a_measurement_shown_before_its_prediction_is_caught():
    """The check above on a made-up executed notebook: 02-your-busbw's measured 2.097 GB/s printed before the
    cell that asks for the prediction is caught; printed after it, it is not."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    from distlab.sim.lessons import check
    row = {"op": "all_reduce", "world_size": 2, "bytes": 4 * 2**20, "time_s": 0.002}       # busbw 2.097 GB/s
    verdict = check("02-your-busbw", None, row=row)
    bench = new_code_cell("measured = bench(...)", outputs=[new_output("stream", name="stdout",
                                                                       text="busbw 2.097 GB/s\n")])
    ask = new_code_cell("my_busbw = None")
    check_cell = new_code_cell('check("02-your-busbw", my_busbw, row=row)', outputs=[new_output(
        "display_data", data={"text/html": verdict._repr_html_(), "text/plain": str(verdict)})])
    head = new_markdown_cell("## 5. Your machine")
    assert "measured 2.097 GB/s" in _revealed(new_notebook(cells=[head, bench, ask, check_cell]))[0]
    assert _revealed(new_notebook(cells=[head, ask, bench, check_cell])) == []
    assert "no earlier cell asks" in _revealed(new_notebook(cells=[head, bench, check_cell]))[0]


def test_a_speed_up_is_not_a_share():
    """15-underflow's measured 100 % (every gradient flushed) is not given away by an earlier speed-up printed as
    1.00x (a CI-like run printed bf16 autocast at 1.00x of fp32 in cell 7); printed as 100 % it is."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    from distlab.sim.lessons import check
    result = {"rows": [{"zero": 1.0}]}
    verdict = check("15-underflow", None, result=result)
    head = new_markdown_cell("## 3. fp16")
    ask = new_code_cell("my_share = None")
    check_cell = new_code_cell('check("15-underflow", my_share, result=result)', outputs=[new_output(
        "display_data", data={"text/html": verdict._repr_html_(), "text/plain": str(verdict)})])
    for text, caught in (("MLP step (1.00x)\n", False), ("flushed: 100 %\n", True)):
        run = new_code_cell("run = ...", outputs=[new_output("stream", name="stdout", text=text)])
        assert bool(_revealed(new_notebook(cells=[head, run, ask, check_cell]))) == caught, text


# --- predictions first, in the prose: no answer anywhere a learner reads before the question ----------------------
NUMBER_WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve "
                                            "thirteen fourteen fifteen sixteen".split())}
# "how many <noun>" -> other words for the same thing a text may count instead
SAME_THING = ({"allred", "allgat", "reduce", "collec", "calls", "issue", "issues"},)


def _stem(word: str) -> str:
    return re.sub(r"[^a-z]", "", word.lower())[:6]


def _counted(text: str, ex) -> list[str]:
    """A count exercise's answer written next to what it counts: "two collectives per block" gives away "how many
    all-reduces does one block issue?" (2), as digits or a word, with at most 3 words between."""
    noun = re.search(r"[Hh]ow many ([\w/-]+)", ex.question)
    if not noun:
        return []
    stems = {_stem(noun.group(1))}
    stems |= next((group for group in SAME_THING if stems & group), set())
    want = int(round(float(ex.expected())))
    words = [str(want)] + [w for w, n in NUMBER_WORDS.items() if n == want]
    hits = []
    for m in re.finditer(rf"\b({'|'.join(words)})\b((?:\W+[\w'’-]+){{0,3}}?)\W+([\w-]+)", text, re.I):
        if _stem(m.group(3)) in stems or _stem(m.group(3)).rstrip("s") in stems:
            hits.append(m.group(0))
    return hits


def _prose_hits(text: str, ex_id: str, ex) -> list[str]:
    """In prose a bare number followed by a word counts something else ("the 256 experts"): left out."""
    words = re.sub(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?=\s+[A-Za-z]{2,})(?!\s+(?:%s)\b)" % "|".join(
        re.escape(u) for u in _units()), " ", text)
    hits = _shown_answers(words, ex_id, ex, strong_only=True)
    if ex.unit == "count":
        hits += _counted(text, ex)
    return hits


def _units() -> list[str]:
    from distlab.sim.lessons.units import UNITS
    return sorted(UNITS, key=len, reverse=True) + ["minutes", "seconds", "hours", "x"]


def _readme() -> str:
    with open(os.path.join(LESSONS, "README.md")) as f:
        return f.read()


def _prose_revealed(nb, readme: str, run=None) -> list[str]:
    """Exercise ids of ``nb`` whose accepted answer is in what a learner reads before answering: lessons/README.md,
    every markdown cell and code cell (its comments: the prompt) up to and including the check cell, the
    question and hint of every exercise of the lesson (a hint shows with any wrong answer, in any order), and
    the 'why' of the exercises checked before (shown once they are right). ``run``: ``nb`` executed, if this
    session executed it: the answers are read from its verdicts (``_exercises``)."""
    table = _exercises(run)
    ids = [i for c in nb.cells if c.cell_type == "code"
           for i in re.findall(r'^check\("(\d\d-[\w-]+)"', c.source, re.M)]
    always = [("lessons/README.md", readme)] + [(f"{i}'s question", table[i].question) for i in ids] + \
        [(f"{i}'s hint", table[i].hint) for i in ids]
    read, problems, checked = [], [], []
    for n, cell in enumerate(nb.cells):
        read.append((f"cell {n}", cell.source))
        for ex_id in re.findall(r'^check\("(\d\d-[\w-]+)"', cell.source, re.M) if cell.cell_type == "code" else []:
            ex = table[ex_id]
            if not ex.needs:
                whys = [(f"{i}'s why", table[i].why) for i in checked]
                for where, text in always + read + whys:
                    hits = _prose_hits(text, ex_id, ex)
                    if hits:
                        problems.append(f"{ex_id}: {hits[0]!r} in {where}")
            checked.append(ex_id)
    return problems


def _run_of(path, request):
    """The executed copy of ``path`` when this session executes it anyway (its test_runs_top_to_bottom is
    selected) and it ran; else None (the answers are then computed here)."""
    if not any(getattr(item, "originalname", "") == "test_runs_top_to_bottom" and
               item.callspec.params.get("path") == path for item in request.session.items):
        return None
    try:
        return request.getfixturevalue("executed")[path].result()[0]
    except Exception:                       # the notebook failed: test_runs_top_to_bottom says why
        return None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids())
def test_no_answer_in_the_prose_before_its_question(path, request):
    nb = nbformat.read(path, as_version=4)
    problems = _prose_revealed(nb, _readme(), _run_of(path, request))
    assert not problems, "predict first: " + "; ".join(problems)


def test_a_give_away_in_the_prose_is_caught():
    """The check above on made-up notebooks: 09-fwd-allreduce's 2 written as "two collectives per block" in the
    goals, 02-alpha-beta's 4.768 ms written as "4.8 ms" in an example, are caught; after the check, not."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
    goals = new_markdown_cell("# 09 · X\n\n**Goals.** why Megatron's two collectives per block become more")
    ask = new_code_cell('answer = None\ncheck("09-fwd-allreduce", answer)')
    assert "two collectives" in _prose_revealed(new_notebook(cells=[goals, ask]), "")[0]
    assert _prose_revealed(new_notebook(cells=[ask, goals]), "") == []
    example = new_code_cell('answer = None   # e.g. "4.8 ms"\ncheck("02-alpha-beta", answer)')
    assert "4.8 ms" in _prose_revealed(new_notebook(cells=[example]), "")[0]
    assert "README" in _prose_revealed(new_notebook(cells=[ask]), "Megatron's two all-reduces per block")[0]
    experts = new_code_cell('answer = None\ncheck("10-kv-MiB", answer)   # 256 experts, not 256 MiB')
    assert _prose_revealed(new_notebook(cells=[experts]), "")[0].startswith("10-kv-MiB: '256 MiB'")


def test_a_table_that_adds_up_to_the_answer_is_caught():
    """09-step-calls asks for one rank's collectives in a TP + SP step: a table of its calls per phase above the
    question gives it away by addition, and is caught."""
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from distlab.sim.lessons import solution
    n = int(solution("09-step-calls"))
    html = (f"<table class='distlab-table'><tbody><tr><td>forward</td><td>{n - 20}</td></tr>"
            f"<tr><td>backward</td><td>20</td></tr></tbody></table>")
    table = new_code_cell("collectives_table()", outputs=[new_output("execute_result", data={"text/html": html,
                                                                                              "text/plain": ""})])
    ask = new_code_cell('answer = None\ncheck("09-step-calls", answer)')
    assert "sums to the answer" in _revealed(new_notebook(cells=[table, ask]))[0]
    assert _revealed(new_notebook(cells=[ask, table])) == []


def test_a_measurement_near_a_fixed_answer_is_not_a_give_away():
    """04-predict's answer is 5.693 ms. A measured 5.705 ms printed in an earlier section lies within the checker's
    tolerance by chance (a CI run printed it) and is not counted; the answer's own digits there are."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    from distlab.sim.lessons import solution
    assert solution("04-predict").startswith("5.69")

    def shown(text):
        cell = new_code_cell("rows_table(rows)", outputs=[new_output("stream", name="stdout", text=text)])
        ask = new_code_cell('answer = None\ncheck("04-predict", answer)')
        return _revealed(new_notebook(cells=[cell, new_markdown_cell("## 3. Predict"), ask]))

    assert shown("all_reduce  8 MiB  5.705\n") == [] and shown("took 5.705 ms\n") == []
    assert "5.693" in shown("all_reduce  8 MiB  5.693\n")[0] and "5.693 ms" in shown("took 5.693 ms\n")[0]
    assert "5.69 ms" in shown("took 5.69 ms\n")[0]


def test_the_scans_read_each_answer_from_the_executed_notebook(monkeypatch):
    """In quick mode every verdict carries its expected value (data-expected), and the scans take the answer from
    there: a made-up executed notebook whose 04-predict verdict says 7.125 ms is caught showing "7.125 ms" above
    it and not the library's 5.693 ms; without the attribute the answer is computed (5.693 ms caught). The prose
    scan reads the same values."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    from distlab.sim.lessons import check
    monkeypatch.setenv(QUICK, "1")
    html = check("04-predict", None)._repr_html_()
    assert 'data-expected="5.69' in html
    monkeypatch.delenv(QUICK)
    assert "data-expected" not in check("04-predict", None)._repr_html_()        # a learner's page: no answer

    def notebook(shown, verdict_html):
        out = new_code_cell("rows_table(rows)", outputs=[new_output("stream", name="stdout", text=shown)])
        ask = new_code_cell('answer = None\ncheck("04-predict", answer)', outputs=[new_output(
            "display_data", data={"text/html": verdict_html, "text/plain": ""})])
        return new_notebook(cells=[new_markdown_cell("## 3. Predict"), out, ask])

    other = re.sub(r'data-expected="[^"]*"', 'data-expected="7.125"', html)
    assert "7.125 ms" in _revealed(notebook("took 7.125 ms\n", other))[0]
    assert _revealed(notebook("took 5.693 ms\n", other)) == []
    assert "5.693 ms" in _revealed(notebook("took 5.693 ms\n", html.replace("data-expected", "data-x")))[0]
    prompt = new_code_cell('answer = None   # e.g. "7.125 ms"\ncheck("04-predict", answer)')
    assert "7.125 ms" in _prose_revealed(new_notebook(cells=[prompt]), "", notebook("", other))[0]
    assert _prose_revealed(new_notebook(cells=[prompt]), "") == []
