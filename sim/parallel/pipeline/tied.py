"""Tied embeddings under pipeline parallelism: the gradient all-reduce between the first and the last stage.

GPT-2 (Radford et al. 2019) ties its output head to the token embedding: ``logits = h @ wte.T``. Cut into
stages, the embedding sits on the first stage and the head on the last (Megatron-LM's placement, and
plan.stage_ranges'), so the last stage holds its own copy of ``wte`` (V x h). Each copy gets only its own
part of the gradient, so before the optimizer step the two are summed, or the copies drift apart.

- Megatron-LM all-reduces them over the *embedding group*, the first and last pipeline rank of each pipeline,
  after the data-parallel gradient reduction (``megatron/core/distributed/finalize_model_grads.py``,
  ``_allreduce_word_embedding_grads``, called by ``finalize_model_grads``: "Reduce grads across first and last
  stages to ensure that word_embeddings parameters stay in sync").
- torch 2.13's ``torch.distributed.pipelining`` does nothing of the kind: its tracer (``pipeline()``) copies a
  parameter used by several stages into each of them (``MultiUseParameterConfig.REPLICATE``, "Gradients for
  these shared parameters will be accumulated separately on each stage", ``_IR.py``; its TODO still reads
  "investigate gradient sync for shared parameters"), and a ``PipelineStage`` built by hand owns only its
  module. With torch you all-reduce the two copies' gradients yourself, as Megatron does.

Cost: one all_reduce of V·h·dtype bytes over 2 ranks on the ``comm`` stream, after the rank's last backward
action (so also after its data-parallel all-reduce), once per step. When both stages sit on one rank (ZBV's V
puts stage 2p-1 back on rank 0; p = 1) the tied weight is one tensor and nothing is sent.
"""
from __future__ import annotations

from dataclasses import dataclass

from distlab.sim.plan import Collective, Record, Wait

TOKEN_EMBEDDING = "embed.tok.weight"


@dataclass(frozen=True)
class TiedEmbedding:
    first_rank: int          # pipeline rank holding the first stage (the embedding)
    last_rank: int           # pipeline rank holding the last stage (the head, with its copy of the embedding)
    bytes: int               # V·h·dtype: the gradient all-reduced between them
    dtype: str


def ties_embeddings(model) -> bool:
    """GPT-2 style models (sim.models.gpt with arch="gpt2") tie the head to the token embedding."""
    cfg = model.config or {}
    return cfg.get("kind") == "gpt" and cfg.get("tied_embeddings", cfg.get("arch") == "gpt2")


def tied_embedding(model, placement: list[int]) -> TiedEmbedding | None:
    """The embedding group of a pipeline whose stage ``s`` runs on pipeline rank ``placement[s]``, or None when
    the model does not tie its embeddings or the first and last stages share a rank."""
    if not ties_embeddings(model) or placement[0] == placement[-1]:
        return None
    params = [p for layer in model.layers for p in layer.params if p.name == TOKEN_EMBEDDING]
    if not params:
        return None
    wte = params[0]
    return TiedEmbedding(placement[0], placement[-1], wte.bytes, wte.dtype)


def tied_embedding_ops(tied: TiedEmbedding | None, rank: int, peers: tuple[int, ...]) -> list:
    """The ops pipeline rank ``rank`` appends after its last action (``peers[k]``: the global rank of pipeline
    rank k in its pipeline, the mesh's ``pp`` group): wait for its backward, then all-reduce the embedding
    gradient with the other end of the pipeline."""
    if tied is None or rank not in (tied.first_rank, tied.last_rank):
        return []
    event = "tied embedding grad"
    return [Record(event, stream="compute"), Wait(event, stream="comm"),
            Collective("all_reduce", tied.bytes, tied.dtype, (peers[tied.first_rank], peers[tied.last_rank]),
                       name="tied embedding grad all_reduce")]
