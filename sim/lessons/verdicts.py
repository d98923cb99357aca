"""Real runs judged against the tolerance their lesson states: the prediction of the simulator calibrated in the
same launch against the measurement, and "within" or ``OUTSIDE`` in the table's title. tests/test_lessons_notebooks.py
fails a lesson whose output says ``OUTSIDE``.

    >>> verdict([{"cap": 2, "predicted_s": 0.09, "measured_s": 0.1}], "cap", 0.5).title
    "worst error -10%: within the lesson's tolerance (50%)"

``TOLERANCE`` is for the lessons' short launches: 2 gloo ranks, a few steps, in quick mode fewer, on a machine
that may be busy. The accuracy benchmarks time longer runs and land closer (README, "Fidelity":
benchmarks/ddp_accuracy.py -1% to -8%, fsdp_accuracy.py -2% to -15%, overlap_accuracy.py's medians within 15%),
but a single short run on 2 shared cores has landed anywhere from -33% to +48% (overlap_accuracy.py's single
runs): a lesson that holds such a run to 15% would fail on noise, not on the model.
"""
from __future__ import annotations

from distlab.sim.lessons.helpers import Table

TOLERANCE = 0.5
OUTSIDE = "outside the lesson's tolerance"


def error(predicted: float, measured: float) -> float:
    return predicted / measured - 1


BUSY_SHARE = 0.10      # as runtime/measure/trust.py BACKGROUND_LIMIT: other processes may use this share of the cores
NOT_JUDGED = "not judged"


def busy(background: dict | None) -> str | None:
    """Why a measurement cannot judge the model: other processes used more than BUSY_SHARE of the cores during
    it (``background``: runtime/measure/trust.py Watch.stop()'s dict), else None."""
    if not background or background.get("background_cores") is None:
        return None
    cores = background["cores"]
    if background["background_cores"] <= BUSY_SHARE * cores:
        return None
    return (f"other processes used {background['background_cores']:.2f} of {cores} cores during the run "
            f"(allowed {BUSY_SHARE * cores:.2f}): its times include waiting for them")


def verdict(rows: list[dict], key: str, tolerance: float = TOLERANCE, label: str = "",
            background: dict | None = None) -> Table:
    """Each row's (``key``, predicted_s, measured_s) error, and the worst against ``tolerance`` in the title;
    a run outside the tolerance on a busy machine (``background``, see ``busy``) is ``not judged``, with why.

        >>> verdict([{"cap": 2, "predicted_s": 0.2, "measured_s": 0.1}], "cap", 0.5,
        ...         background={"background_cores": 1.0, "cores": 2}).title.split(":")[1]
        ' not judged'
    """
    errors = [error(r["predicted_s"], r["measured_s"]) for r in rows]
    worst = max(errors, key=abs)
    why = busy(background)
    if abs(worst) <= tolerance:
        word = "within the lesson's tolerance"
    else:
        word = f"{NOT_JUDGED}: {why}" if why else OUTSIDE
    table = [[r[key], f"{r['predicted_s'] * 1e3:.2f}", f"{r['measured_s'] * 1e3:.2f}", f"{e:+.0%}"]
             for r, e in zip(rows, errors)]
    return Table([key, "predicted ms", "measured ms", "error"], table,
                 f"{label + ': ' if label else ''}worst error {worst:+.0%}: {word} ({tolerance:.0%})")
