"""The old path of one rank's entry point, kept for torchrun command lines in job scripts (docs/extending.md):

    torchrun --nproc-per-node 4 -m distlab.runtime.worker PLAN.json --out measured.trace      # old path, works

runs exactly ``-m distlab.runtime.ranks.worker``, where the rank now lives (runtime/ranks/worker.py).
"""
from __future__ import annotations

from distlab.runtime.ranks.worker import main

if __name__ == "__main__":
    main()
