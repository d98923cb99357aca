"""A plan from a torch.profiler trace: `distlab simulate --from-profile DIR` simulates "my job", then one change.

    plan, guessed, unknown = plan_from_profile(load_profile("traces/"))
    # guessed: {"world_size": 2, "cluster": "dgx-a100", "collectives": 5, "dtypes": ["float32"], "step_us": ...}

One profiled step (the first complete ``ProfilerStep#N``, kineto.py; the whole trace when it has none) becomes one
step of a distlab-plan/1 plan, rank by rank, in the order the GPU ran it:
- each run of compute kernels between two collectives is one Compute op per kind of kernel (compute_match.py:
  GEMM, attention, memory-bound, other), "measured gemm x12", of their summed measured time (compute is taken
  as measured: what is predicted is the communication and how it overlaps);
- each NCCL kernel with torch's size args (``In msg nelems``, ``dtype``, ``Process Group Ranks``) is a Collective
  of that op, size, dtype and group on stream ``comm``; it waits (Record/Wait) for the compute issued before it
  started, and the first compute that started after it ended waits for it (the gradient all-reduce before the
  optimizer, a forward waiting for its all-gather);
- ranks the folder has no trace for run the program of the traced rank of the same position modulo the ranks
  traced (data parallel ranks run the same program); the world size is ``distributedInfo.world_size``.
What cannot be guessed is said: NCCL kernels without size args (torch before 2.1, or send/recv whose peer the
trace does not name) are left out; memory copies are left out; the host's idle time between kernels is not
modelled (a plan has no CPU-bound gaps), so the predicted step is the GPU's busy time plus communication.
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError

MAX_WORLD = 1 << 14


def step_events(t, step: int = 0) -> list:
    """The GPU events of rank trace ``t`` launched during profiled step ``step`` (a CPU trace's ops started in it;
    all of them without steps)."""
    if not t.steps:
        return list(t.events)
    if step >= len(t.steps):
        raise ConfigError(f"the trace has {len(t.steps)} complete step(s); step {step} is not one", t.path)
    lo, hi = t.steps[step]
    if not t.gpu:                                 # CPU ops: their own start (a collective's wait may run past hi)
        return [e for e in t.events if lo <= e.start_us < hi]
    return [e for e in t.events if e.launch_us is not None and lo <= e.launch_us < hi]


def rank_program(events) -> tuple[list, list[str]]:
    """The ops of one rank (sim/ops.py) from its step's GPU events, and what was left out."""
    from distlab.sim.ingest.compute_match import kernel_kind
    from distlab.sim.ops import Collective, Compute, Record, Wait
    ops, left, pending = [], [], {}             # pending: kind -> [microseconds, kernels], in first-seen order
    waiting = []                                # (end_us, event name) of collectives compute must wait for
    n = 0

    def flush():
        ops.extend(Compute(f"measured {k} x{c}", seconds=us * 1e-6) for k, (us, c) in pending.items())
        pending.clear()
    for e in sorted(events, key=lambda e: e.start_us):
        if e.kind == "memory":
            continue
        if e.kind != "communication":
            due = [w for w in waiting if w[0] <= e.start_us]
            if due:
                flush()
                for w in due:
                    ops.append(Wait(w[1], stream="compute"))
                waiting = [w for w in waiting if w[0] > e.start_us]
            p = pending.setdefault(kernel_kind(e.name), [0.0, 0])
            p[0] += e.dur_us
            p[1] += 1
            continue
        if e.op is None or e.nbytes is None or e.group is None or e.op == "send_recv":
            left.append(e.name.split("(")[0])
            continue
        flush()
        n += 1
        ops.append(Record(f"before-c{n}", stream="compute"))
        ops.append(Wait(f"before-c{n}", stream="comm"))
        ops.append(Collective(e.op, int(e.nbytes), e.dtype or "float32", tuple(e.group), stream="comm"))
        ops.append(Record(f"after-c{n}", stream="comm"))
        waiting.append((e.end_us, f"after-c{n}"))
    flush()
    return ops, left


