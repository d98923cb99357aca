"""The presets held to real nccl-tests logs, and predictions held to real torch.profiler traces (issue 40).

    python benchmarks/ingest_accuracy.py [--markdown]

1. Every log of tests/data/nccl_tests (SOURCES.md: where each was published, on what system) is simulated on the
   preset of its GPU (sim/ingest/fit.py preset_for: A100 -> dgx-a100, H100 -> dgx-h100, GB200 -> gb200-nvl72)
   sized to the log's nodes x ranks per node, size by size with `distlab collective`'s engine; the busbw error
   (simulated - measured) / measured of the out-of-place column, per size regime: below 1 MiB, 1-128 MiB, above
   128 MiB (mean |error| and the worst, signed). Then the same log fitted (`calibrate --from-nccl-tests`) and
   simulated again: the round trip, worst |error| above 1 MiB.
2. Every trace folder of tests/data/profiles (SOURCES.md: what each job was): the plan `simulate --from-profile`
   guesses from its first complete step, simulated on the preset of its GPU, against the trace (sim/ingest/
   versus.py): per traced rank step, compute, communication, exposed communication, overlap and idle, and the
   collectives matched in issue order (median and worst duration error).
Sim-only: a few seconds. Prints; --markdown also writes its section of docs/accuracy.md.
"""
from __future__ import annotations

import os
import statistics
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOGS = os.path.join(ROOT, "tests", "data", "nccl_tests")
PROFILES = os.path.join(ROOT, "tests", "data", "profiles")
# what each file is (tests/data/*/SOURCES.md says where it was published)
SYSTEMS = {
    "a100_1x8_all_reduce_v2.19.4.txt": "8 A100-SXM4-80GB, one node, one process driving 8 GPUs, NCCL 2.19.3",
    "gb200_nvl72_72gpu_all_reduce.txt": "one GB200 NVL72 rack, 72 GPUs (CoreWeave, nccl-tests PR #43)",
    "h100_2x4_all_reduce_g4.txt": "2 nodes x 4 H100, 4 GPUs per process (-g 4), network not named",
    "h100_2x8_gcp_a3mega_all_reduce.txt": "2 x Google Cloud A3 Mega: 8 H100 and 8 x 200 Gb/s TCPXO NICs each",
    "h100_2x8_oci_all_reduce.txt": "2 x Oracle Cloud BM.GPU.H100.8 (RoCE cluster network), NCCL 2.21.5",
    "h200_2x8_nebius_all_reduce.txt": "2 nodes x 8 H200 on Nebius (Kubernetes, Run:ai)",
}
JOBS = {
    "hta_a100_2rank_nccl": "ResNet-50-like CNN (53 convolutions a step), DDP with SGD, 2 A100, NCCL 2.17.1; rank 0",
    "hta_128rank_sampled": "a TorchRec-style recommendation model on 128 GPUs (all-to-all as NCCL SendRecv); "
                           "ranks 0 and 1, sampled by HTA's authors",
}


def say(text: str, indent: str = "   ") -> None:
    """Print within 100 columns, continuation lines indented."""
    print(textwrap.fill(text, 100, initial_indent=indent, subsequent_indent=indent + "  "))


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:+.0f}%"


