"""Failures, checkpoints and goodput: how often to checkpoint a job that fails every MTBF seconds on average.

Model (the one of Young 1974 and Daly 2006): failures of the whole job arrive as a Poisson process of rate
1/M (M = the job's mean time between failures; N components of MTBF m give M = m / N). The job computes for
an interval tau, then writes a checkpoint for delta seconds; a failure loses everything since the last
completed checkpoint and costs a restart of R seconds (no failure during the restart, as in Young), after
which the job resumes from that checkpoint. A segment (tau + delta) is retried until it runs without failure:

    E[time per segment] = (M + R) (exp((tau + delta) / M) - 1)          (geometric number of tries; E[loss
                                                                         per failed try] = M - s/(e^{s/M}-1))
    goodput G(tau) = tau / E[time per segment]                            (useful work / wall time)

Optimal interval tau*: maximise tau / (exp((tau + delta)/M) - 1), i.e. exp((tau + delta)/M) (1 - tau/M) = 1
(independent of R). Closed forms:
    Young (1974), "A first order approximation to the optimum checkpoint interval", CACM 17(9):
        tau_Y = sqrt(2 delta M)
    Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3):
        tau_D = sqrt(2 delta M) (1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9) - delta   for delta < 2M, else M

Checkpoint write time, sharded (torch.distributed.checkpoint: every rank writes its share in parallel):
    delta = bytes / min(ranks x per-rank write bandwidth, storage's aggregate bandwidth)

``simulate_goodput`` draws the failures (seeded Monte-Carlo: for each segment, the number of failed tries is
geometric and the time lost in each is exponential truncated at the segment length, which is exactly the
Poisson process's behaviour) and ``simulate_timeline`` walks one run event by event (the slow reference).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class CheckpointCost:
    """What one checkpoint costs: ``state_bytes`` over the ranks' and the storage's bandwidth."""
    state_bytes: float              # model + optimizer state, all ranks together (each tensor once)
    ranks: int = 1                  # ranks writing in parallel, each 1/ranks of it
    rank_write_Bps: float = 2e9     # one rank's write bandwidth (its NIC or local disk)
    storage_Bps: float = math.inf   # the file system's aggregate bandwidth

    @property
    def write_time_s(self) -> float:
        """bytes / min(ranks x rank bandwidth, storage bandwidth)."""
        return self.state_bytes / min(self.ranks * self.rank_write_Bps, self.storage_Bps)


def job_mtbf_s(component_mtbf_s: float, components: int) -> float:
    """Independent components in series, any failure stops the job: M = m / N."""
    return component_mtbf_s / components


def young_interval(delta_s: float, mtbf_s: float) -> float:
    """Young (1974): sqrt(2 delta M)."""
    return math.sqrt(2 * delta_s * mtbf_s)


def daly_interval(delta_s: float, mtbf_s: float) -> float:
    """Daly (2006), higher order: sqrt(2dM)(1 + sqrt(d/2M)/3 + (d/2M)/9) - d for d < 2M, else M."""
    if delta_s >= 2 * mtbf_s:
        return mtbf_s
    x = delta_s / (2 * mtbf_s)
    return math.sqrt(2 * delta_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - delta_s


def expected_goodput(tau_s: float, delta_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """tau / ((M + R)(exp((tau + delta)/M) - 1)): the model above, exactly."""
    return tau_s / ((mtbf_s + restart_s) * math.expm1((tau_s + delta_s) / mtbf_s))


def optimal_interval(delta_s: float, mtbf_s: float) -> float:
    """The exact maximiser of expected_goodput: root of exp((tau + delta)/M)(1 - tau/M) = 1 (bisection)."""
    def f(tau):
        return math.exp((tau + delta_s) / mtbf_s) * (1 - tau / mtbf_s) - 1
    lo, hi = 0.0, mtbf_s                      # f(0) > 0 (delta > 0), f(M) = -1
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    return (lo + hi) / 2


def simulate_goodput(tau_s: float, delta_s: float, mtbf_s: float, restart_s: float = 0.0,
                     segments: int = 200_000, seed: int = 0) -> float:
    """Monte-Carlo goodput of ``segments`` checkpoint intervals with random failures (seeded, numpy)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    s = tau_s + delta_s
    p_fail = -math.expm1(-s / mtbf_s)                     # a try of length s meets a failure
    u = 1.0 - rng.random(segments)                        # (0, 1]
    fails = np.floor(np.log(u) / math.log(p_fail)).astype(np.int64) if p_fail > 0 else np.zeros(segments, int)
    total = segments * s + fails.sum() * restart_s
    n = int(fails.sum())
    if n:                                                 # time lost per failed try: Exp(M) given < s
        v = rng.random(n)
        total += float((-mtbf_s * np.log1p(-v * p_fail)).sum())
    return segments * tau_s / total


