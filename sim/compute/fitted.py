"""The compute model's only fitted numbers: per GPU generation, at most two constants fitted on at most two named
published rows (sim/reproduce/runs.yaml); every other number of the model is measured (sim/compute/gpus.py).

    >>> from distlab.sim.compute.fitted import FITTED
    >>> FITTED["ampere"].fitted_on
    ('megatron-1.7b', 'megatron-145.6b')

``sustained`` (fitted): the fraction of the micro-benchmarks' kernel throughput (GEMMs, attention) a training job
sustains. The measurements behind sim/compute/gpus.py are short loops of one kernel; a training step runs for
seconds to minutes at the power limit, so the clocks settle lower (an H100 SXM's bf16 peak is quoted at its 1830
MHz boost; nvidia-smi shows lower clocks under sustained tensor-core load), and the kernels of a real step leave
gaps the loops do not (allocator, dataloader, Python). It multiplies the throughput of GEMMs and attention; HBM
traffic, launches and communication are untouched.

``kernel_gap_s`` (fitted): the extra time between the kernels of a real step beyond the measured launch cost,
paid per kernel. 0 where a generation's rows do not call for it.

A generation without a published row in the runs file keeps sustained 1 and kernel_gap_s 0: its predictions are
the micro-benchmarks' (an upper bound on throughput), and `distlab simulate` says so.
`benchmarks/reproduce_accuracy.py --fit` refits them and prints the values to write here.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fitted:
    sustained: float = 1.0          # fitted
    kernel_gap_s: float = 0.0       # fitted
    fitted_on: tuple[str, ...] = ()


FITTED = {
    # fitted: benchmarks/reproduce_accuracy.py --fit, mean log error 0 over the two rows
    "ampere": Fitted(sustained=0.6923, kernel_gap_s=0.0, fitted_on=("megatron-1.7b", "megatron-145.6b")),
    # fitted: the one H100 row expressible today (the other Megatron-Core rows need --tp-comm-overlap)
    "hopper": Fitted(sustained=0.5254, kernel_gap_s=0.0, fitted_on=("mcore-h100-1.7b",)),
    "blackwell": Fitted(),
    "ada": Fitted(),
}


def constants(generation: str | None) -> Fitted:
    """The generation's fitted constants (1 and 0 for a generation without rows or an unknown one)."""
    return FITTED.get(generation or "", Fitted())
