"""`distlab plan`: the best layout for a model on a cluster, searched, simulated and explained."""
from __future__ import annotations

from distlab.sim.cli import STYLE, add_output_arguments, print_json, print_table, progress, say
from distlab.sim.errors import ConfigError

NAME = "plan"
HELP = ("Search the layouts (tp, cp, pp with virtual stages and splits, dp as DDP/FSDP2/HSDP, micro-batches, "
        "recompute, schedule) of a model on a cluster: drop what does not fit, estimate the rest, confirm the best "
        "with the simulator, rank and explain them.")
KEYS = ("model", "cluster", "nodes", "global_batch", "seq_len", "confirm")


def add_arguments(p) -> None:
    p.add_argument("question", nargs="?", help="a YAML file with keys model, cluster, nodes, global_batch "
                                               "[, seq_len, confirm]; flags override it")
    p.add_argument("--model", help="a preset (e.g. llama3-70b), a Hugging Face config.json or pkg.module:factory "
                                    "(docs/models.md); default llama3-8b")
    p.add_argument("--cluster", help="a cluster preset or file (default dgx-h100)")
    p.add_argument("--nodes", type=int, help="nodes (default 2)")
    p.add_argument("--global-batch", type=int, help="sequences per step (default 64)")
    p.add_argument("--seq-len", type=int, help="sequence length (default: the model's)")
    p.add_argument("--confirm", type=int, help="simulate this many of the best estimates (default 3)")
    p.add_argument("--top", type=int, default=10, help="rows of the ranked table (default 10)")
    p.add_argument("--save", help="write the chosen layout (#1) as a scenario file (.yaml) that `distlab simulate` "
                                  "and `distlab validate` take")
    p.add_argument("--plot", help="write a Pareto figure (step time against memory per GPU), e.g. plan.png")
    p.add_argument("--workers", type=int, help="local processes for the estimate and the confirmation (default: the "
                                               "CPUs, at most 2)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="confirm on a Dask cluster instead: its scheduler's "
                                                          "address, e.g. tcp://10.0.0.1:8786 (sim/workers.py)")
    from distlab.sim.workers import add_insecure_flag
    add_insecure_flag(p)                     # a scheduler off this machine needs TLS or this flag (sim/workers.py)
    from distlab.sim.planner.eras import ERAS
    p.add_argument("--as-published", choices=sorted(ERAS), metavar="ERA",
                   help="search only what that era's software ran (sim/planner/eras.py, docs/planner.md): "
                        + "; ".join(f"{k}: {e.source}" for k, e in ERAS.items()))
    p.add_argument("--json", action="store_true", help="print results as JSON")
    add_output_arguments(p)


# Bounds, so that a typo cannot keep the search running for minutes (it simulates micro-batches of the global batch:
# 2,048 sequences took 17 s on one node, 1,048,576 over 2 minutes); published global batches are a few thousand.
# Nodes: the simulator's ranks (sim/cluster MAX_RANKS, 262,144) over the cluster's GPUs per node, as simulate's
# --nodes (32,768 nodes of 8 GPUs); the bound here is that of a one-GPU node, the cluster's is checked after it.
LIMITS = {"nodes": 262144, "global_batch": 16384, "confirm": 1000, "seq_len": 1 << 20}


def question(args) -> dict:
    """The question from the YAML file (if any) and the flags, validated."""
    from distlab.sim.io import load_yaml
    q = {"model": "llama3-8b", "cluster": "dgx-h100", "nodes": 2, "global_batch": 64, "seq_len": None, "confirm": 3}
    if args.question:
        d = load_yaml(args.question)
        if not isinstance(d, dict):
            raise ConfigError(f"must be a mapping with keys {', '.join(KEYS)}", args.question)
        for k in d:
            if k not in KEYS:
                raise ConfigError(f"unknown key {k!r}; allowed: {', '.join(KEYS)}", args.question)
        q.update(d)
    for k in KEYS:
        v = getattr(args, k, None)
        if v is not None:
            q[k] = v
    for k, most in LIMITS.items():          # bounded: the search enumerates divisors and layouts of these
        least = 0 if k == "confirm" else 1
        if (q[k] is not None or k != "seq_len") and (not isinstance(q[k], int) or isinstance(q[k], bool)
                                                     or not least <= q[k] <= most):
            raise ConfigError(f"{q[k]!r} must be a whole number from {least} to {most}", "--" + k.replace("_", "-"))
    from distlab.sim.cli import check_whole
    from distlab.sim.cluster import load_cluster, nodes_bound
    check_whole(q["nodes"], "--nodes", 1, *nodes_bound(load_cluster(q["cluster"])))
    from distlab.sim.models import spec_from_text
    model = q["model"] if isinstance(q["model"], dict) else spec_from_text(str(q["model"]), "--model" if args.model else
                                                                              f"{args.question}: model")
    if q["seq_len"] is not None:
        model = {**model, "seq_len": q["seq_len"]}
    q["model"] = model
    return q


