"""`distlab calibrate --from-nccl-tests LOG [LOG...]`: fit a cluster YAML to nccl-tests logs, no ranks started.

    distlab calibrate --from-nccl-tests all_reduce_perf.txt all_gather_perf.txt --out my-h100.yaml
    distlab collective all_reduce --cluster my-h100.yaml --sizes 1MiB:8GiB     # the logs' busbw back

Each log is parsed (nccl_tests.py), the logs' ops and rank counts fitted per size band (fit.py) and the cluster
written atomically (sim/io.py write_atomic) with a header naming the logs. The table printed is the round trip:
per log, the sizes fitted, the bands, and the worst |simulated - measured| / measured busbw above 1 MiB on the
written cluster, so a fit that does not reproduce its log is seen at once.
"""
from __future__ import annotations

ROUND_TRIP_FROM = 1 << 20


def round_trip(logs, cluster) -> list[dict]:
    """Per log: its op, ranks, sizes, bands and the worst busbw error above 1 MiB on ``cluster``."""
    from distlab.sim.ingest.fit import busbw_rows
    out = []
    for log in logs:
        rows = busbw_rows(log, cluster) if log.nranks == cluster.world_size else []
        above = [r for r in rows if r["bytes"] > ROUND_TRIP_FROM and r["error"] is not None]
        entry = cluster.calibration["collectives"][log.op][str(log.nranks)]
        out.append({**log.to_dict(), "bands": len(entry.get("bands", [])) or 1,
                    "worst_error_above_1MiB": max((r["error"] for r in above), key=abs, default=None),
                    "rows": rows})
    return out


def run(paths: list[str], out: str, as_json: bool) -> int:
    from distlab.sim.cli import print_json
    from distlab.sim.ingest.fit import cluster_from_logs
    from distlab.sim.ingest.nccl_tests import load
    from distlab.sim.io import check_output, write_atomic
    from distlab.sim.output import note, print_table, say
    check_output(out, "--out", "file")
    logs = [load(p) for p in paths]
    cluster = cluster_from_logs(logs)
    checks = round_trip(logs, cluster)
    head = "".join(f"# fitted by distlab calibrate --from-nccl-tests from {log.path} ({log.op}, {log.nranks} "
                   f"ranks, {', '.join(log.devices) or 'device unknown'}, NCCL {log.nccl_version or 'unknown'})\n"
                   for log in logs)
    write_atomic(out, head + cluster.to_yaml())
    if as_json:
        print_json({"cluster": out, "nodes": cluster.nodes, "gpus_per_node": cluster.gpus_per_node,
                    "calibration": cluster.calibration, "logs": checks})
        return 0
    print_table(f"nccl-tests logs fitted (out-of-place time; {cluster.nodes} x {cluster.gpus_per_node} ranks)",
                ["log", "op", "ranks", "sizes", "bands", "NCCL", "worst busbw error > 1 MiB"],
                [[_short(c["path"]), c["op"], c["nranks"], c["sizes"], c["bands"], c["nccl_version"] or "?",
                  "n/a" if c["worst_error_above_1MiB"] is None else f"{c['worst_error_above_1MiB'] * 100:+.1f}%"]
                 for c in checks], justify_left=2)
    for n in cluster.calibration.get("notes", []) + cluster.calibration.get("dropped", []):
        note(n)
    say(f"wrote {out}: distlab collective OP --cluster {out} reproduces these sizes")
    return 0


def _short(path: str, width: int = 34) -> str:
    import os
    name = os.path.basename(path)
    return name if len(name) <= width else name[:width - 3] + "..."
