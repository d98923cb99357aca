"""How many transformer blocks each pipeline stage holds: step 1 of sim/parallel/parallelize.py.

    torchtitan_split(126, 16)          -> [7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7]    # Llama 3 405B
    stage_split(32, 4)                 -> None (an even split: 8 each)
    stage_split(126, 16)               -> torchtitan_split(126, 16)
    stage_split(32, 4, less=[1, 1])    -> [8, 9, 8, 7]

The rule (torchtitan/distributed/pipeline_parallel.py ``generate_llm_fqn_per_model_part``): the embedding counts
as ``first`` blocks and the final norm with the output layer as ``last`` blocks (torchtitan's
``pipeline_parallel_first_stage_less_layers`` and ``..._last_stage_less_layers``, 1 each by default); the
L + first + last effective blocks are dealt out evenly, the first (L + first + last) mod S stages one more;
stage 0 then holds ``first`` blocks fewer and the last stage ``last`` fewer. Llama 3 405B's 126 layers on 16
stages give 7 + 14 x 8 + 7: "we balance the pipeline by reducing one Transformer layer each from the first and
the last stages" (Llama Team 2024, arXiv 2407.21783, sec. 3.3.2).

``stage_split(blocks, stages, split, less)``: an explicit ``split`` as given; ``less`` = [first, last] by
torchtitan's rule; neither: an even split when the stages divide the blocks (the pipeline builders' default,
sim/parallel/pipeline/plan.py), else torchtitan's rule with its defaults [1, 1].
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError


def torchtitan_split(blocks: int, stages: int, first: int = 1, last: int = 1, where: str = "pipeline") -> list[int]:
    """Blocks per stage by torchtitan's rule (module docstring); a ConfigError when a stage would be empty."""
    if stages == 1:
        return [blocks]
    effective = blocks + first + last
    per, extra = divmod(effective, stages)
    if per == 0 or first > per or last > per:
        raise ConfigError(f"{blocks} blocks do not fill {stages} stages when the first holds {first} and the last "
                          f"{last} fewer (torchtitan's pipeline split); allowed: at most {blocks + first + last} "
                          f"stages, with first and last <= blocks per stage", f"{where}.stage_less_layers")
    out = [per + (1 if s < extra else 0) for s in range(stages)]
    out[0] -= first
    out[-1] -= last                       # sum(out) = blocks
    if min(out) < 1:
        raise ConfigError(f"torchtitan's split of {blocks} blocks over {stages} stages leaves a stage without a "
                          f"block ({out}); allowed: fewer stages or smaller stage_less_layers",
                          f"{where}.stage_less_layers")
    return out


def stage_split(blocks: int, stages: int, split: list[int] | None = None, less: list[int] | None = None,
                where: str = "pipeline") -> list[int] | None:
    """The blocks per stage a pipeline spec takes (None: an even split); see the module docstring."""
    if split is not None:
        if less is not None:
            raise ConfigError("give either split or stage_less_layers, not both", f"{where}.split")
        return split
    if less is not None:
        if len(less) != 2 or any(k < 0 for k in less):
            raise ConfigError(f"stage_less_layers {less} must be two whole numbers >= 0: [first, last]",
                              f"{where}.stage_less_layers")
        return torchtitan_split(blocks, stages, less[0], less[1], where)
    if blocks % stages == 0:
        return None
    return torchtitan_split(blocks, stages, 1, 1, where)
