"""The mixture-of-experts model family lives in sim/models/moe.py (with the other model families); these names
stay importable from here for expert parallelism's modules."""
from distlab.sim.models.moe import (PRESETS, MoEConfig, attention_core_flops, block_parts, config_of,  # noqa: F401
                                    from_spec, moe_model)
