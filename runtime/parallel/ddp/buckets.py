"""Real DDP's buckets for a list of models, in one launch: what tests/test_ddp_buckets.py compares the
simulator's assignment (sim/parallel/ddp/buckets.py) against.

For each case, every rank wraps a fresh module in DDP (``bucket_cap_mb`` as given; None = PyTorch's default),
runs three forward/backward iterations (buckets are rebuilt at iteration 1's forward, in gradient-ready
order; the logging data is refreshed at the forward after that) and reports ``_get_ddp_logging_data()``:
``bucket_sizes`` (iteration 0), ``rebuilt_bucket_sizes`` and ``rebuilt_per_bucket_param_indices``.
"""
from __future__ import annotations


def _zoo(name: str):
    """Plain torch modules no sim builder describes (their sim model comes from runtime.modules.bridge.extract)."""
    import torch
    import torch.nn as nn
    if name == "embed-mlp":       # 9.8 MiB embedding and head: larger than a 2 MiB cap
        return (nn.Sequential(nn.Embedding(20000, 128), nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 128),
                              nn.LayerNorm(128), nn.Linear(128, 20000, bias=False)), torch.randint(0, 20000, (4, 8)))
    if name == "conv":            # conv + batch-norm + linear head
        return (nn.Sequential(nn.Conv2d(3, 64, 3), nn.BatchNorm2d(64), nn.ReLU(), nn.Conv2d(64, 256, 3),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 1000)), torch.randn(2, 3, 12, 12))
    raise KeyError(name)


def module_and_input(case: dict):
    """(nn.Module, example input) of a case: ``{"zoo": name}`` or ``{"model": sim model spec}``."""
    import torch
    torch.manual_seed(0)
    if "zoo" in case:
        return _zoo(case["zoo"])
    from distlab.runtime.modules.bridge import build_module, example_input
    from distlab.sim.models import model_from_spec
    model = model_from_spec(case["model"])
    return build_module(model), example_input(model, batch=2)


def sim_model(case: dict):
    """The sim Model of a case (zoo modules: extracted, with the measured gradient-ready order)."""
    from distlab.sim.models import model_from_spec
    if "zoo" in case:
        from distlab.runtime.modules.bridge import extract
        module, x = module_and_input(case)
        return extract(module, x, name=case["zoo"])
    return model_from_spec(case["model"])


def bucket_task(ctx, payload: dict) -> list[dict]:
    from torch.nn.parallel import DistributedDataParallel as DDP
    out = []
    for case in payload["cases"]:
        module, x = module_and_input(case)
        ddp = DDP(module, bucket_cap_mb=case.get("bucket_cap_mb"))
        initial = ddp._get_ddp_logging_data().get("bucket_sizes", "")
        for _ in range(3):       # logging data is refreshed at the next forward: read it after iteration 2
            ddp(x).float().sum().backward()
        log = ddp._get_ddp_logging_data()
        out.append({"bucket_sizes": _ints(initial), "rebuilt_bucket_sizes": _ints(log["rebuilt_bucket_sizes"]),
                    "rebuilt_per_bucket_param_indices": [_ints(b)
                                                         for b in log["rebuilt_per_bucket_param_indices"].split(",")]})
    return out


def _ints(text) -> list[int]:
    return [int(s) for s in str(text).replace(",", " ").split()]


def real_buckets(cases: list[dict], world: int = 2, timeout: float = 120.0) -> list[dict]:
    """Rank 0's report for every case (one gloo launch of ``world`` ranks)."""
    from distlab.runtime.ranks.launch import TRAINING, launch
    return launch("distlab.runtime.parallel.ddp.buckets:bucket_task", {"cases": cases}, nproc=world, backend="gloo",
                  timeout=timeout, preload=TRAINING)[0]