def simulate_timeline(tau_s: float, delta_s: float, mtbf_s: float, restart_s: float, work_s: float,
                      seed: int = 0) -> dict:
    """One run of ``work_s`` seconds of useful work, event by event: {wall_s, failures, goodput, lost_s}."""
    import random
    rng = random.Random(seed)
    t, done, lost, failures = 0.0, 0.0, 0.0, 0
    next_failure = rng.expovariate(1 / mtbf_s)
    while done < work_s:
        segment = min(tau_s, work_s - done) + delta_s
        if t + segment <= next_failure:
            t += segment
            done += segment - delta_s
            continue
        failures += 1
        lost += next_failure - t
        t = next_failure + restart_s                   # restart, resume from the last checkpoint
        next_failure = t + rng.expovariate(1 / mtbf_s)
    return {"wall_s": t, "failures": failures, "goodput": work_s / t, "lost_s": lost}


@dataclass
class GoodputCurve:
    intervals_s: list[float]
    simulated: list[float]
    expected: list[float]
    delta_s: float
    mtbf_s: float
    restart_s: float

    @property
    def young_s(self) -> float:
        return young_interval(self.delta_s, self.mtbf_s)

    @property
    def daly_s(self) -> float:
        return daly_interval(self.delta_s, self.mtbf_s)

    @property
    def simulated_optimum_s(self) -> float:
        """The top of the simulated curve: a parabola in log(tau) through the points near the maximum (the
        curve is ~ 1 - delta/tau - tau/2M, symmetric in log tau about the optimum), its vertex."""
        import numpy as np
        x, y = np.log(self.intervals_s), np.asarray(self.simulated)
        best = int(np.argmax(y))
        lo, hi = max(0, best - 6), min(len(y), best + 7)
        a, b, _ = np.polyfit(x[lo:hi], y[lo:hi], 2)
        vertex = -b / (2 * a) if a < 0 else x[best]
        return float(math.exp(min(max(vertex, x[lo]), x[hi - 1])))


def goodput_curve(delta_s: float, mtbf_s: float, restart_s: float = 0.0, points: int = 41, span: float = 4.0,
                  segments: int = 200_000, seed: int = 0) -> GoodputCurve:
    """Simulated and expected goodput for intervals from Young/span to Young*span (log-spaced)."""
    center = young_interval(delta_s, mtbf_s)
    taus = [center * span ** (2 * i / (points - 1) - 1) for i in range(points)]
    sim = [simulate_goodput(t, delta_s, mtbf_s, restart_s, segments, seed) for t in taus]
    exp = [expected_goodput(t, delta_s, mtbf_s, restart_s) for t in taus]
    return GoodputCurve(taus, sim, exp, delta_s, mtbf_s, restart_s)


def draw_goodput(ax, curve: GoodputCurve, unit: str = "min", title: str | None = None) -> None:
    """Goodput against the checkpoint interval on ``ax``: simulated points, the expected curve, Young's and
    Daly's intervals and the simulated optimum."""
    scale = {"s": 1.0, "min": 60.0, "h": 3600.0}[unit]
    xs = [t / scale for t in curve.intervals_s]
    ax.plot(xs, [g * 100 for g in curve.expected], color="#3182bd", label="expected (model)")
    ax.plot(xs, [g * 100 for g in curve.simulated], "o", ms=3, color="#e6550d", label="simulated failures")
    for x, style, label in ((curve.young_s, ":", "Young"), (curve.daly_s, "--", "Daly"),
                            (curve.simulated_optimum_s, "-", "simulated optimum")):
        ax.axvline(x / scale, ls=style, color="#e6550d" if label == "simulated optimum" else "#444444",
                   lw=1, label=f"{label}: {x / scale:.3g} {unit}")
    ax.set_xscale("log")
    ax.set_xlabel(f"checkpoint interval ({unit})")
    ax.set_ylabel("goodput (%)")
    ax.set_title(title or f"checkpoint {curve.delta_s:g} s, MTBF {curve.mtbf_s / 3600:.3g} h, restart "
                          f"{curve.restart_s:g} s")
    ax.legend(fontsize=8)


def plot_goodput(curve: GoodputCurve, unit: str = "min", title: str | None = None):
    """draw_goodput on a new matplotlib Figure (no pyplot; save it with fig.savefig(path))."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(7.5, 4))
    FigureCanvasAgg(fig)
    draw_goodput(fig.subplots(), curve, unit, title)
    fig.tight_layout()
    return fig
