"""The lessons' exercises by id: ``check("02-busbw", "324 GB/s")`` says at once whether an answer is right.

    >>> check("01-world-size", 8).status
    'correct'
    >>> solution("12-young")
    '26.83 min'

Each exercise asks for a number in one unit (``ms``, ``GB/s``, ``MiB``, ``%``, ``x``), a plain count, or one of
a few words. The expected value is computed by the library when you check (the simulator, the α-β formulas,
or your own measurements passed as keyword arguments), so it always matches what the lessons run.

Verdicts (sim/lessons/checker.py): ``correct``; ``wrong`` (with a hint: the closest of a few usual factors within
1%, e.g. "off by 8x: bits against bytes?"); ``wrong unit``; ``wrong kind``; ``unanswered``; ``unreadable``.

The exercises live in the banks, one tuple ``EXERCISES`` per module (``BANKS``, in lesson order); this module
gathers them. The dependency is one way: exercises -> banks -> checker; no bank imports this module.

An exercise that takes no measurement (no ``needs``) has one expected value per session: the library computes it
the first time it is asked for (a check, a solution) and keeps it, with the exercise's usual wrong values
(``traps``), so a learner re-checking an answer, or a test checking many, does not simulate again (lesson 11's
answers come from a planner search of 26,516 layouts). Exercises given measurements are computed every time.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import distlab.sim.lessons.bank as bank
import distlab.sim.lessons.bank_compute as bank_compute
import distlab.sim.lessons.bank_cp as bank_cp
import distlab.sim.lessons.bank_ep as bank_ep
import distlab.sim.lessons.bank_fsdp as bank_fsdp
import distlab.sim.lessons.bank_ingest as bank_ingest
import distlab.sim.lessons.bank_jobs as bank_jobs
import distlab.sim.lessons.bank_machine as bank_machine
import distlab.sim.lessons.bank_plan as bank_plan
import distlab.sim.lessons.bank_tp as bank_tp
import distlab.sim.lessons.failures as failures
import distlab.sim.lessons.precision as precision
import distlab.sim.lessons.roofline as roofline
from distlab.sim.lessons.checker import (Exercise, Verdict, check_answer, expected_value, question_text,
                                         solution_text, validate)

BANKS = (bank, bank_machine, bank_ingest, bank_fsdp, bank_tp, bank_cp, bank_ep, bank_plan, failures, bank_compute,
         roofline, bank_jobs, precision)

__all__ = ["BANKS", "Exercise", "Verdict", "check", "exercises", "get", "question", "solution"]


@lru_cache(maxsize=1)
def _registry() -> dict[str, Exercise]:
    table: dict[str, Exercise] = {}
    for module in BANKS:
        for ex in module.EXERCISES:
            if ex.id in table:
                raise ValueError(f"exercise {ex.id} is defined twice ({module.__name__})")
            table[ex.id] = validate(ex) if ex.needs else replace(validate(ex), expected=_once(ex.expected),
                                                                 traps=ex.traps and _once(ex.traps))
    return dict(sorted(table.items()))


def _once(compute):
    """``compute`` computed at its first call without arguments and kept (see the module docstring); a call
    with arguments is passed through."""
    kept: list = []

    def value(*args, **kwargs):
        if args or kwargs:
            return compute(*args, **kwargs)
        if not kept:
            kept.append(compute())
        return kept[0]
    return value


def exercises(prefix: str = "") -> dict[str, Exercise]:
    """All exercises, by id (those of one lesson with ``prefix='02'``)."""
    return {k: v for k, v in _registry().items() if k.startswith(prefix)}


def get(exercise_id: str) -> Exercise:
    table = _registry()
    if exercise_id not in table:
        raise KeyError(f"no exercise {exercise_id!r}; known: {', '.join(table)}")
    return table[exercise_id]


def question(exercise_id: str) -> str:
    return question_text(get(exercise_id))


def solution(exercise_id: str, **given) -> str:
    """The expected answer, written in the unit asked for (for when you are stuck, and for tests)."""
    return solution_text(get(exercise_id), given)


def expected(exercise_id: str, **given):
    """The expected value (a number in the exercise's unit, or a word)."""
    return expected_value(get(exercise_id), given)


def check(exercise_id: str, answer, **given) -> Verdict:
    """Check ``answer`` (a number in the unit asked for, or a string with a unit such as ``"3.7 ms"``).
    Exercises about your own measurements take them as keyword arguments (see the lesson)."""
    return check_answer(get(exercise_id), answer, given)
