"""The layouts `distlab plan` searches: every way to place a model on N GPUs that distlab's builders can simulate.

A layout is a mesh (tensor-parallel ``tp`` innermost, so a TP group stays inside a node; context-parallel ``cp``
next, or pipeline ``pp``; data parallel outermost: replicated as DDP ``dp``, sharded as FSDP2 ``dp_shard``, or
both as HSDP ``dp_replicate`` x ``dp_shard``) plus the step's options: micro-batch size, micro-batches per step
(pipelines; without a pipeline, gradient accumulation: a one-stage pipeline whose data-parallel all-reduce follows
the last micro-batch), sequence parallelism, activation recomputation, the pipeline schedule with its virtual
stages (interleaved 1F1B) and its split of the blocks (even, or one block moved off the last stage, which also
holds the head). Global batch B (sequences) = data-parallel degree x micro-batch x micro-batches.

Families (docs/planner.md): DDP x TP, FSDP2 x TP, HSDP x TP, each with or without gradient accumulation (a
one-stage pipeline: FSDP2 / HSDP ones composed by sim/parallel/parallelize.py), PP x TP x DDP with gpipe, 1f1b or
interleaved 1F1B, PP x FSDP2 and PP x HSDP (x TP) built by parallelize with FSDP2 inside the stages, CP x TP x
FSDP2 / HSDP (ring attention, allgather rotation, torchtitan's layout; recompute none or full), and for long
sequences PP x FSDP2 x TP x CP (:func:`cp_in_pipelines`, estimated by sim/planner/stage_cp.py). Stages that do
not divide the blocks take torchtitan's split (first and last stage one block fewer). Not searched: expert
parallelism (only MoE models have it), ZeRO-1/2.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

RECOMPUTE = ("none", "selective", "full")
CP_RECOMPUTE = ("none", "full")            # sim/parallel/cp/plan.py CPOptions.recompute
SCHEDULES = ("1f1b", "gpipe", "interleaved")


@dataclass(frozen=True)
class Layout:
    """One candidate. ``dp_kind`` is "ddp" (replicate), "fsdp" (FSDP2 shard over all dp) or "hsdp" (FSDP2 over
    ``dp_shard`` ranks, replicated dp / dp_shard times); pp = 1 means no pipeline; ``split``: blocks per stage
    (pp x virtual_stages numbers) when not even."""
    tp: int
    pp: int
    dp: int
    dp_kind: str
    micro_batch: int
    microbatches: int
    sequence_parallel: bool
    recompute: str
    schedule: str = "1f1b"
    virtual_stages: int = 1
    split: tuple | None = None
    cp: int = 1
    dp_shard: int = 0
    loss_parallel: bool = False

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def pipelined(self) -> bool:
        """Built as a pipeline: pp > 1, or one stage with micro-batches > 1 (gradient accumulation)."""
        return self.pp > 1 or self.microbatches > 1

    @property
    def shard(self) -> int:
        """Ranks one FSDP2 shard group spans over the data-parallel dimension (1 for DDP)."""
        return {"fsdp": self.dp, "hsdp": self.dp_shard}.get(self.dp_kind, 1)

    @property
    def family(self) -> str:
        """The family a layout belongs to, for "why the best of each family lost" (e.g. "PP x TP x DDP")."""
        pp = ["PP (interleaved)" if self.virtual_stages > 1 else "PP"] if self.pp > 1 else []
        parts = pp + (["CP"] if self.cp > 1 else []) + (["TP"] if self.tp > 1 else [])
        if self.dp > 1 or self.cp > 1 and self.dp_kind != "ddp":
            parts.append(self.dp_kind.upper())
        return " x ".join(parts) or "one GPU"

    @property
    def composed(self) -> bool:
        """Built by sim/parallel/parallelize.py from a scenario with a section per parallelism: FSDP2 / HSDP
        inside pipeline stages (pp > 1, or one stage with gradient accumulation)."""
        return self.pipelined and self.dp_kind != "ddp"

    def mesh(self) -> dict:
        """The scenario's mesh. A data-parallel dimension of size 1 is left out: the runtime would wrap the model
        in DDP (or FSDP2) over one rank, which torch runs differently from no wrapper (the simulator builds both
        alike); ``pp: 1`` stays for gradient accumulation (it selects the one-stage pipeline)."""
        if self.composed:          # torchtitan's order: pp, dp_replicate, dp_shard, cp, tp
            mesh = {"pp": self.pp, "dp_replicate": self.dp // self.shard, "dp_shard": self.shard, "cp": self.cp,
                    "tp": self.tp}
            return {k: v for k, v in mesh.items() if v > 1 or k in ("pp", "tp", "dp_shard")}
        if self.pipelined:
            mesh = {"dp": self.dp, "pp": self.pp, "tp": self.tp}
        elif self.dp_kind == "hsdp":
            mesh = {"dp_replicate": self.dp // self.dp_shard, "dp_shard": self.dp_shard, "cp": self.cp, "tp": self.tp}
        else:
            mesh = {("dp_shard" if self.dp_kind == "fsdp" else "dp"): self.dp, "cp": self.cp, "tp": self.tp}
        return {k: v for k, v in mesh.items() if v > 1 or k in ("tp", "pp") or k == "cp" and self.cp > 1}

    def label(self) -> str:
        """``tp 8 · pp 4 · dp 32 (ddp) · mb 1 x 8 · sp · recompute selective · 1f1b``."""
        dp = f"dp {self.dp} ({self.dp_kind})" if self.dp_kind != "hsdp" else \
            f"dp {self.dp} (hsdp {self.dp // self.dp_shard} x {self.dp_shard})"
        bits = [f"tp {self.tp}"] + ([f"cp {self.cp}"] if self.cp > 1 else [])
        bits += [f"pp {self.pp}", dp, f"mb {self.micro_batch} x {self.microbatches}"]
        bits += (["sp"] if self.sequence_parallel and self.tp > 1 else []) + \
            (["loss parallel"] if self.loss_parallel else []) + [f"recompute {self.recompute}"]
        if self.pp > 1:
            bits.append(self.schedule + (f" v{self.virtual_stages}" if self.virtual_stages > 1 else ""))
            if self.split:
                bits.append("split " + "/".join(map(str, _runs(self.split))))
        elif self.microbatches > 1:
            bits.append("grad accumulation")
        return " · ".join(bits)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["split"] = list(self.split) if self.split else None
        return d

    def to_scenario(self, model: dict, cluster: str, nodes: int, where: str = "plan"):
        """The layout as the typed Scenario (sim/scenario/spec.py), parsed once from :meth:`scenario`: what the
        planner's confirmation simulates and `distlab plan --save` writes."""
        from distlab.sim.scenario.parse import from_dict
        return from_dict(self.scenario(model, cluster, nodes), where)

    def scenario(self, model: dict, cluster: str, nodes: int) -> dict:
        """The scenario mapping as written (a YAML file's; `distlab simulate` and `distlab validate` take it as
        is): a section per parallelism of the layout. :meth:`to_scenario` parses it."""
        head = {"name": f"{model.get('preset', model.get('name', 'model'))} · {self.label()}",
                "model": {**model, "micro_batch": self.micro_batch}, "mesh": self.mesh()}
        if self.composed:          # a section per parallelism (docs/parallelisms.md)
            pipe = {"schedule": self.schedule, "microbatches": self.microbatches}
            if self.virtual_stages > 1:
                pipe["virtual_stages"] = self.virtual_stages
            if self.split:
                pipe["split"] = list(self.split)
            out = {**head, "pipeline": pipe, "fsdp": {"reshard_after_forward": self.pp == 1}}
            if self.cp > 1:
                out["cp"] = {"recompute": self.recompute}
                out["tp"] = {"sequence_parallel": self.sequence_parallel and self.tp > 1}
            else:
                out["tp"] = {"sequence_parallel": self.sequence_parallel and self.tp > 1,
                             "loss_parallel": self.loss_parallel, "recompute": self.recompute}
            return {**out, "cluster": cluster, "nodes": nodes}
        if self.cp > 1:
            return {**head, "cp": {"recompute": self.recompute}, "cluster": cluster, "nodes": nodes}
        tp = {"sequence_parallel": self.sequence_parallel and self.tp > 1, "loss_parallel": self.loss_parallel,
              "recompute": self.recompute,
              "schedule": self.schedule, "microbatches": self.microbatches}
        if self.virtual_stages > 1:
            tp["virtual_stages"] = self.virtual_stages
        if self.split:
            tp["split"] = list(self.split)
        return {**head, "tp": tp, "cluster": cluster, "nodes": nodes}


