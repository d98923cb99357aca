"""What the lessons' real runs share: quick mode (DISTLAB_LESSONS_QUICK) and a launch of N local ranks."""
from __future__ import annotations

# quick(): DISTLAB_LESSONS_QUICK set (tests/test_lessons_notebooks.py sets it): the helpers below then repeat less
# (iterations, steps, warm-up, calibration rounds; one process per node in torchrun), so CI executes every lesson
# cell at a fraction of the cost. Results stay real; medians are just noisier. One definition, in sim's checker.
from distlab.sim.lessons.checker import QUICK_ENV, quick  # noqa: F401 - QUICK_ENV re-exported by runtime.lessons


def fewer(n: int, quick_n: int) -> int:
    """``n``, or at most ``quick_n`` in quick mode."""
    return min(n, quick_n) if quick() else n


def run_on_ranks(target: str, payload=None, nproc: int = 4, backend: str = "gloo", timeout: float = 60.0,
                 preload: tuple = ()) -> list:
    """Run ``target(ctx, payload)`` (``module:function`` or ``file.py:function``) on ``nproc`` local ranks;
    the list of what each rank returned. A failing rank raises runtime.ranks.launch.RunFailed naming it. ``preload``:
    what the ranks will import, for the fork server to import once (runtime/ranks/launch.py TRAINING for a target that
    trains)."""
    from distlab.runtime.ranks.launch import launch
    return launch(target, payload, nproc, backend=backend, timeout=timeout, preload=preload)
