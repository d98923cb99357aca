"""The layouts `distlab plan` searches: every way to place a model on N GPUs that distlab's builders can simulate.

A layout is a mesh (tensor-parallel ``tp`` innermost, so a TP group stays inside a node; pipeline ``pp`` next;
data parallel outermost, replicated as DDP ``dp`` or sharded as FSDP2 ``dp_shard``) plus the step's options:
micro-batch size, micro-batches per step (pipelines; without a pipeline, gradient accumulation: a one-stage
pipeline whose data-parallel all-reduce follows the last micro-batch), sequence parallelism, activation recomputation and
the pipeline schedule. Global batch B (sequences) = data-parallel degree x micro-batch x micro-batches.

Families the builders compose (sim/workloads/tp.py): DDP x TP, FSDP2 x TP, PP x TP x DP (DDP replicas of the
pipeline). Context and expert parallelism, ZeRO-1/2 and interleaved pipelines join the search as the builders
gain them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe")


@dataclass(frozen=True)
class Layout:
    """One candidate. ``dp_kind`` is "ddp" (replicate) or "fsdp" (FSDP2 shard); pp = 1 means no pipeline."""
    tp: int
    pp: int
    dp: int
    dp_kind: str
    micro_batch: int
    microbatches: int
    sequence_parallel: bool
    recompute: str
    schedule: str = "1f1b"

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def pipelined(self) -> bool:
        """Built as a pipeline: pp > 1, or one stage with micro-batches > 1 (gradient accumulation)."""
        return self.pp > 1 or self.microbatches > 1

    @property
    def family(self) -> str:
        """The family a layout belongs to, for "why the best of each family lost" (e.g. "PP x TP x DDP")."""
        parts = (["PP"] if self.pp > 1 else []) + (["TP"] if self.tp > 1 else [])
        if self.dp > 1:
            parts.append("FSDP" if self.dp_kind == "fsdp" else "DDP")
        return " x ".join(parts) or "one GPU"

    def mesh(self) -> dict:
        """The scenario's mesh. A data-parallel dimension of size 1 is left out: the runtime would wrap the model
        in DDP (or FSDP2) over one rank, which torch runs differently from no wrapper (the simulator builds both
        alike); ``pp: 1`` stays for gradient accumulation (it selects the one-stage pipeline)."""
        if self.pipelined:
            mesh = {"dp": self.dp, "pp": self.pp, "tp": self.tp}
        else:
            mesh = {("dp_shard" if self.dp_kind == "fsdp" else "dp"): self.dp, "tp": self.tp}
        return {k: v for k, v in mesh.items() if v > 1 or k in ("tp", "pp")}

    def label(self) -> str:
        """``tp 8 · pp 4 · dp 32 (ddp) · mb 1 x 8 · sp · recompute selective · 1f1b``."""
        bits = [f"tp {self.tp}", f"pp {self.pp}", f"dp {self.dp} ({self.dp_kind})",
                f"mb {self.micro_batch} x {self.microbatches}"]
        bits += (["sp"] if self.sequence_parallel and self.tp > 1 else []) + [f"recompute {self.recompute}"]
        if self.pp > 1:
            bits.append(self.schedule)
        elif self.microbatches > 1:
            bits.append("grad accumulation")
        return " · ".join(bits)

    def to_dict(self) -> dict:
        return asdict(self)

    def scenario(self, model: dict, cluster: str, nodes: int) -> dict:
        """The scenario `distlab simulate` and `distlab validate` take as is."""
        return {"name": f"{model.get('preset', model.get('name', 'model'))} · {self.label()}",
                "model": {**model, "micro_batch": self.micro_batch}, "mesh": self.mesh(),
                "tp": {"sequence_parallel": self.sequence_parallel and self.tp > 1, "recompute": self.recompute,
                       "schedule": self.schedule, "microbatches": self.microbatches},
                "cluster": cluster, "nodes": nodes}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_degrees(config: dict, gpus_per_node: int) -> list[int]:
    """TP sizes that keep a TP group inside a node and divide what the plan shards (heads, kv_heads, the FFN
    width; the vocabulary is padded by torchtitan's plan only where it divides: required here)."""
    keep = []
    for t in divisors(gpus_per_node):
        if all(config.get(k) is None or config[k] % t == 0 for k in ("heads", "kv_heads", "ffn_hidden", "vocab")):
            keep.append(t)
    return keep


def enumerate_layouts(config: dict, world: int, gpus_per_node: int, global_batch: int,
                      micro_batches=(1, 2, 4, 8, 16), max_pp: int | None = None) -> list[Layout]:
    """Every layout of ``world`` GPUs for global batch ``global_batch`` (sequences) that the builders take.
    ``config`` is the model's config (layers, heads, kv_heads, ffn_hidden, vocab)."""
    layers = config["layers"]
    out = []
    for tp in tp_degrees(config, gpus_per_node):
        if world % tp:
            continue
        for pp in divisors(world // tp):
            if layers % pp or pp > (max_pp or layers):
                continue                      # stages split the blocks evenly (the builders' default split)
            dp = world // (tp * pp)
            for mb in micro_batches:
                if global_batch % (dp * mb):
                    continue
                m = global_batch // (dp * mb)
                for sp in ((True, False) if tp > 1 else (False,)):
                    for rc in RECOMPUTE:
                        if pp == 1 and m > 1:       # gradient accumulation (DDP; one stage)
                            out.append(Layout(tp, 1, dp, "ddp", mb, m, sp, rc, "1f1b"))
                        elif pp > 1:
                            for sched in SCHEDULES:
                                if sched == "1f1b" and m < pp:
                                    continue  # torch's Schedule1F1B refuses fewer micro-batches than stages
                                out.append(Layout(tp, pp, dp, "ddp", mb, m, sp, rc, sched))
                        else:
                            for kind in (("ddp", "fsdp") if dp > 1 else ("ddp",)):
                                out.append(Layout(tp, 1, dp, kind, mb, 1, sp, rc))
    return out


def batch_suggestions(world: int, global_batch: int, tps: list[int], layers: int, count: int = 2) -> list[int]:
    """Global batches near ``global_batch`` that some layout divides (for the bad-input message)."""
    def ok(b: int) -> bool:
        return any(b % (world // (tp * pp)) == 0 for tp in tps if world % tp == 0
                   for pp in divisors(world // tp) if layers % pp == 0)
    below = [b for b in range(global_batch - 1, 0, -1) if ok(b)][:count]
    above = [b for b in range(global_batch + 1, 4 * global_batch + world + 1) if ok(b)][:count]
    return sorted(below + above)
