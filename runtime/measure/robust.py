"""Robust estimates from repeated timings: one module for every quantity distlab fits from measurements.

Timings on a shared machine have a slow tail: another process takes the core for a while and a few samples come
out several times slower. A mean or least squares follows them; these estimators do not.

- ``center``: the median of medians (groups of GROUP consecutive samples, the median of each, then the median of
  those; Blum, Floyd, Pratt, Rivest & Tarjan 1973 use the same construction for selection). Breakdown: a group's
  median holds while fewer than half its samples are outliers, and the result while fewer than half the groups
  are spoiled, so well over 20% scattered outliers leave it on the clean samples.
- ``spread``: the robust coefficient of variation 1.4826 x MAD / median (MAD = median absolute deviation; 1.4826
  makes it the standard deviation for normal noise; Rousseeuw & Croux 1993).
- ``line``: t = a + b x by iteratively reweighted least squares (IRLS) on relative residuals r = (a + b x - t) / t
  with Tukey's bisquare weights w = (1 - (r / (4.685 s))^2)^2 for |r| < 4.685 s, else 0, s = max(1.4826 MAD(r),
  FLOOR) (Holland & Welsch 1977; Huber, "Robust Statistics" 1981, ch. 7). On clean data every weight is about 1
  and the fit is the relative-error least squares runtime/measure/fit.py always used; an outlier gets weight 0.
- ``reject``: values farther than K MADs from the median replaced by the median (for a handful of repeated fits
  of one quantity, e.g. the per-action overhead of several probes).
A fit whose spread exceeds SPREAD_WARN says so in one line (``warning``) with what to do.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP = 3             # samples per group of the median of medians
MAD_TO_SIGMA = 1.4826
BISQUARE = 4.685
FLOOR = 0.01          # the smallest residual scale IRLS assumes (1%: timings are never more exact)
K_REJECT = 3.0
SPREAD_WARN = 0.15    # robust CV above which a fit is called noisy


@dataclass
class Estimate:
    """A robust value of repeated samples, its spread (robust CV) and the sample count."""
    value: float
    spread: float
    samples: int

    def to_dict(self) -> dict:
        return {"value": self.value, "spread": round(self.spread, 4), "samples": self.samples}


def center(samples) -> float:
    """Median of medians of consecutive groups of GROUP samples (a last short group counts as one group)."""
    x = np.asarray(list(samples), dtype=float)
    if x.size == 0:
        raise ValueError("no samples")
    if x.size < 2 * GROUP:
        return float(np.median(x))
    return float(np.median([np.median(x[i:i + GROUP]) for i in range(0, x.size, GROUP)]))


def spread(samples, around: float | None = None) -> float:
    """1.4826 x MAD / median (0 for fewer than 2 samples)."""
    x = np.asarray(list(samples), dtype=float)
    if x.size < 2:
        return 0.0
    m = float(np.median(x)) if around is None else around
    return float(MAD_TO_SIGMA * np.median(np.abs(x - m)) / abs(m)) if m else 0.0


def estimate(samples) -> Estimate:
    x = list(samples)
    c = center(x)
    return Estimate(c, spread(x, c), len(x))


def reject(values, k: float = K_REJECT) -> list[float]:
    """``values`` with those farther than k x 1.4826 MAD from their median replaced by the median (needs 3)."""
    x = np.asarray(list(values), dtype=float)
    if x.size < 3:
        return x.tolist()
    m = float(np.median(x))
    scale = MAD_TO_SIGMA * float(np.median(np.abs(x - m)))
    if scale == 0:          # most values equal: the others are outliers, unless the median is a clip at 0
        return x.tolist() if m == 0 else [m if v != m else v for v in x.tolist()]
    return [m if abs(v - m) > k * scale else v for v in x.tolist()]


def _weighted_line(s, t, w) -> tuple[float, float]:
    """(a, b) minimising sum w ((a + b s - t) / t)^2; a >= 0 (else the line through the origin)."""
    rw = np.sqrt(w) / t
    A = np.stack([np.ones_like(s), s], axis=1) * rw[:, None]
    (a, b), *_ = np.linalg.lstsq(A, t * rw, rcond=None)
    if a < 0 or b <= 0:
        a = 0.0
        b = float(np.sum(w * s / t) / np.sum(w * (s / t) ** 2))
    return float(a), float(b)


def line(xs, ts, iterations: int = 20) -> tuple[float, float, float]:
    """(a, b, spread) of t = a + b x by IRLS with bisquare weights on relative residuals (module docstring);
    spread = 1.4826 x median |relative residual| of the final line."""
    s, t = np.asarray(xs, dtype=float), np.asarray(ts, dtype=float)
    w = np.ones_like(s)
    a, b = _weighted_line(s, t, w)
    for _ in range(iterations):
        r = (a + b * s - t) / t
        scale = max(MAD_TO_SIGMA * float(np.median(np.abs(r))), FLOOR)
        u = r / (BISQUARE * scale)
        w_new = np.where(np.abs(u) < 1, (1 - u ** 2) ** 2, 0.0)
        if len(set(s[w_new > 0].tolist())) < 2:
            break
        if np.allclose(w_new, w):
            break
        w = w_new
        a, b = _weighted_line(s, t, w)
    r = (a + b * s - t) / t
    return a, b, float(MAD_TO_SIGMA * np.median(np.abs(r)))


def warning(what: str, spread_value: float, advice: str = "re-run on a quieter machine or with more iterations "
            "(--iters)") -> str | None:
    """One line when ``spread_value`` exceeds SPREAD_WARN, else None."""
    if spread_value <= SPREAD_WARN:
        return None
    return (f"warning: {what}: timings scatter by {spread_value:.0%} (robust CV, limit {SPREAD_WARN:.0%}), "
            f"so this fit is uncertain; {advice}")


def median_noise(samples) -> float:
    """How far the median of ``samples`` moves by chance, relative to it: its standard error, 1.2533 sigma /
    sqrt(n) for normal noise (the median's asymptotic variance, pi sigma^2 / (2 n); Kenney & Keeping,
    "Mathematics of Statistics", 1962), with sigma the robust 1.4826 MAD (``spread``), so a
    few slow repeats count as what they are, a tail."""
    return 1.2533 * spread(samples) / len(samples) ** 0.5
