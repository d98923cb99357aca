# Writes the flight recorder dumps of tests/data/flight_recorder (SOURCES.md): 2 Gloo ranks, rank 0 hangs in an
# all_reduce rank 1 never calls. Test data generator only; distlab never runs it.
import os, sys, json, pickle
import torch, torch.distributed as dist
import torch.multiprocessing as mp

def work(rank, out):
    os.environ["TORCH_FR_BUFFER_SIZE"] = "64"
    
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=2)
    x = torch.ones(1024)
    for _ in range(3):
        dist.all_reduce(x)
    dist.broadcast(x, 0)
    if rank == 0:
        w = dist.all_reduce(torch.ones(256), async_op=True)   # rank 1 never joins
    import time; time.sleep(0.5)
    from torch._C._distributed_c10d import _dump_fr_trace_json, _dump_fr_trace
    with open(f"{out}/fr_json_{rank}", "wb") as f:
        f.write(_dump_fr_trace_json(True, True))
    with open(f"{out}/fr_pickle_{rank}", "wb") as f:
        f.write(_dump_fr_trace(True, True, False))
    os._exit(0)

if __name__ == "__main__":
    out = sys.argv[1]
    mp.spawn(work, args=(out,), nprocs=2, join=True)