def run(args) -> int:
    from distlab.sim.io import check_outputs
    from distlab.sim.models import model_from_spec
    from distlab.sim.planner import explain
    from distlab.sim.planner.search import ESTIMATE_BOUND, search
    q = question(args)
    from distlab.sim.workers import check_scheduler
    check_scheduler(args.scheduler, getattr(args, "insecure_scheduler", False))
    check_outputs((args.save, "--save", "file"), (args.plot, "--plot", "figure"))
    from distlab.sim.models.activations import require_structure
    built = model_from_spec({**q["model"], "micro_batch": 1}, "--model")
    if (built.config or {}).get("kind") == "moe":      # sim/planner/layouts.py: EP is not a searched family
        raise ConfigError(f"{built.name} is MoE: plan has no EP search yet; allowed: dense models", "--model")
    require_structure(built, "distlab plan (tp, cp, pp layouts)", ("gpt",))
    bar = _Bar(not args.json)
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"{args.workers} must be a whole number >= 1", "--workers")
    era = None
    if getattr(args, "as_published", None):
        from distlab.sim.planner.eras import ERAS
        era = ERAS[args.as_published]
    s = search(q["model"], q["cluster"], q["nodes"], q["global_batch"], q["confirm"], progress=bar.update,
               workers=args.workers, scheduler=args.scheduler, allow=era.allows if era else None,
               keep=max(args.top, 1), phase=bar.phase)
    bar.close()
    why = explain.first_vs_second(s, s.estimator)
    notes = explain.notes(s, args.top)
    fams = explain.families(s)
    top = s.ranked[:max(args.top, 1)]
    if args.save:
        _save(args.save, s)
    if args.plot:
        from distlab.sim.planner.figure import pareto
        from distlab.sim.io import save_figure
        save_figure(pareto(s), args.plot)
    if args.json:
        print_json({"question": {k: v for k, v in s.question.items()}, "gpu_memory_GiB": s.gpu_GiB,
                    "as_published": {"era": era.name, "source": era.source} if era else None,
                    "notes": notes,
                    "candidates": len(s.all), "fit": s.fit, "estimated": len(s.ranked), "pruned": s.pruned,
                    "confirmed": s.confirmed, "confirmed_by": s.confirmed_by,
                    "ranked": [{"rank": i + 1, "layout": c.layout.to_dict(), "label": c.layout.label(),
                                **explain.breakdown(s, c)} for i, c in enumerate(top)],
                    "first_vs_second": why, "families": fams, "saved": args.save}, "plan")
        return 0
    say(f"{s.question['world_size']} x {s.cluster.gpu.name} ({s.gpu_GiB:g} GiB): {len(s.all)} layouts"
        + (f" that {era.name} ran ({era.source})" if era else "")
        + f", {s.fit} fit, {len(s.ranked)} estimated"
        + (f" (the other {s.pruned}: a lower bound of their step rules them out of the table and their "
           "family's best)" if s.pruned else "") + f", {s.confirmed} confirmed by {s.confirmed_by}")
    rows = []
    labels, common = varying_parts([c.layout.label() for c in top])
    for i, c in enumerate(top):
        b = explain.breakdown(s, c)
        rows.append([i + 1, labels[i], f"{c.step_s * 1e3:.1f}" + ("  " if c.simulated_s is not None else " ~"),
                     f"{b['mfu']:.1%}", f"{b['tokens_per_s_per_gpu']:.0f}", f"{b['memory_GiB']:.1f}",
                     f"{b['headroom_GiB']:.1f}"])
    print_table(f"layouts, fastest first (~ = estimate, within +/-{ESTIMATE_BOUND:.0%} of the simulator's step; "
                f"others confirmed by {s.confirmed_by}; #1 is the fastest confirmed)",
                ["#", "layout" + (f" (all: {common})" if common and len(common) < 40 else ""), "step ms", "MFU",
                 "tok/s/GPU", "GiB/GPU", "headroom GiB"], rows, justify_left=2)
    if common and len(common) >= 40:
        say(f"  (every layout above: {common})", indent="   ")
    for line in notes:
        say("note: " + line)
    b = explain.breakdown(s, s.ranked[0])
    print_table("#1 term by term (estimate)", ["term", "ms"],
                [[name, f"{b[name] * 1e3:.1f}"] for key, name in explain.TERMS.items()
                 if (key != "cp_comm_exposed_s" or s.ranked[0].layout.cp > 1)
                 and (key != "composed_s" or key in s.ranked[0].estimate.terms)])
    if why:
        line = (f"#1 beats #2 by {why['gap_s'] * 1e3:.1f} ms; the term that differs most: {why['term']} "
                f"(+{why['term_gap_s'] * 1e3:.1f} ms in #2).")
        if "change" in why:
            line += (f" The single change to #2 that helps most: {why['change']} -> {why['changed_step_s'] * 1e3:.1f} "
                     f"ms ~ (estimate +/-{ESTIMATE_BOUND:.0%}; "
                     f"{'closes the gap' if why['closes_gap'] else 'still behind #1'}).")
        say(line)
    shown = [f for f in fams if f["best"] or STYLE.verbose]
    say("the best of each family:" if len(shown) == len(fams) else
        f"the best of each family that fits ({len(fams) - len(shown)} do not fit: --verbose says why):")
    for f in shown:
        mark = "" if f.get("confirmed") else f" ~ (estimate +/-{ESTIMATE_BOUND:.0%})"
        label = f["best"].replace(" · ", ", ") if f["best"] else ""          # plain ASCII: bytes = columns
        best = f"{label}, {f['step_s'] * 1e3:.1f} ms{mark}: " if f["best"] else ""
        say(f"{f['family']}: {best}{f['why']}", indent="    ", first="  ")
    if args.save:
        say(f"saved #1 as {args.save} (distlab simulate {args.save})")
    if args.plot:
        say(f"wrote {args.plot}")
    return 0


