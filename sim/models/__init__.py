"""Models: what a network is to the simulator (parameters, FLOPs, activations), one module per concern.

    from distlab.sim.models import model_from_spec
    m = model_from_spec({"preset": "llama3.1-8b", "micro_batch": 2, "recompute": "full"})
    m.num_params / 1e9, m.layers[1].activation_bytes      # 8.03, the block's kept input

Map: core.py (Param, Layer, Model) · arch.py (a dense decoder's structural choices) · dense.py (gpt: GPT-2,
Llama, Mistral, Qwen2 blocks; mlp) · moe.py (mixture of experts: Mixtral, DeepSeek-V3) · activations.py (the
bytes a model keeps for backward, with recomputation and offloading, at any tp/sp/cp layout; families.py: each
family's terms) · hf.py
(Hugging Face config.json) · presets.py (named models; configs/ holds the shipped config.json files) · spec.py
(every form of ``--model`` and ``model:``, resolved in one place). A model traced from an ``nn.Module`` comes
from the runtime (runtime/modules/bridge.py), which sim never imports.
"""
from distlab.sim.models.arch import ARCH_DEFAULTS, CHOICES, structure  # noqa: F401
from distlab.sim.models.core import MAX_LAYERS, Layer, Model, Param  # noqa: F401
from distlab.sim.models.dense import GPT2_READY, LLAMA_READY, gpt, mlp  # noqa: F401
from distlab.sim.models.presets import GPT_PRESETS as PRESETS, preset_names  # noqa: F401
from distlab.sim.models.spec import (GPT_KEYS, KINDS, MLP_KEYS, model_from_spec, preset,  # noqa: F401
                                     set_factory_loader, spec_from_text)
