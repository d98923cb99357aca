"""The exercise checker: an ``Exercise`` (question, unit, expected value) and the ``Verdict`` on an answer.

    >>> ex = Exercise("00-demo", "1 GiB in MiB?", "MiB", lambda: 1024)
    >>> check_answer(ex, "1024 MiB", {}).status, check_answer(ex, "1 GiB", {}).status
    ('correct', 'correct')

The lessons' exercises live in the banks (sim/lessons/bank*.py, failures.py), each a tuple ``EXERCISES`` of
``Exercise``; sim/lessons/exercises.py gathers them and looks them up by id (``check("02-busbw", "324 GB/s")``).
This module knows no bank: the banks import it, never the reverse.

Each exercise asks for a number in one unit (``ms``, ``GB/s``, ``MiB``, ``%``, ``x``), a plain count, or one of
a few words. The expected value is computed by the library when you check (the simulator, the α-β formulas,
or your own measurements passed as keyword arguments), so it always matches what the lessons run.

Verdicts: ``correct``; ``wrong`` (with a hint: the closest of a few usual factors within 1%, e.g. "off by 8x:
bits against bytes?", "off by 1.074x: GB against GiB?"); ``wrong unit`` (a bare number that is the answer in
another unit: "0.2 is the answer in x; the answer is in %"); ``wrong kind`` (a bandwidth where a time is asked);
``unanswered``; ``unreadable`` (including a number with an ambiguous decimal comma, "1,5 ms").
An answer written with an equivalent unit of the right kind ("0.00477 s" for "4.77 ms") is correct.

A verdict's HTML carries the expected value (``data-expected``) in two cases: a prediction checked after its run
(the measurement it is judged against), and, in the lessons' quick mode (DISTLAB_LESSONS_QUICK, which
tests/test_lessons_notebooks.py sets), every verdict whose value the library can compute, so that the test's
give-away scans read each answer from the executed notebook instead of computing it again (lesson 11's come from
a planner search). A learner's page never carries an answer it has not been given.
"""
from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass, field
from typing import Callable

from distlab.sim.lessons.units import DIMENSION_WORDS, UNITS, UnitError, fmt, parse, units_of

UNANSWERED = (None, "", ...)
QUICK_ENV = "DISTLAB_LESSONS_QUICK"          # the lessons' quick mode: set by tests/test_lessons_notebooks.py


def quick() -> bool:
    """True when DISTLAB_LESSONS_QUICK is set (and not "0"): the lessons' real runs repeat less
    (runtime/lessons/common.py), the planner lesson confirms nothing, and verdicts carry their expected value."""
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


@dataclass(frozen=True)
class Exercise:
    id: str
    question: str
    unit: str                                # a unit of sim.lessons.units, "count" or "choice"
    expected: Callable[..., object]          # (**given) -> value in ``unit`` (a number, or a word for choice)
    tolerance: float = 0.02                  # relative
    abs_tolerance: float = 0.0               # in ``unit`` (e.g. 0.5 percentage points for small percentages)
    choices: tuple[str, ...] = ()
    hint: str = ""
    why: str = ""                            # shown once the answer is right
    needs: tuple[str, ...] = ()              # keyword arguments check() must be given
    prediction: bool = False                 # predicted before a run, checked against the run's ``needs``
    traps: Callable[[], dict] | None = None  # () -> {a usual wrong value: what it means}, named when answered

    @property
    def dimension(self) -> str:
        return self.unit if self.unit in ("count", "choice") else UNITS[self.unit][0]

    def asks(self) -> str:
        if self.unit == "choice":
            return f"answer one of: {', '.join(self.choices)}"
        if self.unit == "count":
            return "answer a plain number"
        return f"answer in {self.unit}"


