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

``elementwise_passes`` (fitted): the elementwise kernels of a transformer block that the builders do not emit one by
one (bias, activation, dropout, residual adds, rotary embedding, casts), as HBM passes over the block's
hidden-sized activations: a block whose attention call is (b, local heads, s, d) pays elementwise_passes x
b·s·heads·d x bytes per element at the measured HBM rate in its forward, twice that in its backward (three times
with the forward recomputed). Their cost grows with s·h per layer while the block's GEMMs grow with s·h², so a
small-hidden model reaches a lower MFU than a large one on the same GPU (Megatron-Core's H100 table: 41% at
hidden 2048, 47% at 4096, 49% at 6144; MFU = c / (1 + k/h) fits all three). 0 where a generation does not fit it.

``fitted_constants`` names the constants fitted for the generation (at most two); the others keep their defaults.
A generation without a published row in the runs file keeps sustained 1 and elementwise_passes 0: its predictions are
the micro-benchmarks' (an upper bound on throughput), and `distlab simulate` says so.
`benchmarks/reproduce_accuracy.py --fit` refits them and prints the values to write here.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fitted:
    sustained: float = 1.0          # fitted
    elementwise_passes: float = 0.0  # fitted
    fitted_on: tuple[str, ...] = ()
    fitted_constants: tuple[str, ...] = ("sustained",)


FITTED = {
    # fitted: benchmarks/reproduce_accuracy.py --fit, mean log error 0 over the two rows (+0.1% since split-K)
    "ampere": Fitted(sustained=0.6923, fitted_on=("megatron-1.7b", "megatron-145.6b")),
    # fitted: benchmarks/reproduce_accuracy.py --fit, both rows' log errors 0 (Megatron-Core's two smallest rows,
    # hidden 2048 at tp 1 and hidden 4096 at tp 2 with --tp-comm-overlap)
    "hopper": Fitted(sustained=0.9576, elementwise_passes=124.663, fitted_on=("mcore-h100-1.7b", "mcore-h100-7.1b"),
                     fitted_constants=("sustained", "elementwise_passes")),
    # fitted: benchmarks/reproduce_accuracy.py --fit, both rows' log errors 0 (NeMo 25.11 / 26.02 on GB200: Llama 3
    # 8B with TE current scaling, hidden 4096 at dp 8; Llama 3 70B with MXFP8, hidden 8192 at tp 2 x pp 4)
    "blackwell": Fitted(sustained=0.6611, elementwise_passes=15.597,
                        fitted_on=("nemo-gb200-llama3-8b-fp8cs", "nemo-gb200-llama3-70b-mxfp8"),
                        fitted_constants=("sustained", "elementwise_passes")),
    "ada": Fitted(),
}


def constants(generation: str | None) -> Fitted:
    """The generation's fitted constants (1 and 0 for a generation without rows or an unknown one)."""
    return FITTED.get(generation or "", Fitted())
