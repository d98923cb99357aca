"""What each era's training software ran, for `distlab plan --as-published ERA`: the search keeps only the
layouts that software could build, so a plan can be held against the runs published with it.

    >>> from distlab.sim.planner.eras import ERAS
    >>> from distlab.sim.planner.layouts import Layout
    >>> ERAS["megatron-2021"].allows(Layout(8, 8, 16, "ddp", 1, 64, False, "full", "interleaved", 2))
    True

Per era, the features and where they are documented (a layout is allowed when every feature it uses is listed):

- ``megatron-2021``: Megatron-LM as in Narayanan et al. 2021 (SC21, arXiv 2104.04473): tensor parallelism in a
  node (sec. 2.3), pipeline parallelism with 1F1B and the interleaved 1F1B schedule (sec. 2.2, blocks split
  evenly), data parallelism replicating the model (all-reduce), full activation recomputation or none (sec.
  3.5), the vocabulary-parallel cross-entropy (Shoeybi et al. 2019, sec. 3: loss parallel). Not yet: sequence
  parallelism and selective recomputation (Korthikanti et al. 2022), sharded data parallelism, context
  parallelism.
- ``megatron-2022``: the above plus sequence parallelism and selective activation recomputation (Korthikanti et
  al. 2022, arXiv 2205.05198, sec. 4.2.2 and 5).
- ``llama3-2024``: Llama 3's 4D parallelism (Llama Team 2024, arXiv 2407.21783, sec. 3.3.2): TP, CP, PP and
  FSDP (parameters, gradients and optimizer state sharded; "we do not reshard after forward"), an interleaved
  schedule with the first and last stage holding fewer blocks, all-gather based CP; DDP-only data parallelism is
  not what it ran.
- ``torchtitan-2024``: torchtitan (Liang et al. 2024, arXiv 2410.06511, sec. 2-3): FSDP2 and HSDP, TP with
  sequence and loss parallelism, PP (1F1B, GPipe, interleaved 1F1B; first/last stage fewer blocks), CP, selective
  and full activation checkpointing, gradient accumulation; DDP only on its own (``apply_ddp``: no other
  parallelism with it).
"""
from __future__ import annotations

from dataclasses import dataclass

from distlab.sim.planner.layouts import Layout


@dataclass(frozen=True)
class Era:
    """A software generation: what it offered (module docstring) and its source."""
    name: str
    source: str
    sharded_dp: bool           # FSDP / HSDP / ZeRO-3
    replicated_dp: bool        # DDP-style all-reduce data parallelism with other parallelisms
    sequence_parallel: bool
    recompute: tuple
    context_parallel: bool
    uneven_split: bool
    schedules: tuple

    def allows(self, L: Layout) -> bool:
        if L.dp > 1 and L.dp_kind != "ddp" and not self.sharded_dp:
            return False
        if L.dp > 1 and L.dp_kind == "ddp" and not self.replicated_dp and (L.tp > 1 or L.pp > 1):
            return False
        if L.sequence_parallel and L.tp > 1 and not self.sequence_parallel:
            return False
        if L.recompute not in self.recompute or (L.cp > 1 and not self.context_parallel):
            return False
        if L.pp > 1 and (L.schedule not in self.schedules or (L.split is not None and not self.uneven_split)):
            return False
        return True


ERAS = {e.name: e for e in (
    Era("megatron-2021", "Narayanan et al. 2021, arXiv 2104.04473 (Megatron-LM, SC21)", False, True, False,
        ("none", "full"), False, False, ("1f1b", "interleaved")),
    Era("megatron-2022", "Korthikanti et al. 2022, arXiv 2205.05198 (sequence parallelism, selective recompute)",
        False, True, True, ("none", "selective", "full"), False, False, ("1f1b", "interleaved")),
    Era("llama3-2024", "Llama Team 2024, arXiv 2407.21783 sec. 3.3.2 (4D parallelism)", True, False, True,
        ("none", "selective", "full"), True, True, ("1f1b", "interleaved")),
    Era("torchtitan-2024", "Liang et al. 2024, arXiv 2410.06511 (torchtitan)", True, False, True,
        ("none", "selective", "full"), True, True, ("1f1b", "gpipe", "interleaved")),
)}