@dataclass
class Verdict:
    exercise: str
    status: str                              # correct, wrong, wrong unit, wrong kind, unanswered, unreadable
    message: str
    details: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "correct"

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        mark = {"correct": "✔", "unanswered": "…"}.get(self.status, "✘")
        return f"{mark} [{self.exercise}] {self.status}: {self.message}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour = {"correct": "#1b7f3b", "unanswered": "#555555"}.get(self.status, "#b3261e")
        head, _, rest = str(self).partition(": ")
        expected = self.details.get("expected")
        data = f' data-expected="{html.escape(str(expected))}"' if expected is not None else ""
        return (f'<div class="distlab-verdict distlab-{self.status.replace(" ", "-")}"{data} '
                f'style="border-left:4px solid {colour};padding:4px 10px;margin:4px 0;color:{colour}">'
                f"<b>{html.escape(head)}</b>: {html.escape(rest)}</div>")


def expected_value(ex: Exercise, given: dict):
    """The expected answer of ``ex``, computed from the library (and the learner's measurements ``given``)."""
    missing = [k for k in ex.needs if k not in given]
    if missing:
        raise TypeError(f"exercise {ex.id} needs {', '.join(missing)}=... (your measurement) to check the answer")
    return ex.expected(**given)


def solution_text(ex: Exercise, given: dict) -> str:
    """The expected answer, written in the unit asked for."""
    value = expected_value(ex, given)
    if ex.unit == "choice":
        return str(value)
    return fmt(value, None) if ex.unit == "count" else fmt(value, ex.unit)


def question_text(ex: Exercise) -> str:
    return f"{ex.question} ({ex.asks()})"


def validate(ex: Exercise) -> Exercise:
    """``ex`` if its unit is known (ValueError otherwise)."""
    if ex.unit not in ("count", "choice") and ex.unit not in UNITS:
        raise ValueError(f"exercise {ex.id}: unknown unit {ex.unit!r}")
    return ex


def _close(a: float, b: float, tol: float, abs_tol: float = 0.0) -> bool:
    return math.isclose(a, b, rel_tol=tol, abs_tol=max(abs_tol, 1e-12))


# Ratios a wrong answer often has to the right one, and what usually causes each. The closest one within
# HINT_TOLERANCE (~1%: 0.6%) names the mistake: 1.024 (kB/KiB), 1.049 (MB/MiB), 1.074 (GB/GiB) are 2.4% apart.
FACTOR_HINTS = ((8.0, "bits against bytes?"), (1.024, "kB against KiB (10^3 against 2^10)?"),
                (1.048576, "MB against MiB (10^6 against 2^20)?"), (1.073741824, "GB against GiB (10^9 against 2^30)?"),
                (1.099511627776, "TB against TiB (10^12 against 2^40)?"), (1000.0, "a unit prefix (x1000)?"),
                (2.0, "a factor of 2: both directions, or the 2(n-1)/n of all_reduce?"))
HINT_TOLERANCE = 0.006        # an answer rounded to 3 digits stays within 0.5% of its factor


def _factor_hint(got: float, want: float) -> str:
    """"off by 1.074x: GB against GiB?" when got/want is within 0.6% of a known factor (or its inverse), the
    closest one winning; else the relative error ("off by +12%")."""
    if want == 0 or got == 0 or (got < 0) != (want < 0):
        return "check the sign" if got and want and (got < 0) != (want < 0) else ""
    r = got / want
    distance, _, text = min((abs(math.log(r / g)), g, text) for f, text in FACTOR_HINTS for g in (f, 1 / f))
    if distance <= math.log(1 + HINT_TOLERANCE):
        return f"off by {r:.4g}x: {text}"
    return f"off by {(r - 1) * 100:+.0f}%"


def check_answer(ex: Exercise, answer, given: dict) -> Verdict:
    """Check ``answer`` to ``ex`` (a number in the unit asked for, or a string with a unit such as ``"3.7 ms"``);
    ``given``: the learner's measurements the exercise needs. In quick mode the verdict also carries the
    expected value (module docstring)."""
    verdict = _check_answer(ex, answer, given)
    if quick() and "expected" not in verdict.details and \
            all(k in given for k in ex.needs):
        verdict.details["expected"] = expected_value(ex, given)
    return verdict