def _runs(split) -> list[str]:
    """``[10, 10, 11, 9]`` -> ["10x2", "11", "9"]: a split written compactly."""
    out, i = [], 0
    while i < len(split):
        j = i
        while j < len(split) and split[j] == split[i]:
            j += 1
        out.append(f"{split[i]}x{j - i}" if j - i > 1 else str(split[i]))
        i = j
    return out


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


def cp_degrees(config: dict, rest: int, max_cp: int) -> list[int]:
    """CP sizes > 1 dividing ``rest`` ranks whose load-balanced sharding (2 x cp chunks) splits the sequence."""
    return [c for c in divisors(rest) if 1 < c <= max_cp and config["seq_len"] % (2 * c) == 0]


def uneven_splits(blocks: int, stages: int) -> list[tuple]:
    """Splits other than the even one: one block moved off the last stage (it also runs the head and the loss)
    onto the one before it; and one block off the first (embedding) and off the last stage onto their neighbours
    (torchtitan's ``first_stage_less_layers`` / ``last_stage_less_layers`` = 1). None leaves a stage empty."""
    if blocks % stages or blocks // stages < 2 or stages < 2:
        return []
    n = blocks // stages
    out = [tuple([n] * (stages - 2) + [n + 1, n - 1])]
    if stages >= 4:
        out.append(tuple([n - 1, n + 1] + [n] * (stages - 4) + [n + 1, n - 1]))
    return out


