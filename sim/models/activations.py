"""Activation memory: the bytes autograd keeps from a layer's forward until its backward, one function per
model family (their terms: sim/models/families.py), the same for every parallelism and for `distlab memory`.

    from distlab.sim.models import preset
    from distlab.sim.models.activations import activations
    a = activations(preset("llama3-8b", micro_batch=1, seq_len=4096))
    a.peak_bytes / 2**30                        # 25.5 GiB: no s x s scores (SDPA), no dropout
    activations(preset("llama3-8b", micro_batch=1, seq_len=4096), recompute="full").peak_bytes / 2**30   # 6.0

The rule: a saved tensor counts once however many ops save it (q, k and v all save the same normed input; a
view keeps its whole base alive), in its own dtype; parameters do not count. What each op saves is torch 2.13's
autograd formula (tools/autograd/derivatives.yaml), as ``torch.autograd.graph.saved_tensors_hooks`` shows it
(tests/test_activations_torch.py checks a small Llama and a small GPT within 5%):

  Linear                   its input                     GELU, SiLU        their input
  LayerNorm                input, mean, rstd (fp32)      ReLU              its output (= the next input)
  RMSNorm                  input, rstd (fp32)            x * y             x and y
  SDPA (flash, efficient,  q, k, v, output, logsumexp    dropout           its mask (1 byte)
    cuDNN; CPU flash)      (fp32): never s x s           add, views, RoPE with constant cos/sin: nothing
  unfused attention        q, k (QKᵀ); softmax output (b·a·s²); with dropout its mask and output; v
  embedding                the token ids (int64)         cross-entropy     log-softmax of the fp32 logits
                                                                           (torchtitan: pred.float()), targets

(RMSNorm: CUDA's ``_fused_rms_norm`` saves input and rstd; on CPU torch 2.13 decomposes it and also keeps
x·rstd, one more b·s·h per norm: the test counts that difference explicitly.) Korthikanti et al. 2022 (arXiv
2205.05198, sec. 4.1) count the same way for GPT with dropout and unfused attention: 34·s·b·h + 5·a·s²·b bytes at
16 bits, which ``dense`` reproduces (``dropout`` > 0, ``attention: unfused``, without the small fp32 terms).

Layouts (torch's DTensor tensor parallelism with torchtitan's plan): with tp (+ sequence parallelism) the heads,
the FFN width and their tensors divide by tp; the norms' inputs divide by tp only with sequence parallelism;
the norms' outputs do not: ``PrepareModuleInput`` all-gathers them and the column-parallel linears save the
gathered tensor (Megatron-LM's SP saves the shard and gathers again in backward: Korthikanti's 34/t). With
loss parallelism the log-softmax keeps V/tp columns. Context parallelism divides every per-token term by cp
(ring attention saves the local q, k, v, output and logsumexp).

Options (``recompute``, ``offload``; the model's own unless given), applied to the transformer blocks as
torchtitan's activation checkpointing wraps them (embedding and head keep theirs):
  full        a block keeps only its input (sharded with sequence parallelism: issue 28.5); its backward reruns
              its forward (``recompute_flops``) and holds that forward's other tensors meanwhile
              (``transient_bytes``: the input is the one it kept)
  selective   Korthikanti et al.'s: the attention core (QKᵀ, softmax, dropout) is recomputed, its s x s tensors
              are not kept; with SDPA there are none (FlashAttention recomputes the scores in its backward), so
              selective = none (torchtitan's op-level selective AC is not modelled)
  offload     a block's saved tensors live in host memory (``torch.autograd.graph.save_on_cpu``) and come back
              for its backward (``host_bytes``; the copies' time over PCIe is not simulated). ``true``: every
              block; a number N: the first N blocks, as Transformer Engine's ``get_cpu_offload_context(enabled,
              num_layers)`` offloads (Megatron-LM's ``--cpu-offloading-num-layers``; at most layers - 1 there,
              the last block's backward comes first)
Peak over one micro-batch: backward visits the layers last to first, so the peak is the largest of (saved
bytes of layers 0..i + the transient bytes of layer i).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from distlab.sim.errors import ConfigError
from distlab.sim.models.families import BLOCK, FAMILIES, RECOMPUTE  # noqa: F401  (RECOMPUTE re-exported)


@dataclass(frozen=True)
class LayerActivations:
    name: str
    saved: float                                # on the GPU from its forward until its backward
    transient: float = 0.0                      # on top of that while its backward runs
    host: float = 0.0                           # offloaded to host memory
    recompute_flops: float = 0.0
    terms: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Activations:
    """One micro-batch's activations on one rank, layer by layer, in forward order."""
    layers: tuple
    recompute: str = "none"
    offload: bool = False
    tp: int = 1
    sequence_parallel: bool = False
    cp: int = 1
    loss_parallel: bool = False

    @property
    def saved_bytes(self) -> float:
        return sum(x.saved for x in self.layers)

    @property
    def host_bytes(self) -> float:
        return sum(x.host for x in self.layers)

    @property
    def peak_bytes(self) -> float:
        """The most bytes alive at once: max over layers i of saved(0..i) + transient(i)."""
        prefix, best = 0.0, 0.0
        for x in self.layers:
            prefix += x.saved
            best = max(best, prefix + x.transient)
        return best

    def per_block(self) -> float:
        """Saved bytes of the first transformer block (0 without blocks)."""
        return next((x.saved for x in self.layers if BLOCK.match(x.name)), 0.0)

    def as_json(self) -> dict:
        first = next((x for x in self.layers if BLOCK.match(x.name)), None)
        return {"recompute": self.recompute, "offload": self.offload, "tp": self.tp,
                "sequence_parallel": self.sequence_parallel, "cp": self.cp, "loss_parallel": self.loss_parallel,
                "peak_bytes": self.peak_bytes, "saved_bytes": self.saved_bytes, "host_bytes": self.host_bytes,
                "block_terms": [{"term": k, "bytes": v} for k, v in (first.terms if first else {}).items()]}


