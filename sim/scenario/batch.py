"""The global batch of a scenario (sequences per optimizer step) and the micro-batches it implies.

    distlab simulate --mesh pp=4,dp_shard=2 --micro-batch 2 --global-batch 64    # m = 64 / (2 x 2) = 16

The rule (Megatron-LM's, sim/reproduce/runs.py): global batch = data-parallel ranks x micro-batch x micro-batches
per step, the data-parallel ranks being those of the batch dimensions (dp, dp_shard, dp_replicate, ep; sim/result.py
BATCH_DIMS). With a pipeline and no micro-batches written, m = global batch / (dp x micro-batch), which must be
whole and at least pp (fewer leave a stage with nothing to do); without a global batch m defaults to 2 x pp x
virtual stages (sim/parallel/pipeline/plan.py). Without a pipeline the global batch must equal dp x micro-batch
(x grad_accum for DDP): it checks the layout, it does not change it.
"""
from __future__ import annotations

from dataclasses import replace

from distlab.sim.errors import ConfigError

BATCH_DIMS = ("dp", "dp_shard", "dp_replicate", "ep")       # as sim/result.py: ranks holding different sequences
MAX_GLOBAL_BATCH = 2**24                                     # a bound against typos (16M sequences)


def check_value(value, where: str) -> None:
    """A written global batch: a whole number from 1 to MAX_GLOBAL_BATCH."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 1 <= value <= MAX_GLOBAL_BATCH):
        raise ConfigError(f"{value!r} must be a whole number from 1 to {MAX_GLOBAL_BATCH:,} (sequences per "
                          "optimizer step)", where)


def micro_batch_of(d: dict, where: str) -> int:
    """The micro-batch a scenario mapping trains: written, or its model's default."""
    from distlab.sim.models import model_from_spec
    spec = {"preset": d["model"]} if isinstance(d["model"], str) else dict(d["model"])
    written = spec.get("batch" if spec.get("kind") == "mlp" else "micro_batch")
    if written is not None:
        return written
    cfg = model_from_spec(spec, f"{where}: model").config or {}
    return cfg.get("micro_batch", cfg.get("batch", 1))


def apply(options, mesh, global_batch: int, micro: int, flag: str):
    """``options`` (a workload's options, or a composition's Parallelisms) with the micro-batches the global batch
    implies (module docstring); ConfigError naming ``flag`` when they do not come out whole or the layout's
    batch differs."""
    dp = 1
    for dim in BATCH_DIMS:
        if dim in mesh:
            dp *= mesh.size(dim)
    nested = getattr(options, "pipeline", None) is not None        # a composition's pipeline
    owner = options.pipeline if nested else options
    if "pp" in mesh and hasattr(owner, "microbatches"):
        pp, v = mesh.size("pp"), getattr(owner, "virtual_stages", 1) or 1
        per_step = dp * micro
        if owner.microbatches is not None:
            if owner.microbatches * per_step != global_batch:
                raise ConfigError(f"{global_batch} is not dp {dp} x micro-batch {micro} x microbatches "
                                  f"{owner.microbatches} = {owner.microbatches * per_step}; give one of them",
                                  flag)
            return options
        m, rest = divmod(global_batch, per_step)
        if rest or m < pp:
            why = f"is not dp {dp} x micro-batch {micro} x m" if rest else \
                f"/ (dp {dp} x micro-batch {micro}) = {m} < pp {pp}"
            allowed = ", ".join(str(per_step * k) for k in (pp, pp + 1))
            raise ConfigError(f"{global_batch} {why}; allowed: {allowed}, ...", flag)
        owner = replace(owner, microbatches=m)
        return replace(options, pipeline=owner) if nested else owner
    accum = getattr(options, "grad_accum", None) or 1
    if dp * micro * accum != global_batch:
        accum_words = f" x grad_accum {accum}" if accum > 1 else ""
        raise ConfigError(f"{global_batch} is not dp {dp} x micro-batch {micro}{accum_words} = "
                          f"{dp * micro * accum} (no pipeline)", flag)
    return options
