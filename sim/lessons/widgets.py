"""The lessons' sliders (ipywidgets, the ``lessons`` extra): move a slider and the numbers and the figure follow.
Every number comes from sim/lessons/sliders.py (the library), never from notebook code.

    >>> w = MemoryWidget()                       # lessons 06 and 11: memory per GPU     # doctest: +SKIP
    >>> w.controls["zero"].value = 1             # the result, table and figure update at once
    >>> w.result["total"] / 2**30

Each widget has ``controls`` (name -> ipywidgets control), ``result`` (what sliders.py returned for the current
values), ``table`` (an HTML widget), ``image`` (the figure as a PNG widget) and ``box`` (all of them, what a
notebook cell shows: ``w.box`` or ``display(w)``). Tests drive ``controls`` and read ``result`` without a
browser (tests/test_lessons_widgets.py). The notebooks run headless in CI as well: a widget's cell then shows
its controls' state and the figure of its first values.
"""
from __future__ import annotations

from distlab.sim.lessons import sliders as S
from distlab.sim.lessons.helpers import Figure, Table


def _ipywidgets():
    try:
        import ipywidgets
    except ImportError as e:                       # pragma: no cover - the lessons extra installs it
        raise ImportError("the lessons' sliders need ipywidgets: pip install -e \".[lessons]\"") from e
    return ipywidgets


class Widget:
    """Controls, a table and a figure; ``update()`` on every change."""

    title = ""

    def __init__(self, **controls):
        W = _ipywidgets()
        self.controls = controls
        self.table, self.image = W.HTML(), W.Image(format="png")
        self.error = W.HTML()
        for c in controls.values():
            c.observe(lambda _change: self.update(), names="value")
        self.box = W.VBox([W.HTML(f"<b>{self.title}</b>"), W.HBox(list(controls.values()), layout=W.Layout(
            flex_flow="row wrap")), self.error, W.HBox([self.table, self.image])])
        self.result: dict | list = {}
        self.update()

    def values(self) -> dict:
        return {k: c.value for k, c in self.controls.items()}

    def update(self) -> None:
        try:
            self.result = self.compute(**self.values())
        except ValueError as e:                   # e.g. tp x pp does not divide the GPUs: say so, keep the rest
            self.error.value = f"<span style='color:#b3261e'>{e}</span>"
            return
        self.error.value = ""
        table, figure = self.render(self.result)
        self.table.value = table._repr_html_()
        self.image.value = figure.png()

    def _ipython_display_(self):                  # display(w) shows the box
        from IPython.display import display
        display(self.box)

    def compute(self, **values):                  # pragma: no cover - each widget defines it
        raise NotImplementedError

    def render(self, result) -> tuple[Table, Figure]:     # pragma: no cover
        raise NotImplementedError


def _int(W, name: str, value: int, options) -> object:
    return W.SelectionSlider(options=list(options), value=value, description=name, continuous_update=False)


class MemoryWidget(Widget):
    """Per-GPU memory of a model under DDP / ZeRO 1-2-3, TP, PP and CP, with recomputation (lessons 06, 11)."""

    title = "memory per GPU (the fullest GPU; sim/lessons/sliders.py memory_per_gpu)"

    def __init__(self, model: str = "llama3-70b", gpus: int = 64, zero: int = 3, tp: int = 1, pp: int = 1,
                 cp: int = 1, micro_batch: int = 1, recompute: str = "full"):
        W = _ipywidgets()
        super().__init__(
            model=W.Dropdown(options=list(S.MODELS), value=model, description="model"),
            gpus=_int(W, "GPUs", gpus, (8, 16, 32, 64, 128, 256, 512, 1024)),
            zero=_int(W, "ZeRO", zero, (0, 1, 2, 3)), tp=_int(W, "tp", tp, (1, 2, 4, 8)),
            pp=_int(W, "pp", pp, (1, 2, 4, 8, 16)), cp=_int(W, "cp", cp, (1, 2, 4, 8)),
            micro_batch=_int(W, "micro-batch", micro_batch, (1, 2, 4, 8)),
            recompute=W.Dropdown(options=list(S.RECOMPUTE), value=recompute, description="recompute"))

    def compute(self, **v):
        return S.memory_per_gpu(**v)

    def render(self, r):
        parts = [k for k in r if k not in ("total", "dp", "gpu_GiB", "fits")]
        f = Figure(5.0, 3.2)
        bottom = 0.0
        for k in parts:
            f.ax.bar(["GPU"], [r[k] / S.GiB], bottom=[bottom], label=k)
            bottom += r[k] / S.GiB
        f.ax.axhline(r["gpu_GiB"], color="black", ls="--", lw=1, label=f"{r['gpu_GiB']:g} GiB")
        f.ax.set_ylabel("GiB")
        f.ax.legend(fontsize=7)
        return Table(["part", "GiB"], S.memory_rows(r), f"dp {r['dp']}"), f