def varying_parts(labels: list[str], sep: str = " · ") -> tuple[list[str], str]:
    """(each label without the parts every label has, joined by ', '; those common parts): a table keeps what
    differs between its rows and says the rest once ("tp 1 · pp 1 · dp 8 (fsdp)" over "tp 1 · pp 1 · dp 16
    (fsdp)" -> "dp 8 (fsdp)", "dp 16 (fsdp)"; common "tp 1, pp 1")."""
    split = [label.split(sep) for label in labels]
    common = [p for p in split[0] if all(p in parts for parts in split[1:])] if len(split) > 1 else []
    return [", ".join(p for p in parts if p not in common) or ", ".join(parts) for parts in split], ", ".join(common)


def _save(path: str, s) -> None:
    import yaml
    from distlab.sim.io import write_atomic
    q, c = s.question, s.ranked[0]
    d = dict(c.layout.to_scenario(q["model"], q["cluster"], q["nodes"], "--save").source)   # checked as written
    d["description"] = (f"distlab plan's #1 for global batch {q['global_batch']}: step {c.step_s * 1e3:.1f} ms, "
                        f"{c.memory_bytes / 2**30:.1f} GiB per GPU")
    write_atomic(path, yaml.safe_dump(d, sort_keys=False, allow_unicode=True))


class _Bar:
    """The search's progress on stderr: a rich bar on a terminal (after 2 s), else a line per tenth of the layouts
    considered and per phase (a log, a benchmark's pipe); nothing with ``enabled`` false (--json)."""

    def __init__(self, enabled: bool):
        import sys
        self.enabled, self.it, self.done, self.tenth = enabled, None, 0, 0
        self.lines = enabled and not sys.stderr.isatty()
        import time
        self.start = time.monotonic()

    def phase(self, text: str) -> None:
        if self.lines:
            import sys
            import time
            print(f"plan: {text}, {time.monotonic() - self.start:.1f} s elapsed", file=sys.stderr, flush=True)

    def update(self, done: int, total: int) -> None:
        if self.lines:
            tenth = 10 * done // max(total, 1)
            if tenth > self.tenth:
                self.tenth = tenth
                self.phase(f"{done} of {total} layouts that fit considered")
            return
        if self.it is None:
            self.it = progress(iter(range(total)), total, "estimating layouts", self.enabled)
        while self.done < done:
            next(self.it, None)
            self.done += 1

    def close(self) -> None:
        if self.it is not None:
            for _ in self.it:
                pass
