"""Collective algorithm names are declared once, by their modules (issue 11.7)."""
import importlib
import pkgutil

import distlab.sim.collectives as collectives
from distlab.sim.collectives import algorithms
from distlab.sim.plan import ALGORITHMS


def test_every_algorithm_module_is_listed_once_and_names_itself():
    found = set()
    for info in pkgutil.iter_modules(collectives.__path__):
        module = importlib.import_module(f"distlab.sim.collectives.{info.name}")
        if hasattr(module, "NAME"):
            assert module.NAME == info.name and module in algorithms.MODULES
            assert {"OPS", "PROTOCOLS", "NCCL_NAME", "NCCL_AUTO", "check", "steps"} <= set(dir(module))
            found.add(module.NAME)
    assert found == set(algorithms.NAMES) and len(algorithms.NAMES) == len(found)


def test_plan_and_runtime_derive_from_the_registry():
    assert ALGORITHMS == ("auto", *algorithms.NAMES)
    assert algorithms.NCCL_NAMES == {"ring": "Ring", "tree": "Tree", "nvls": "NVLS", "nvls_tree": "NVLSTree",
                                     "pat": "PAT"}
    from distlab.runtime.execute.executor import NCCL_ALGOS     # what the runtime sets NCCL_ALGO from
    assert NCCL_ALGOS is algorithms.NCCL_NAMES