def enumerate_layouts(config: dict, world: int, gpus_per_node: int, global_batch: int,
                      micro_batches=(1, 2, 4, 8, 16, 32, 64), max_pp: int | None = None,
                      max_cp: int = 64) -> list[Layout]:
    """Every layout of ``world`` GPUs for global batch ``global_batch`` (sequences) that the builders take.
    ``config`` is the model's config (layers, heads, kv_heads, ffn_hidden, vocab, seq_len). A CP group stays
    inside a node with its TP groups (cp x tp <= GPUs per node: its ring then runs on NVLink, as torchtitan
    places cp next to tp)."""
    layers = config["layers"]
    out = []
    for tp in tp_degrees(config, gpus_per_node):
        if world % tp:
            continue
        for cp in cp_degrees(config, world // tp, min(max_cp, gpus_per_node // tp)):   # in a node, next to tp
            dp = world // (tp * cp)
            if global_batch % dp:
                continue
            for kind, shard in _sharded(dp):
                for rc in CP_RECOMPUTE:
                    out.append(Layout(tp, 1, dp, kind, global_batch // dp, 1, tp > 1, rc, cp=cp, dp_shard=shard))
        lps = (False, True) if tp > 1 else (False,)     # logits sharded on the vocabulary (torch's loss_parallel)
        for pp in divisors(world // tp):
            if pp > (max_pp or layers) or pp > 1 and layers < 2 * pp:
                continue
            dp = world // (tp * pp)
            for mb in micro_batches:
                if global_batch % (dp * mb):
                    continue
                m = global_batch // (dp * mb)
                kinds = [("ddp", 0)] + (_sharded(dp, tp, gpus_per_node) if dp > 1 else [])
                for sp in ((True, False) if tp > 1 else (False,)):
                    for rc in RECOMPUTE:
                        if pp == 1 and m > 1:       # gradient accumulation: a one-stage pipeline
                            out += [Layout(tp, 1, dp, kind, mb, m, sp, rc, "1f1b", dp_shard=shard, loss_parallel=lp)
                                    for kind, shard in kinds for lp in lps]
                        elif pp > 1:
                            for sched, v, split in pipeline_shapes(layers, pp, m):
                                # FSDP2 inside stages with 1F1B and interleaved 1F1B of v <= 4 (torchtitan's
                                # schedules for it; kept to these to bound the search: GPipe holds every
                                # micro-batch's activations, and DDP pipelines keep GPipe and every v)
                                out += [Layout(tp, pp, dp, kind, mb, m, sp, rc, sched, v, split, dp_shard=shard,
                                               loss_parallel=lp) for kind, shard in kinds for lp in lps
                                        if kind == "ddp" or sched != "gpipe" and v <= 4]
                        else:
                            out += [Layout(tp, 1, dp, kind, mb, 1, sp, rc, dp_shard=shard, loss_parallel=lp)
                                    for kind, shard in kinds for lp in lps]
    if config["seq_len"] >= CP_IN_PIPELINE_FROM:
        out += cp_in_pipelines(config, world, gpus_per_node, global_batch, micro_batches, max_pp)
    return _dedupe(out)


CP_IN_PIPELINE_FROM = 32768    # tokens per sequence from which CP is searched inside pipelines (long context)
MAX_CP_IN_PIPELINE = 16        # Llama 3 405B's long-context CP (arXiv 2407.21783 Table 4 row 3)


def cp_in_pipelines(config: dict, world: int, gpus_per_node: int, global_batch: int,
                    micro_batches=(1, 2, 4, 8, 16, 32, 64), max_pp: int | None = None) -> list[Layout]:
    """PP x FSDP2 x TP x CP layouts (torchtitan's mesh pp, dp_shard, cp, tp; FSDP2 over dp_shard x cp) for long
    sequences: Llama 3 ran CP only in its long-context stage (arXiv 2407.21783 sec. 3.3.2: 131,072 tokens, CP 16
    across nodes with TP 8, PP 16, FSDP 8). CP up to 16, across nodes; sequence parallelism on; recompute none
    or full (CP's); 1F1B and interleaved 1F1B v2 (torchtitan's schedules), FSDP2 over all data-parallel ranks."""
    layers, out = config["layers"], []
    for tp in tp_degrees(config, gpus_per_node):
        if world % tp:
            continue
        for cp in cp_degrees(config, world // tp, MAX_CP_IN_PIPELINE):
            for pp in divisors(world // (tp * cp)):
                if pp < 2 or pp > (max_pp or layers) or layers < 2 * pp:
                    continue
                dp = world // (tp * cp * pp)
                for mb in micro_batches:
                    if global_batch % (dp * mb):
                        continue
                    m = global_batch // (dp * mb)
                    for sched, v, split in pipeline_shapes(layers, pp, m):
                        if sched == "gpipe" or v > 2:
                            continue
                        out += [Layout(tp, pp, dp, "fsdp", mb, m, tp > 1, rc, sched, v, split, cp=cp, dp_shard=dp)
                                for rc in CP_RECOMPUTE]
    return out


def pipeline_shapes(layers: int, pp: int, m: int) -> list[tuple]:
    """(schedule, virtual stages, split) of a pipeline of ``pp`` stages and ``m`` micro-batches over ``layers``
    blocks: 1F1B, GPipe and interleaved 1F1B with every v dividing the blocks per stage, each with its even split
    and the uneven ones (:func:`uneven_splits`); when the stages do not divide the blocks, torchtitan's split
    (the first and last stage one block fewer, sim/parallel/pipeline/split.py; Llama 3 405B's 126 blocks on 16
    stages: 7 + 14 x 8 + 7), v 1 and 2. Schedules torch refuses for (pp, m, v) are left out."""
    from distlab.sim.errors import ConfigError
    from distlab.sim.parallel.pipeline import schedules as S
    from distlab.sim.parallel.pipeline.split import stage_split
    if layers % pp == 0:
        shapes = [("1f1b", 1), ("gpipe", 1)] + [("interleaved", v) for v in divisors(layers // pp) if v > 1]
    else:
        shapes = [("1f1b", 1), ("gpipe", 1)] + ([("interleaved", 2)] if layers >= 4 * pp else [])
    out = []
    for sched, v in shapes:
        try:
            S.check(sched, pp, m, v)
        except ConfigError:
            continue              # e.g. torch's Schedule1F1B refuses fewer micro-batches than stages
        if layers % (pp * v) == 0:
            out += [(sched, v, split) for split in [None] + uneven_splits(layers, pp * v)]
        else:
            try:
                out.append((sched, v, tuple(stage_split(layers, pp * v))))
            except ConfigError:
                continue
    return out


def _sharded(dp: int, tp: int = 0, gpus_per_node: int = 0) -> list[tuple[str, int]]:
    """FSDP2 over all dp ranks, and HSDP with every shard group size strictly between 1 and dp; with ``tp`` and
    ``gpus_per_node`` (inside pipelines) only shard groups that tile nodes (s x tp divides the node or is a
    multiple of it), as HSDP is run: sharded over a node's or a few nodes' fast links, replicated across them."""
    whole = [s for s in divisors(dp) if 1 < s < dp and (not gpus_per_node or s * tp % gpus_per_node == 0
                                                         or gpus_per_node % (s * tp) == 0)]
    return [("fsdp", dp)] + [("hsdp", s) for s in whole]


def _dedupe(layouts: list) -> list:
    seen, out = set(), []
    for L in layouts:
        if L not in seen:
            seen.add(L)
            out.append(L)
    return out


def batch_suggestions(world: int, global_batch: int, tps: list[int], layers: int, count: int = 2) -> list[int]:
    """Global batches near ``global_batch`` that some layout divides (for the bad-input message)."""
    def ok(b: int) -> bool:
        return any(b % (world // (tp * pp)) == 0 for tp in tps if world % tp == 0
                   for pp in divisors(world // tp) if pp == 1 or layers >= 2 * pp)
    below = [b for b in range(global_batch - 1, 0, -1) if ok(b)][:count]
    above = [b for b in range(global_batch + 1, 4 * global_batch + world + 1) if ok(b)][:count]
    return sorted(below + above)
