"""The typed scenario: what a scenario file, the command line or a plan file's header says, parsed and validated
once (sim/scenario/parse.py) into these dataclasses; everything after receives a ``Scenario``, never a dict.

    s = parse.from_dict({"model": "llama3-8b", "mesh": {"dp_shard": 8}, "fsdp": {"param_dtype": "bfloat16"}})
    s.mesh                       # (('dp_shard', 8),): the mesh completed on the cluster's world
    s.parallelisms["fsdp"]       # FSDPOptions(zero=3, param_dtype='bfloat16', ...): every option, defaults filled
    s.workload                   # 'fsdp': the builder the layout uses ('composed' for several parallelisms)

The rule: one layout, one object. The same model, mesh, options, cluster and batch written as YAML, as flags,
or as a bare ``--mesh`` give equal Scenarios (``==``) and so the same plan (tests/test_scenario_typed.py):
the mesh is the completed one (a fill dimension or a default dimension written out), each parallelism the
layout applies has its whole options object (a section left out, or written ``{}``, is its defaults; FSDP2
inside a pipeline is not resharded after forward unless said, as torchtitan), the model's micro-batch is the
batch's. A single parallelism is the one-entry case of ``parallelisms``; ``workload`` names the builder
(sim/workloads/registry.py, or sim/workloads/composed.py when several parallelisms compose on the mesh).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MODEL_FORMS = ("preset", "hf_config", "factory", "kind")


@dataclass(frozen=True)
class ModelSpec:
    """Which model (sim/models/spec.py forms): ``form`` one of preset, hf_config, factory or kind (builder
    arguments written out), ``source`` its value, ``overrides`` the other keys (seq_len, dtype, layers, ...)
    sorted by key. The micro-batch is not here: it is the Batch's."""
    form: str
    source: Any
    overrides: tuple = ()

    @property
    def is_mlp(self) -> bool:
        return self.form == "kind" and self.source == "mlp"

    def as_dict(self, micro_batch: int | None = None) -> dict:
        """The model spec sim/models/spec.py ``model_from_spec`` takes, with the micro-batch put back (an MLP
        calls it ``batch``)."""
        out = {self.form: self.source, **dict(self.overrides)}
        if micro_batch is not None:
            out["batch" if self.is_mlp else "micro_batch"] = micro_batch
        return out


@dataclass(frozen=True)
class Batch:
    """Sequences per rank per micro-batch (None: the model's default). The micro-batches per step are the
    option of the parallelism that splits the step (pipeline.microbatches, ep.microbatches, ddp.grad_accum),
    written once whichever layout (``--microbatches``, sim/scenario/flags.py). ``global_batch``: sequences per
    optimizer step when the scenario says (a pipeline's micro-batches then follow from it: sim/scenario/batch.py)."""
    micro_batch: int | None = None
    global_batch: int | None = None


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster preset or .yaml path, and the node count and world size the scenario runs on (resolved: the
    cluster's own when the scenario does not say). ``cluster`` is the loaded Cluster (not compared)."""
    source: str
    nodes: int
    world_size: int
    cluster: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Scenario:
    """A validated scenario (module docstring). ``source`` is the validated scenario mapping it was parsed from
    (what `--json` prints and a sweep edits; not compared)."""
    model: ModelSpec
    batch: Batch
    mesh: tuple                       # completed: ((dimension, size), ...) outermost first (order counts in ==)
    parallelisms: dict                # name -> options dataclass, torchtitan's order for a composition
    workload: str                     # the builder: a registry name or "composed"
    cluster: ClusterSpec
    stragglers: tuple = ()            # ((rank, slowdown factor), ...) sorted
    degraded_links: tuple = ()        # ((link name, bandwidth factor), ...) sorted
    name: str | None = None
    description: str | None = None
    fp8_recipe: str | None = None     # how float8 GEMMs quantize (sim/compute/fp8.py; None: torchao tensorwise)
    source: dict = field(default_factory=dict, compare=False, repr=False)

    def device_mesh(self, where: str = "scenario: mesh"):
        """The completed mesh as a sim/mesh.py Mesh."""
        from distlab.sim.mesh import Mesh
        return Mesh(dict(self.mesh), where)

    def model_spec(self) -> dict:
        return self.model.as_dict(self.batch.micro_batch)

    def options(self, name: str):
        """The options of parallelism ``name`` (None when the layout does not apply it)."""
        return self.parallelisms.get(name)
