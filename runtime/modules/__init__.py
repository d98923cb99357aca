"""Real torch modules for the models sim/models describes, and a sim model from any torch module.

- transformer.py builds the GPT (and MoE) ``nn.Module`` of a ``kind: gpt`` model, parameter for parameter;
  bridge.py converts both ways (``build_module``: description -> module; ``extract``: module -> sim model) and
  registers factory.py, which traces a user's ``--model pkg.module:factory`` on the meta device.
- saved.py measures what autograd saves for backward, layer by layer: what sim/models/activations.py is held to.
"""
