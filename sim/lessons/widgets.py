"""The lessons' sliders (ipywidgets, the ``lessons`` extra): move a slider and the numbers and the figure follow.
Every number comes from sim/lessons/sliders.py (the library), never from notebook code.

    >>> w = MemoryWidget()                       # lessons 06 and 11: memory per GPU     # doctest: +SKIP
    >>> w.controls["zero"].value = 1             # the result, table and figure update at once
    >>> w.result["total"] / 2**30

Each widget has ``controls`` (name -> ipywidgets control), ``result`` (what sliders.py returned for the current
values), ``table`` (an HTML widget), ``image`` (the figure as a PNG widget) and ``box`` (all of them). A notebook
cell shows the widget itself (``w`` as its last line): its MIME bundle carries the live widget and, for a saved
notebook read without a kernel (GitHub, nbviewer, CI's headless run), the table and a PNG of its state; without
ipywidgets the cell shows that state and how to install it (``static``). Tests drive ``controls`` and read
``result`` without a browser (tests/test_lessons_widgets.py).
"""
from __future__ import annotations

import base64
import html

from distlab.sim.lessons import sliders as S
from distlab.sim.lessons.helpers import Figure, Table


INSTALL = "pip install -e \".[lessons]\" (or pip install ipywidgets), then restart the kernel"


def _ipywidgets():
    """ipywidgets, or None when it is not installed (the widget then shows its default state, static)."""
    try:
        import ipywidgets
    except ImportError:
        return None
    return ipywidgets


class Widget:
    """Controls, a table and a figure; ``update()`` on every change. ``values``: the controls' first values;
    ``make_controls(W)``: the controls, given the ipywidgets module. Without ipywidgets ``controls`` is empty and
    the widget shows the table and figure of ``values`` with how to install it (``static``)."""

    title = ""

    def __init__(self, values: dict, make_controls):
        W = _ipywidgets()
        self.static = W is None
        self.result: dict | list = {}
        self.table_html, self.png, self.message = "", b"", ""
        if self.static:
            self.controls, self._values = {}, dict(values)
            self.update()
            return
        self.controls = make_controls(W)
        self.table, self.image = W.HTML(), W.Image(format="png")
        self.error = W.HTML()
        for c in self.controls.values():
            c.observe(lambda _change: self.update(), names="value")
        self.box = W.VBox([W.HTML(f"<b>{self.title}</b>"), W.HBox(list(self.controls.values()), layout=W.Layout(
            flex_flow="row wrap")), self.error, W.HBox([self.table, self.image])])
        self.update()

    def values(self) -> dict:
        return {k: c.value for k, c in self.controls.items()} if not self.static else dict(self._values)

    def update(self) -> None:
        try:
            self.result = self.compute(**self.values())
        except ValueError as e:                   # e.g. tp x pp does not divide the GPUs: say so, keep the rest
            self.message = str(e)
            if not self.static:
                self.error.value = f"<span style='color:#b3261e'>{html.escape(str(e))}</span>"
            return
        self.message = ""
        table, figure = self.render(self.result)
        self.table_html, self.png = table._repr_html_(), figure.png()
        if not self.static:
            self.error.value = ""
            self.table.value = self.table_html
            self.image.value = self.png

    def _repr_mimebundle_(self, include=None, exclude=None):
        """The live widget where a kernel runs it; beside it, for a saved notebook viewed without one (GitHub,
        nbviewer, a headless run), the table and a PNG of the current state, and without ipywidgets how to
        install it. A front end shows the richest it can render."""
        state = ", ".join(f"{k} {v}" for k, v in self.values().items())
        png = base64.b64encode(self.png).decode("ascii")
        note = (f"<p><i>ipywidgets is not installed: the sliders need it ({html.escape(INSTALL)}). Below: the "
                f"default state.</i></p>" if self.static else
                "<p><i>a static copy of the widget's state; run the notebook for the sliders</i></p>")
        static = (f"<b>{html.escape(self.title)}</b>{note}<p>{html.escape(state)}</p>"
                  + (f"<p style='color:#b3261e'>{html.escape(self.message)}</p>" if self.message else "")
                  + f"<div style='display:flex;gap:12px'>{self.table_html}"
                  f"<img src='data:image/png;base64,{png}'/></div>")
        plain = (f"{self.title}: {state}" + (f"\n(ipywidgets is not installed: {INSTALL})" if self.static else ""))
        bundle = {"text/plain": plain, "text/html": static, "image/png": png}
        if not self.static:
            live = self.box._repr_mimebundle_(include=include, exclude=exclude) or {}
            live = live[0] if isinstance(live, tuple) else live
            bundle.update({k: v for k, v in live.items() if k != "text/plain"})
        return bundle

    def compute(self, **values):                  # pragma: no cover - each widget defines it
        raise NotImplementedError

    def render(self, result) -> tuple[Table, Figure]:     # pragma: no cover
        raise NotImplementedError