def _check_answer(ex: Exercise, answer, given: dict) -> Verdict:
    if any(answer is u for u in UNANSWERED) or (isinstance(answer, str) and not answer.strip()):
        if ex.prediction and all(k in given for k in ex.needs):   # checked after the run: say what it measured
            value = expected_value(ex, given)
            shown = str(value) if ex.unit == "choice" else fmt(value, None if ex.unit == "count" else ex.unit)
            return Verdict(ex.id, "unanswered", f"{ex.question} ({ex.asks()}); measured: {shown}",
                           {"expected": value})
        return Verdict(ex.id, "unanswered", f"{ex.question} ({ex.asks()})")
    expected = expected_value(ex, given)
    if ex.unit == "choice":
        return _check_choice(ex, answer, expected)
    try:
        q = parse(answer)
    except UnitError as e:
        return Verdict(ex.id, "unreadable", f"{e} ({ex.asks()})")
    if ex.unit == "count":
        if q.unit is not None:
            return Verdict(ex.id, "wrong unit", f"the answer is a plain number, without a unit (you wrote {q})")
        return _numeric(ex, q.value, float(expected), str(q))
    want = float(expected)
    if q.unit is None:
        if _close(q.value, want, ex.tolerance, ex.abs_tolerance):
            return _numeric(ex, q.value, want, fmt(q.value, ex.unit))
        for u in units_of(ex.dimension):
            if u != ex.unit and _close(q.value * UNITS[u][1] / UNITS[ex.unit][1], want, ex.tolerance):
                return Verdict(ex.id, "wrong unit", f"{fmt(q.value, None)} is the answer in {_name(u)}; the answer is "
                                                    f"in {_name(ex.unit)}", {"unit": u})
        return _numeric(ex, q.value, want, fmt(q.value, ex.unit))
    if q.dimension != ex.dimension:
        return Verdict(ex.id, "wrong kind", f"{q} is {DIMENSION_WORDS[q.dimension]}; the answer is "
                                            f"{DIMENSION_WORDS[ex.dimension]}, in {ex.unit}", {"unit": q.unit})
    if q.unit != ex.unit:
        converted = q.to(ex.unit)
        if _close(converted, want, ex.tolerance, ex.abs_tolerance):      # an equivalent unit: as good
            return _numeric(ex, converted, want, f"{q} = {fmt(converted, ex.unit)}")
        verdict = _numeric(ex, converted, want, f"{q} (= {fmt(converted, ex.unit)})")
        verdict.details["unit"] = q.unit
        return verdict
    return _numeric(ex, q.value, want, str(q))


def _name(unit: str) -> str:
    return {"x": "x (a plain ratio)", "%": "% (percent)"}.get(unit, unit)


def _numeric(ex: Exercise, got: float, want: float, shown: str) -> Verdict:
    if _close(got, want, ex.tolerance, ex.abs_tolerance):
        return Verdict(ex.id, "correct", f"{shown}. {ex.why}".strip())
    hint = _factor_hint(got, want)
    trap = next((text for value, text in (ex.traps() if ex.traps else {}).items()
                 if _close(got, float(value), ex.tolerance, ex.abs_tolerance)), "")
    text = f"not {shown}" + (f" ({trap})" if trap else f" ({hint})" if hint else "") + \
        (f". Hint: {ex.hint}" if ex.hint else "")
    return Verdict(ex.id, "wrong", text, {"ratio": got / want if want else None})


def _check_choice(ex: Exercise, answer, expected) -> Verdict:
    word = str(answer).strip().lower()
    choices = [c.lower() for c in ex.choices]
    if word not in choices:
        return Verdict(ex.id, "unreadable", f"{answer!r} is not one of {', '.join(ex.choices)}")
    if word == str(expected).lower():
        return Verdict(ex.id, "correct", f"{word}. {ex.why}".strip())
    return Verdict(ex.id, "wrong", f"not {word}" + (f". Hint: {ex.hint}" if ex.hint else ""))
