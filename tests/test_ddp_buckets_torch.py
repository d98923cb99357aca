"""The simulator's bucket assignment (sim/parallel/ddp/buckets.py: ``assign``, ``ddp_buckets``) against torch 2.13's own
``dist._compute_bucket_assignment_by_size`` (a local function: no ranks needed), PyTorch's own
``ComputeBucketAssignmentTest`` cases (test/distributed/test_c10d_common.py), and DDP itself in one process."""
import random
import sys

import pytest

from distlab.sim import models as m
from distlab.sim.parallel.ddp.buckets import (SCALAR_TYPE, UnorderedMapOrder, assign, bucket_key_hash, bucket_limits,
                                     ddp_buckets, device_hash)
from distlab.sim.errors import ConfigError

try:
    import torch
    import torch.distributed as dist
except ImportError:        # the torch-free cases below still run
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")
# DDP in this process on one intra-op thread (tests/conftest.py one_torch_thread): buckets do not depend on threads
one_torch_thread = pytest.mark.usefixtures("one_torch_thread")
DTYPES = ["float16", "float32", "float64", "bfloat16"]


def params_of(numels, dtypes):
    return [m.Param(f"p{i}", (k,), d) for i, (k, d) in enumerate(zip(numels, dtypes))]


def torch_assignment(params, order, limits, devices=None):
    """torch's (buckets, per-bucket limits); ``order=None``: no tensor_indices (tensors in index order)."""
    devices = devices or ["cpu"] * len(params)

    def tensor(i):
        return torch.empty(params[i].numel, dtype=getattr(torch, params[i].dtype), device=devices[i])
    if order is None:
        buckets, limits_out = dist._compute_bucket_assignment_by_size([tensor(i) for i in range(len(params))],
                                                                      limits)
    else:
        buckets, limits_out = dist._compute_bucket_assignment_by_size([tensor(i) for i in order], limits, [], order)
    return [list(b) for b in buckets], list(limits_out)


def sim_assignment(params, order, limits, devices=None):
    buckets = assign(params, order, limits, devices)
    return [list(b.params) for b in buckets], [b.limit for b in buckets]


def random_case(rng, dtypes, max_params=12):
    n = rng.randint(1, max_params)
    params = params_of([rng.choice([1, 7, 25, 50, 100, 300, 1000]) for _ in range(n)],
                       [rng.choice(dtypes) for _ in range(n)])
    limits = [rng.choice([1, 50, 100, 400, 1000, 4000]) for _ in range(rng.randint(1, 3))]
    order = list(range(n))
    rng.shuffle(order)
    return params, (order if rng.random() < 0.5 else None), limits


@needs_torch
def test_identical_to_torch_on_2000_random_cases():
    """1-12 params of float16/32/64 and bfloat16, 1-3 limits, with and without tensor_indices: 100% identical
    buckets (order included) and per-bucket limits. Several cases have leftovers in an order that is neither
    first appearance nor smallest index, so the old rule would fail."""
    rng = random.Random(19)
    leftover_cases = 0
    for _ in range(2000):
        params, order, limits = random_case(rng, DTYPES)
        want = torch_assignment(params, order, limits)
        assert sim_assignment(params, order, limits) == want, (params, order, limits)
        if order is not None:
            firsts = [next(i for i in order if params[i].dtype == d) for d in dict.fromkeys(
                params[i].dtype for i in order)]
            last_indices = [b[-1] for b in want[0]]
            leftover_cases += last_indices[-len(firsts):] != firsts and len(firsts) > 1
    assert leftover_cases > 100


@needs_torch
def test_issue_19_example_leftovers_follow_the_hash_map_not_first_appearance():
    # float64 keys first, yet its leftover bucket [5] comes after float32's [3] (torch 2.13, CPU)
    params = params_of([13, 10, 10, 10, 10, 1], ["float64", "float32", "float32", "float32", "float32", "float64"])
    got = sim_assignment(params, [0, 1, 5, 2, 4, 3], [100, 400, 400])
    assert got == ([[0], [1, 2, 4], [3], [5]], [100, 100, 400, 400])
    assert got == torch_assignment(params, [0, 1, 5, 2, 4, 3], [100, 400, 400])


@needs_torch
def test_many_keys_rehash_and_devices_identical_to_torch():
    """cpu and meta (DeviceType 14) x the sim's 9 dtypes = 18 keys: past 13 the map rehashes to 29 buckets."""
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randint(1, 40)
        params = params_of([rng.choice([1, 3, 10, 40]) for _ in range(n)], [rng.choice(list(SCALAR_TYPE))
                                                                           for _ in range(n)])
        devices = [rng.choice(["cpu", "meta"]) for _ in range(n)]
        limits = [rng.choice([1, 16, 64, 10**9]) for _ in range(rng.randint(1, 3))]
        order = list(range(n))
        rng.shuffle(order)
        order = order if rng.random() < 0.5 else None
        assert sim_assignment(params, order, limits, devices) == torch_assignment(params, order, limits, devices)


