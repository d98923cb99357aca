"""Scale of `distlab plan`: Llama 3 405B on 16,384 H100 (2,048 DGX H100 nodes), issue 28 item 4's target: the
search ends with a table in at most 10 minutes and 8 GB on 2 cores.

Runs the command as a user would (``distlab plan --model llama3-405b --nodes 2048 ...``) in a child process and
prints its wall time, the CPU seconds of the child and its workers (what the wall time is on idle cores at
best, over 2 of them), the peak memory of its whole process tree (the planner and its worker processes, RSS
summed, sampled every 0.2 s from /proc), the load average, and the last lines of its output (the table and the families,
which must list PP x TP x FSDP layouts: counted, and required for "within the targets").

    python benchmarks/plan_scale.py                       # the target case
    python benchmarks/plan_scale.py --nodes 256 --global-batch 1024
    python benchmarks/plan_scale.py --global-batch 128 --seq-len 131072   # Llama 3's long-context stage (CP)
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

TARGET_S, TARGET_GB = 600, 8.0


def tree_rss(root: int) -> int:
    """Bytes resident in ``root`` and every process below it (Linux /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/statm") as f:
                rss[int(name)] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama3-405b")
    p.add_argument("--cluster", default="dgx-h100")
    p.add_argument("--nodes", type=int, default=2048)
    p.add_argument("--global-batch", type=int, default=2048, help="sequences per step (default 2048: Llama 3 "
                                                                   "405B's 16M tokens of 8192, arXiv 2407.21783 "
                                                                   "Table 4)")
    p.add_argument("--confirm", type=int, default=3)
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: the model's)")
    p.add_argument("--tail", type=int, default=40, help="lines of the plan's output to print (default 40)")
    args = p.parse_args()
    cmd = [sys.executable, "-m", "distlab.runtime.cli", "plan", "--model", args.model, "--cluster", args.cluster,
           "--nodes", str(args.nodes), "--global-batch", str(args.global_batch), "--confirm", str(args.confirm)]
    if args.seq_len:
        cmd += ["--seq-len", str(args.seq_len)]
    print(" ".join(cmd[2:]))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start")
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "COLUMNS": "110"})
    peak = 0
    out: list[str] = []
    import threading
    reader = threading.Thread(target=lambda: out.extend(child.stdout), daemon=True)
    reader.start()
    while child.poll() is None:
        peak = max(peak, tree_rss(child.pid))
        time.sleep(0.2)
    reader.join()
    wall = time.perf_counter() - t0
    import resource
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = used.ru_utime + used.ru_stime           # the child and its workers (waited for): the load-free work
    print("".join(out[-args.tail:]).rstrip())
    import re
    text = "".join(out)
    pp_fsdp_tp = re.findall(r"PP(?: \(interleaved\))? x TP x (?:FSDP|HSDP): (tp \d+ · pp \d+[^,]*)", text)
    print(f"PP x FSDP2 x TP layouts listed (the best of each such family): {len(pp_fsdp_tp)}")
    ok = child.returncode == 0 and wall <= TARGET_S and peak / 1e9 <= TARGET_GB and bool(pp_fsdp_tp)
    print(f"exit {child.returncode}; wall {wall:.1f} s (target <= {TARGET_S} s); peak memory {peak / 1e9:.2f} GB "
          f"(process tree; target <= {TARGET_GB:g} GB); CPU {cpu:.0f} s (over 2 cores: >= {cpu / 2:.0f} s of wall "
          f"when idle); load average {os.getloadavg()[0]:.1f} at the end; "
          f"{'within' if ok else 'OUTSIDE'} the targets")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
