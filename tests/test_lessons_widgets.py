"""The lessons' sliders (sim/lessons/widgets.py) driven without a browser: set a control's value, read what the
widget computed; and the numbers behind them (sim/lessons/sliders.py) against the library and the lessons."""
import math

import pytest

from distlab.sim.lessons import sliders as S

pytest.importorskip("ipywidgets")
PNG = b"\x89PNG\r\n\x1a\n"


def test_memory_follows_zero_stages_and_the_planners_accounting():
    from distlab.sim.cluster import load_cluster
    from distlab.sim.planner.layouts import Layout
    from distlab.sim.planner.step import Estimator
    by_stage = [S.memory_per_gpu("llama3-8b", 64, z, tp=2, recompute="selective") for z in range(4)]
    ddp, z1, z2, z3 = by_stage
    dp = ddp["dp"]
    assert dp == 32 and z1["optimizer"] == pytest.approx(ddp["optimizer"] / dp)
    assert z1["grads"] == ddp["grads"] and z2["grads"] == pytest.approx(ddp["grads"] / dp)
    assert z3["params"] < z2["params"] == ddp["params"]
    assert [r["total"] for r in by_stage] == sorted((r["total"] for r in by_stage), reverse=True)
    assert len({r["activations"] for r in by_stage}) == 1           # data parallelism shards no activation
    est = Estimator({"preset": "llama3-8b"}, load_cluster("dgx-h100", 8))
    want = est.memory(Layout(2, 1, 32, "fsdp", 1, 1, True, "selective"))
    assert {k: z3[k] for k in want} == want
    # lesson 11's DDP question: 16 bytes per parameter of Llama 3 70B on every GPU, whatever the GPUs
    ddp70 = S.memory_per_gpu("llama3-70b", 64, 0)
    state = ddp70["params"] + ddp70["grads"] + ddp70["optimizer"]
    from distlab.sim.lessons import solution
    assert f"{state / 2**30:.4g} GiB" == solution("11-ddp-state") and not ddp70["fits"]
    with pytest.raises(ValueError, match="does not divide"):
        S.memory_per_gpu("llama3-8b", 64, 3, tp=8, pp=16)


def test_memory_of_pipelines_and_context_parallelism():
    one = S.memory_per_gpu("llama3-8b", 64, 0, tp=2, pp=1, recompute="selective")
    pipe = S.memory_per_gpu("llama3-8b", 64, 0, tp=2, pp=4, recompute="selective", microbatches=8)
    assert pipe["params"] < one["params"] / 3                      # a stage holds about a quarter of the layers
    cp = S.memory_per_gpu("llama3-8b", 64, 3, tp=2, cp=4, seq_len=131072, recompute="full")
    assert "ring buffers" in cp and cp["activations"] > 0


def test_bubble_is_lesson_07s():
    r = S.bubble("1f1b", 4, 8)
    assert r["simulated"] == pytest.approx(3 / 11) and r["formula"] == pytest.approx(3 / 11)
    assert S.bubble("interleaved", 4, 8, 2)["simulated"] == pytest.approx(3 / 19)
    assert S.bubble("zbh1", 4, 8)["formula"] is None and S.bubble("zbh1", 4, 8)["simulated"] < 3 / 11
    assert S.bubble("1f1b", 4, 8, v=3)["v"] == 1                     # v only for interleaved


def test_busbw_curve_levels_off_where_lesson_02_says():
    ring = S.busbw_curve(algorithm="ring", protocol="Simple", sizes=(2**30,))[0]
    ll = S.busbw_curve(algorithm="ring", protocol="LL", sizes=(2**30,))[0]
    assert ring["busbw_GBps"] == pytest.approx(370, rel=0.03) and ll["busbw_GBps"] == pytest.approx(141, rel=0.03)
    rows = S.busbw_curve(nodes=2)
    assert [r["bytes"] for r in rows] == list(S.SIZES) and rows[-1]["busbw_GBps"] > rows[0]["busbw_GBps"]


def test_goodput_has_young_and_daly_on_its_top():
    g = S.goodput(3.0, 120.0, 10.0)
    assert g["young_s"] == pytest.approx(math.sqrt(2 * 120 * 3 * 3600))
    assert g["at_best"] >= max(g["at_young"], g["at_daly"]) - 1e-12 >= max(g["goodput"]) - 0.01
    from distlab.sim.lessons import solution
    assert f"{100 * g['at_young']:.4g}%" == solution("12-goodput")


def test_widgets_follow_their_controls():
    from distlab.sim.lessons.widgets import BubbleWidget, CollectiveWidget, GoodputWidget, MemoryWidget
    m = MemoryWidget(model="llama3-8b", gpus=64, zero=0, tp=2, recompute="selective")
    before = m.result["total"]
    m.controls["zero"].value = 3
    assert m.result == S.memory_per_gpu("llama3-8b", 64, 3, tp=2, recompute="selective")
    assert m.result["total"] < before and "optimizer" in m.table.value and bytes(m.image.value).startswith(PNG)
    m.controls["pp"].value = 16
    m.controls["tp"].value = 8                                     # 128 GPUs' worth: said, the last result kept
    assert "does not divide" in m.error.value and m.result["dp"] == 32
    b = BubbleWidget()
    b.controls["m"].value = 16
    assert b.result["simulated"] == pytest.approx(3 / 19) and "15.8%" in b.table.value
    b.controls["m"].value = 2
    assert "m >= p" in b.message and "m &gt;= p" in b.error.value               # said, escaped as HTML
    c = CollectiveWidget()
    c.controls["protocol"].value = "LL"
    assert {r["protocol"] for r in c.result} == {"LL"} and bytes(c.image.value).startswith(PNG)
    c.controls["op"].value = "all_to_all"                          # the ring cannot: said, nothing computed
    assert "all_to_all" in c.error.value
    g = GoodputWidget(mtbf_h=3.0, checkpoint_s=120.0, restart_min=5.0)
    g.controls["restart_min"].value = 10.0
    assert g.result["at_young"] == S.goodput(3.0, 120.0, 10.0)["at_young"] and "Young" in g.table.value
    assert "VBox" in repr(g.box)
    bundle = g._repr_mimebundle_()                    # live where a kernel runs; a PNG and a table for a saved page
    assert "application/vnd.jupyter.widget-view+json" in bundle and "Young" in bundle["text/html"]
    import base64
    assert base64.b64decode(bundle["image/png"]).startswith(PNG)


def test_without_ipywidgets_a_widget_shows_its_default_state_and_how_to_install(monkeypatch):
    from distlab.sim.lessons import widgets
    monkeypatch.setattr(widgets, "_ipywidgets", lambda: None)
    for w in (widgets.MemoryWidget(model="llama3-8b"), widgets.BubbleWidget(), widgets.GoodputWidget()):
        bundle = w._repr_mimebundle_()
        assert w.static and not w.controls and "pip install" in bundle["text/plain"] and "pip install" in \
            bundle["text/html"] and "application/vnd.jupyter.widget-view+json" not in bundle
        import base64
        assert base64.b64decode(bundle["image/png"]).startswith(PNG) and w.result