class BubbleWidget(Widget):
    """The pipeline bubble over p, m and v, with the schedule drawn (lesson 07)."""

    title = "pipeline bubble, uniform stages, free p2p (sim/lessons/sliders.py bubble)"

    def __init__(self, schedule: str = "1f1b", p: int = 4, m: int = 8, v: int = 2):
        W = _ipywidgets()
        super().__init__(schedule=W.Dropdown(options=["gpipe", "1f1b", "interleaved", "zbh1", "zbv"],
                                             value=schedule, description="schedule"),
                         p=_int(W, "p", p, (2, 3, 4, 6, 8)), m=_int(W, "m", m, (1, 2, 4, 8, 16, 32)),
                         v=_int(W, "v", v, (1, 2, 3, 4)))

    def compute(self, **v):
        if v["schedule"] != "gpipe" and v["m"] < v["p"]:
            raise ValueError(f"{v['schedule']} needs m >= p (torch's schedules raise otherwise; lesson 07)")
        return S.bubble(**v)

    def render(self, r):
        from distlab.sim.lessons.pipelines import plot_pipeline
        rows = [["simulated bubble", f"{r['simulated']:.1%}"],
                ["closed form", "-" if r["formula"] is None else f"{r['formula']:.1%}"],
                ["step", f"{r['step_s'] * 1e3:.4g} ms"]]
        return Table(["", ""], rows, f"{r['schedule']}, p {r['p']}, m {r['m']}, v {r['v']}"), \
            plot_pipeline(r["trace"], p=r["p"])


class CollectiveWidget(Widget):
    """busbw and time over message size, per algorithm and protocol (lesson 02)."""

    title = "one collective over message sizes (sim/lessons/sliders.py busbw_curve)"

    def __init__(self, op: str = "all_reduce", nodes: int = 1, algorithm: str = "ring", protocol: str = "auto"):
        W = _ipywidgets()
        super().__init__(op=W.Dropdown(options=["all_reduce", "all_gather", "reduce_scatter", "all_to_all"],
                                       value=op, description="op"),
                         nodes=_int(W, "dgx-h100 nodes", nodes, (1, 2, 4, 8)),
                         algorithm=W.Dropdown(options=["auto", "ring", "tree", "nvls"], value=algorithm,
                                              description="algorithm"),
                         protocol=W.Dropdown(options=["auto", "LL", "LL128", "Simple"], value=protocol,
                                             description="protocol"))

    def compute(self, **v):
        try:
            return S.busbw_curve(**v)
        except Exception as e:                    # an algorithm the op or cluster does not have
            raise ValueError(str(e).splitlines()[0]) from e

    def render(self, rows):
        f = Figure(6.0, 3.4)
        f.ax.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], marker="o", ms=3)
        f.ax.set_xscale("log", base=2)
        f.ax.set_xlabel("bytes")
        f.ax.set_ylabel("busbw (GB/s)")
        pick = [rows[i] for i in (0, len(rows) // 2, len(rows) - 1)]
        t = Table(["bytes", "time", "busbw GB/s", "algorithm", "protocol"],
                  [[r["bytes"], f"{r['time_s'] * 1e6:.4g} us", f"{r['busbw_GBps']:.1f}", r["algorithm"],
                    r["protocol"]] for r in pick], "smallest, middle, largest")
        return t, f


class GoodputWidget(Widget):
    """Young/Daly checkpoint intervals and the goodput curve over MTBF and checkpoint cost (lesson 12)."""

    title = "goodput against the checkpoint interval (sim/lessons/sliders.py goodput)"

    def __init__(self, mtbf_h: float = 12.0, checkpoint_s: float = 60.0, restart_min: float = 5.0):
        W = _ipywidgets()
        super().__init__(
            mtbf_h=W.FloatLogSlider(value=mtbf_h, base=10, min=-1, max=2, description="MTBF (h)",
                                    continuous_update=False),
            checkpoint_s=W.FloatLogSlider(value=checkpoint_s, base=10, min=0, max=3, description="checkpoint (s)",
                                          continuous_update=False),
            restart_min=W.FloatSlider(value=restart_min, min=0, max=60, step=1, description="restart (min)",
                                      continuous_update=False))

    def compute(self, **v):
        return S.goodput(**v)

    def render(self, r):
        f = Figure(6.0, 3.4)
        f.ax.plot([t / 60 for t in r["taus_s"]], [100 * g for g in r["goodput"]])
        for key, style in (("young_s", "--"), ("daly_s", ":")):
            f.ax.axvline(r[key] / 60, ls=style, color="grey", label=key[:-2].capitalize())
        f.ax.set_xscale("log")
        f.ax.set_xlabel("checkpoint interval (min)")
        f.ax.set_ylabel("goodput (%)")
        f.ax.legend(fontsize=7)
        rows = [[name, f"{r[k] / 60:.1f} min", f"{100 * r[g]:.1f}%"] for name, k, g in
                (("Young", "young_s", "at_young"), ("Daly", "daly_s", "at_daly"), ("best", "best_s", "at_best"))]
        return Table(["interval", "", "goodput"], rows, "expected goodput (sim/resilience.py)"), f