def _int(W, name: str, value: int, options) -> object:
    return W.SelectionSlider(options=list(options), value=value, description=name, continuous_update=False)


class MemoryWidget(Widget):
    """Per-GPU memory of a model under DDP / ZeRO 1-2-3, TP, PP and CP, with recomputation (lessons 06, 11)."""

    title = "memory per GPU (the fullest GPU; sim/lessons/sliders.py memory_per_gpu)"

    SEQ_LENS = (0, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)      # 0: the model's own

    def __init__(self, model: str = "llama3-70b", gpus: int = 64, zero: int = 3, tp: int = 1, pp: int = 1,
                 cp: int = 1, micro_batch: int = 1, recompute: str = "full", seq_len: int = 0,
                 dtype: str = "own"):
        """``model``: a preset, or the path of a Hugging Face config.json (type it in the model box); ``seq_len``
        0 and ``dtype`` "own": the model's own."""
        values = dict(model=model, gpus=gpus, zero=zero, tp=tp, pp=pp, cp=cp, micro_batch=micro_batch,
                      recompute=recompute, seq_len=seq_len, dtype=dtype)
        super().__init__(values, lambda W: dict(
            model=W.Combobox(options=list(S.MODELS), value=model, description="model",
                             placeholder="a preset or a config.json path", ensure_option=False),
            gpus=_int(W, "GPUs", gpus, (8, 16, 32, 64, 128, 256, 512, 1024)),
            zero=_int(W, "ZeRO", zero, (0, 1, 2, 3)), tp=_int(W, "tp", tp, (1, 2, 4, 8)),
            pp=_int(W, "pp", pp, (1, 2, 4, 8, 16)), cp=_int(W, "cp", cp, (1, 2, 4, 8)),
            micro_batch=_int(W, "micro-batch", micro_batch, (1, 2, 4, 8)),
            recompute=W.Dropdown(options=list(S.RECOMPUTE), value=recompute, description="recompute"),
            seq_len=_int(W, "seq (0: own)", seq_len, self.SEQ_LENS),
            dtype=W.Dropdown(options=["own"] + list(S.DTYPES), value=dtype, description="precision")))

    def compute(self, **v):
        return S.memory_per_gpu(**{**v, "seq_len": v["seq_len"] or None,
                                   "dtype": None if v["dtype"] == "own" else v["dtype"]})

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

    SCHEDULES = ("gpipe", "1f1b", "interleaved", "zbh1", "zbv")

    def __init__(self, schedule: str = "1f1b", p: int = 4, m: int = 8, v: int = 2):
        super().__init__(dict(schedule=schedule, p=p, m=m, v=v), lambda W: dict(
            schedule=W.Dropdown(options=list(self.SCHEDULES), value=schedule, description="schedule"),
            p=_int(W, "p", p, (2, 3, 4, 6, 8)), m=_int(W, "m", m, (1, 2, 4, 8, 16, 32)),
            v=_int(W, "v", v, (1, 2, 3, 4))))

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
        super().__init__(dict(op=op, nodes=nodes, algorithm=algorithm, protocol=protocol), lambda W: dict(
            op=W.Dropdown(options=["all_reduce", "all_gather", "reduce_scatter", "all_to_all"], value=op,
                          description="op"),
            nodes=_int(W, "dgx-h100 nodes", nodes, (1, 2, 4, 8)),
            algorithm=W.Dropdown(options=["auto", "ring", "tree", "nvls"], value=algorithm, description="algorithm"),
            protocol=W.Dropdown(options=["auto", "LL", "LL128", "Simple"], value=protocol, description="protocol")))

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
        super().__init__(dict(mtbf_h=mtbf_h, checkpoint_s=checkpoint_s, restart_min=restart_min), lambda W: dict(
            mtbf_h=W.FloatLogSlider(value=mtbf_h, base=10, min=-1, max=2, description="MTBF (h)",
                                    continuous_update=False),
            checkpoint_s=W.FloatLogSlider(value=checkpoint_s, base=10, min=0, max=3, description="checkpoint (s)",
                                          continuous_update=False),
            restart_min=W.FloatSlider(value=restart_min, min=0, max=60, step=1, description="restart (min)",
                                      continuous_update=False)))

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