def plan_from_profile(profile, step: int = 0):
    """(Plan, guessed, unknown): the plan of one profiled step and what was guessed and what was not."""
    from collections import Counter

    from distlab.sim.ingest.fit import preset_for
    from distlab.sim.plan import Plan
    traced = sorted(profile.ranks)
    world = profile.world_size or len(traced)
    if not 1 <= world <= MAX_WORLD:
        raise ConfigError(f"world size {world}; allowed 1 to {MAX_WORLD}", profile.directory)
    programs, left = {}, Counter()
    for r in traced:
        ops, skipped = rank_program(step_events(profile.ranks[r], step))
        programs[r] = ops
        left.update(skipped)
    ranks = [programs.get(r) or programs[traced[r % len(traced)]] for r in range(world)]
    groups = {op.group for prog in ranks for op in prog if getattr(op, "kind", "") == "collective"}
    outside = [g for g in groups if max(g) >= world]
    if outside:
        raise ConfigError(f"a collective's group {list(outside[0])} names ranks outside the world of {world}",
                          profile.directory)
    devices = [t.device for t in profile.ranks.values() if t.device]
    gpu = any(t.gpu for t in profile.ranks.values())
    cluster, note = preset_for(devices) if gpu else ("localhost-cpu", None)
    colls = [op for op in ranks[traced[0]] if getattr(op, "kind", "") == "collective"]
    t0 = profile.ranks[traced[0]]
    guessed = {"world_size": world, "traced_ranks": traced, "cluster": cluster, "device": devices[0] if devices
               else None, "nccl_version": t0.nccl_version, "collectives": len(colls),
               "collective_bytes": sum(c.bytes for c in colls), "dtypes": sorted({c.dtype for c in colls}),
               "groups": sorted(list(g) for g in groups), "steps_traced": len(t0.steps), "step": step}
    unknown = []
    if len(traced) < world:
        unknown.append(f"{world - len(traced)} of {world} ranks have no trace here: they run the program of the "
                       "traced rank of the same position (data parallel ranks run the same program)")
    for name, count in left.most_common():
        unknown.append(f"{count} x {name}: no size or peer in the trace's args (torch < 2.1, or send/recv): "
                       "left out")
    if note:
        unknown.append(note)
    unknown.append("host idle between kernels is not modelled: the plan is the GPU's work")
    plan = Plan(ranks, name=f"profile {profile.directory}", meta={"source": "torch.profiler", **guessed})
    plan.validate(profile.directory)
    return plan, guessed, unknown


def run_from_profile(args) -> int:
    """`distlab simulate --from-profile DIR [--cluster C] [--save-plan P]`: print what was guessed and what was
    not, then simulate the plan as a plan file is (sim/commands/simulate_output.py run_plan_file)."""
    from distlab.sim.commands.simulate_output import run_plan_file
    from distlab.sim.ingest.kineto import load_profile
    from distlab.sim.output import say
    if args.scenario:
        raise ConfigError("give a scenario or --from-profile, not both", "--from-profile")
    ignored = [f for f in ("model", "micro_batch", "mesh", "sweep") if getattr(args, f, None)]
    if ignored:
        raise ConfigError(f"--{ignored[0].replace('_', '-')} does not apply to a profile (it fixes the model and "
                          "the parallelism); allowed: --cluster, --nodes", "--from-profile")
    plan, guessed, unknown = plan_from_profile(load_profile(args.from_profile))
    args.cluster = args.cluster or guessed["cluster"]
    args.world_size = None
    if args.json:
        return run_plan_file(args, plan, {"profile": {"directory": args.from_profile, "guessed": guessed,
                                                      "not_guessed": unknown}})
    say(f"from {args.from_profile}: {guessed['world_size']} ranks ({len(guessed['traced_ranks'])} traced), "
        f"{guessed['collectives']} collectives of {', '.join(guessed['dtypes']) or '-'} in step {guessed['step']}, "
        f"device {guessed['device'] or 'unknown'} -> cluster {args.cluster}", indent="  ")
    for line in unknown:
        say(f"not guessed: {line}", indent="      ", first="  ")
    return run_plan_file(args, plan)