def presets_against_logs() -> None:
    from distlab.sim.cluster import PRESETS
    from distlab.sim.ingest.fit import busbw_rows, cluster_from_logs, preset_for, regime_errors, sized
    from distlab.sim.ingest.nccl_tests import load
    print("1. presets against real nccl-tests logs: busbw error (simulated - measured) / measured, out-of-place")
    print("   column; per regime: mean |error| (worst, signed); fit = the log fitted, worst |error| above 1 MiB")
    print(f"{'log':30} {'preset':11} {'ranks':>5} {'< 1 MiB':>13} {'1-128 MiB':>13} {'> 128 MiB':>13} {'fit':>6}")
    for name in sorted(f for f in os.listdir(LOGS) if f.endswith(".txt")):
        log = load(os.path.join(LOGS, name))
        preset, _ = preset_for(log.devices)
        cluster = sized(PRESETS[preset], log)
        regimes = regime_errors(busbw_rows(log, cluster))
        cells = [f"{r['mean_abs_error'] * 100:.0f}% ({_pct(r['worst_error'])})" if r["sizes"] else "no sizes"
                 for r in regimes]
        fitted = cluster_from_logs([log])
        trip = [abs(r["error"]) for r in busbw_rows(log, fitted) if r["bytes"] > 1 << 20]
        say(f"{name}: {SYSTEMS.get(name, 'see SOURCES.md')}", "")
        print(f"{'':30} {preset:11} {f'{cluster.nodes}x{cluster.gpus_per_node}':>5} {cells[0]:>13} "
              f"{cells[1]:>13} {cells[2]:>13} {max(trip) * 100 if trip else 0:5.1f}%")
        big = [r for r in busbw_rows(log, cluster) if r["bytes"] >= 1 << 20]
        if big:
            say("measured/simulated busbw GB/s at " + ", ".join(
                f"{_size(r['bytes'])} {r['measured_busbw_GBps']:.0f}/{r['simulated_busbw_GBps']:.0f}"
                for r in big[:: max(1, len(big) // 5)]))


WHY = ("Where a preset misses a regime by more than 10%, its citation in sim/cluster/presets.py says why. Below "
       "128 MiB the presets reach the plateau sooner than NCCL: on one A100 node the log's time beyond the plateau "
       "rate grows from 59 us (1 MiB) to 283 us (128 MiB), a term NCCL's own tuner model lacks (constant ring "
       "latency; its mid-size corrections are for trees and multi-node rings, tuning.cc ncclTopoGetAlgoTime), likeliest "
       "each channel's chunk pipeline filling (not measured here). Across 2 nodes the simulator now caps LL at NCCL's 39 GB/s "
       "(tuning.cc llMaxBws on NVLink's bus bandwidth) and derates trees by NCCL's treeCorrectionFactor, which "
       "closes part of the 2-node gap; the A3 Mega and "
       "2 x 4 logs are other systems than the preset's (200 Gb/s TCPXO NICs, 4 GPUs a node), and their own fit "
       "(last column) reproduces them. GB200's 72-rank ramp likewise reaches 2 GiB. The mid-size regime is where "
       "DDP's and FSDP2's buckets live (25-200 MiB): calibrate from your own nccl-tests log before trusting it.")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g}{unit}"
    return f"{n}B"


TRACE_NOTES = {
    "hta_a100_2rank_nccl": "Its all-reduces of 8-31 MB took 1.7-3.3 ms (5-19 GB/s algbw) with NCCL's RING/LL "
                           "kernels (LL: the small-message protocol, half of each 16-byte line is flags), and each "
                           "kernel's time includes waiting for rank 1, whose trace is not here; the dgx-a100 "
                           "preset runs them as ring/Simple over NVLink, 15-70x faster: this job is not the "
                           "preset's machine or NCCL configuration. Calibrate from its own nccl-tests log.",
    "hta_128rank_sampled": "Its collectives carry no size args (an older torch): nothing is predicted; compute is "
                           "taken as measured, so what differs is the host's idle time and the left-out send/recv.",
}


def _why() -> None:
    say(WHY, "")


def plans_against_traces() -> None:
    from distlab.sim.cluster import load_cluster
    from distlab.sim.ingest.kineto import load_profile
    from distlab.sim.ingest.scenario import plan_from_profile
    from distlab.sim.ingest.versus import compare_profile
    from distlab.sim.kernel.engine import simulate
    print()
    print("2. predicted against measured on real torch.profiler traces (the plan guessed from the trace's first")
    print("   complete step: compute taken as measured, communication predicted on the GPU's preset)")
    for name in sorted(os.listdir(PROFILES)):
        folder = os.path.join(PROFILES, name)
        if not os.path.isdir(folder):
            continue
        profile = load_profile(folder)
        plan, guessed, unknown = plan_from_profile(profile)
        cluster = load_cluster(guessed["cluster"]).with_world_size(plan.world_size)
        trace = simulate(plan, cluster, record_transfers=False)
        c = compare_profile(trace, profile, plan=plan, gpu=cluster.gpu)
        say(f"{name}: {JOBS.get(name, 'see SOURCES.md')}", "")
        say(f"{guessed['world_size']} ranks ({len(guessed['traced_ranks'])} traced), device "
            f"{guessed['device'] or 'unknown'}, NCCL {guessed['nccl_version'] or '?'}, on {guessed['cluster']}")
        for line in unknown:
            say(f"not guessed: {line}")
        for r in c["ranks"]:
            m, p = r["measured"], r["predicted"]
            parts = []
            for label, key in (("step", "step_s"), ("compute", "compute_s"), ("comm", "communication_s"),
                               ("exposed", "exposed_communication_s"), ("idle", "idle_s")):
                parts.append(f"{label} {m[key] * 1e3:.2f}/{p.get(key, 0) * 1e3:.2f}")
            ov = [m.get("overlap"), p.get("overlap")]
            parts.append("overlap " + "/".join("-" if x is None else f"{x * 100:.0f}%" for x in ov))
            say(f"rank {r['rank']} ms measured/predicted: " + ", ".join(parts))
        for m in c["compute"]:
            kinds = [f"{k} {v['measured_s'] * 1e3:.2f}/{v['predicted_s'] * 1e3:.2f} ({v['matched_kernels']}/"
                     f"{v['measured_kernels']} kernels matched)" for k, v in m["kinds"].items() if v["measured_kernels"]]
            say(f"rank {m['rank']} compute by kind, ms measured/predicted: " + ", ".join(kinds))
        errors = [x["error"] for x in c["collectives"] if x["error"] is not None]
        if errors:
            worst = max(c["collectives"], key=lambda x: abs(x["error"] or 0))
            say(f"{len(errors)} collectives matched: median duration error {_pct(statistics.median(errors))}, "
                  f"worst {_pct(worst['error'])} ({worst['op']} {_size(worst['measured_bytes'])}, measured "
                  f"{worst['measured_s'] * 1e3:.3f} ms with NCCL {worst['algorithm']}/{worst['protocol']}, "
                  f"predicted {worst['predicted_s'] * 1e3:.3f} ms)")
        else:
            say("no collective matched (the trace's NCCL kernels carry no size args)")
        if name in TRACE_NOTES:
            say(TRACE_NOTES[name])


def main() -> int:
    presets_against_logs()
    _why()
    plans_against_traces()
    return 0


if __name__ == "__main__":                # --markdown: also write its section of docs/accuracy.md
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from accuracy_doc import run_main
    sys.exit(run_main("ingest_accuracy", main))