def activations(model, recompute: str | None = None, offload: bool | None = None, tp: int = 1,
                sequence_parallel: bool = False, cp: int = 1, loss_parallel: bool = False) -> Activations:
    """The activations of one micro-batch of ``model`` on one rank of this layout (module docstring).
    ``recompute``/``offload``: None = the model's own (``model.config``), else this."""
    cfg = model.config or {}
    kind = cfg.get("kind")
    rc = cfg.get("recompute", "none") if recompute is None else recompute
    off = cfg.get("offload", False) if offload is None else offload
    if rc not in RECOMPUTE:
        raise ConfigError(f"unknown recompute {rc!r}; allowed: {', '.join(RECOMPUTE)}", "recompute")
    if kind not in FAMILIES:
        raise ConfigError(f"no activation model for a {kind!r} model; allowed kinds: {', '.join(FAMILIES)}", "model")
    for key, v in (("tp", tp), ("cp", cp)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{v!r} must be a whole number >= 1", key)
    sp = sequence_parallel and tp > 1
    stashes = FAMILIES[kind](model, tp, sp, cp, loss_parallel and tp > 1, rc)
    out, blocks = [], 0
    for st in stashes:
        plain = sum(st.terms.values())
        saved, transient, flops, terms = plain, sum(st.transient.values()), 0.0, dict(st.terms)
        if st.block and rc == "full":         # the rerun forward keeps all but the input it already has
            saved, transient, flops = st.input_bytes, transient + plain - st.input_bytes, st.flops
            terms = {"block input (kept by activation checkpointing)": st.input_bytes}
        elif st.block and rc == "selective" and st.selective:
            drop = sum(st.terms[k] for k in st.selective)
            saved, transient, flops = plain - drop, transient + drop, st.selective_flops
            terms = {k: v for k, v in st.terms.items() if k not in st.selective}
        host = 0.0
        if st.block and (off is True or not isinstance(off, bool) and blocks < off):
            host, transient, saved = saved, transient + saved, 0.0
        blocks += bool(st.block)
        out.append(LayerActivations(st.name, saved, transient, host, flops, terms))
    return Activations(tuple(out), rc, off, tp, sp, cp, loss_parallel and tp > 1)


def check_offload(offload, layers: int, where: str) -> None:
    """``offload``: true, false, or a whole number of blocks from 0 to ``layers`` (module docstring)."""
    if isinstance(offload, bool):
        return
    if not isinstance(offload, int) or not 0 <= offload <= layers:
        raise ConfigError(f"{offload!r} must be true, false or a number of blocks from 0 to {layers}", where)


def attach(model, **layout):
    """``model`` with every layer's ``activation_bytes``, ``transient_bytes`` and ``recompute_flops`` set from
    its family's function (its own recompute/offload, or ``layout``'s keyword arguments); returns the model."""
    acts = activations(model, **layout)
    for layer, a in zip(model.layers, acts.layers):
        layer.activation_bytes, layer.transient_bytes, layer.recompute_flops = a.saved, a.transient, a.recompute_flops
    return model


def local_layers(model, layers: list, **layout) -> list:
    """``layers`` (one rank's copies of ``model.layers``, e.g. TP-local) with the activation bytes of this
    layout: what sim/parallel/tp/compose.py and sim/parallel/cp/plan.py build their plans from. Their
    ``recompute_flops`` stay 0: those builders time the recomputed forward in their own segments."""
    acts = activations(model, **layout)
    return [replace(L, activation_bytes=a.saved, transient_bytes=a.transient, recompute_flops=0.0)
            for L, a in zip(layers, acts.layers)]




def effective_recompute(model, option: str, where: str = "recompute") -> str:
    """A parallelism section's own ``recompute`` option together with the model's: whichever is set (not
    "none"); both set to different values is a ConfigError."""
    own = (model.config or {}).get("recompute", "none")
    if option != "none" and own != "none" and option != own:
        raise ConfigError(f"{option!r} differs from the model's recompute {own!r}; set it in one place", where)
    return option if option != "none" else own


def require_structure(model, what: str, kinds: tuple = ("gpt",)) -> None:
    """ConfigError unless ``model`` is of one of ``kinds`` (TP and CP rewrite a transformer's modules by name)."""
    kind = (model.config or {}).get("kind")
    if kind not in kinds:
        source = "comes from an nn.Module" if kind == "extracted" else f"is a {kind} model"
        raise ConfigError(f"{what} needs a transformer described by its structure (a preset, a config.json or "
                          f"{{kind: {kinds[0]}}}); {model.name!r} {source}; allowed for it: ddp, fsdp, pipeline",
                          "model")