def test_hash_table_order_front_of_bucket_then_rehash():
    table = UnorderedMapOrder()
    for key, code in [("a", 1), ("b", 2), ("c", 14)]:      # c shares a's bucket (14 % 13 == 1)
        table.insert(key, code)
    assert table.bucket_count == 13 and table.keys == ["b", "c", "a"]
    for k in range(10):
        table.insert(k, 100 + k)
    table.insert("a", 1)                                     # already there: nothing moves
    assert table.bucket_count == 13 and len(table.keys) == 13 and table.keys[-1] == "a"
    assert table.keys == [9, 8, 7, 4, 3, 2, 1, 0, 6, "b", 5, "c", "a"]
    table.insert("x", 1000)            # key 14 > 13 buckets: rehash to 29 first, re-linking the old list in order
    assert table.bucket_count == 29    # 1000 % 29 = 14 = bucket of c (14) and 1 (101): x goes in front of them
    assert table.keys == ["a", 5, "b", 6, 0, "x", "c", 1, 2, 3, 4, 7, 8, 9]


def test_key_hash_follows_c10():
    assert device_hash("cpu") == 255 and device_hash("meta") == 14 << 16 | 255
    assert device_hash("cuda:0") == 1 << 16 and device_hash("cuda:3") == 1 << 16 | 3
    seed = 255
    assert bucket_key_hash("float32") == seed ^ (6 + 0x9E3779B9 + (seed << 6) + (seed >> 2))
    for bad in ("gpu", "cuda", "cpu:x", "cuda:-1"):
        with pytest.raises(ConfigError, match="device"):
            device_hash(bad)
    with pytest.raises(ConfigError, match="devices"):
        assign(params_of([1], ["float32"]), None, [10], ["cpu", "cpu"])


# PyTorch's ComputeBucketAssignmentTest (test/distributed/test_c10d_common.py), as our own cases: float is 4
# bytes, double 8; no tensor_indices, so buckets come sorted by their smallest index.
def test_pytorch_single_limit_single_dtype():
    params = params_of([100, 200, 100, 50], ["float32"] * 4)
    assert sim_assignment(params, None, [400]) == ([[0], [1], [2], [3]], [400] * 4)


def test_pytorch_single_limit_multi_dtype():
    params = params_of([50, 25] * 3, ["float32", "float64"] * 3)
    assert sim_assignment(params, None, [400]) == ([[0, 2], [1, 3], [4], [5]], [400] * 4)


def test_pytorch_multi_limit_single_dtype():
    params = params_of([10] * 4, ["float32"] * 4)
    assert sim_assignment(params, None, [40, 80]) == ([[0], [1, 2], [3]], [40, 80, 80])


def test_pytorch_multi_limit_multi_dtype():
    params = params_of([50, 25] * 3, ["float32", "float64"] * 3)
    assert sim_assignment(params, None, [200, 400]) == ([[0], [1], [2, 4], [3, 5]], [200, 200, 400, 400])


@needs_torch
def test_ddp_buckets_both_iterations_identical_to_torch_calls():
    """ddp_buckets as DDP calls torch: iteration 0 = reversed(assignment over [sys.maxsize], no indices)
    (distributed.py _ddp_init_helper); rebuilt = assignment over bucket_limits with the ready order."""
    rng = random.Random(7)
    for _ in range(200):
        params, _, _ = random_case(rng, DTYPES)
        model = m.Model("mixed", [m.Layer("all", params)])
        order = list(range(len(params)))
        rng.shuffle(order)
        cap = rng.choice([None, 0.0001, 0.001])
        want0, _ = torch_assignment(params, None, [sys.maxsize])
        assert [list(b.params) for b in ddp_buckets(model, cap, iteration=0)] == want0[::-1]
        want, _ = torch_assignment(params, order, bucket_limits(cap))
        assert [list(b.params) for b in ddp_buckets(model, cap, order=order)] == want


@needs_torch
@pytest.mark.slow
@one_torch_thread
def test_mixed_dtype_ddp_in_one_process_identical_to_sim():
    """Real DDP (gloo, world size 1, in this process) over modules mixing the 4 float dtypes, parameters used
    in a random order: its logged buckets (iteration 0 sizes, rebuilt indices) are the simulator's, given
    the gradient-ready order seen by post-accumulate-grad hooks. DDP's Python side reorders nothing more."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")

    class Net(torch.nn.Module):
        def __init__(self, specs, use_order):
            super().__init__()
            self.ws = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(k, dtype=d)) for k, d in specs])
            self.use_order = use_order

        def forward(self):
            return sum(self.ws[j].float().sum() * (j + 1) for j in self.use_order)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        rng = random.Random(3)
        for _ in range(40):
            n = rng.randint(2, 10)
            specs = [(rng.choice([1, 50, 200, 3000, 70000]), getattr(torch, rng.choice(DTYPES))) for _ in range(n)]
            use_order = list(range(n))
            rng.shuffle(use_order)
            cap = rng.choice([None, 0.001, 0.01, 0.3])
            net = Net(specs, use_order)
            ddp = DDP(net, bucket_cap_mb=cap)
            initial = ddp._get_ddp_logging_data()["bucket_sizes"]
            ready = []
            for i, p in enumerate(net.parameters()):
                p.register_post_accumulate_grad_hook(lambda _, i=i: ready.append(i))
            for _ in range(3):          # rebuilt at iteration 1's forward, logged at the forward after
                ddp().backward()
            log = ddp._get_ddp_logging_data()
            model = m.Model("mixed", [m.Layer("all", params_of([k for k, _ in specs],
                                                              [str(d).split(".")[1] for _, d in specs]))])
            order = ready[:n]
            assert [str(b.bytes) for b in ddp_buckets(model, cap, iteration=0)] == initial.split(", ")
            assert [" ".join(map(str, b.params)) for b in ddp_buckets(model, cap, order=order)] == \
                log["rebuilt_per_bucket_param_indices"].split(", ")
    finally:
        dist.destroy_process_group()
