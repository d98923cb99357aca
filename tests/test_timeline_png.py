"""Issue 12.6: `collective --timeline OUT.png` is drawn with Pillow (no matplotlib import): the same rows,
lanes and tab20 colours as sim/plots.py transfers_timeline, a time axis, one title and a legend."""
from __future__ import annotations

import io
import sys

import pytest
from PIL import Image

from distlab.sim.cluster import load_cluster
from distlab.sim.kernel.engine import simulate_collective
from distlab.sim.timeline_png import TAB20, layout, nice_ticks, timeline_png


@pytest.fixture(scope="module")
def ring():
    """A 2-node ring all-reduce: NCCL's channels put concurrent transfers of one pair into several lanes."""
    trace, _ = simulate_collective("all_reduce", 8 * 2**20, load_cluster("dgx-h100", 2), "ring",
                                   record_transfers=True)
    return trace


def rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def non_background(image, box) -> int:
    return sum(p != (255, 255, 255) for p in image.crop(box).get_flattened_data())


def test_png_has_bars_in_their_destinations_colour_a_title_and_a_legend(ring):
    image = Image.open(io.BytesIO(timeline_png(ring, title="all_reduce 8 MiB")))
    lay, placed = layout(ring)
    assert image.format == "PNG" and image.size == (1440, round((0.35 * 16 + 2.0) * 120)) == (lay.width, lay.height)
    assert image.mode == "RGB"
    for t, lane in sorted(placed, key=lambda p: p[0].start - p[0].end)[:5]:     # the five longest transfers
        x0, y0, x1, y1 = lay.bar(t, lane)
        assert image.getpixel(((x0 + x1) // 2, (y0 + y1) // 2)) == rgb(TAB20[t.dst % 20])
    assert image.getpixel((lay.left - 60, lay.top - 30)) == (255, 255, 255)
    assert non_background(image, (lay.left, 0, lay.right, lay.top - 4)) > 200        # the title
    assert non_background(image, (lay.right + 8, lay.top, lay.width, lay.top + 20)) > 50   # the legend's heading
    destinations = sorted({t.dst for t in ring.transfers})
    assert len(destinations) == 16                                                      # two columns
    for i, dst in enumerate(destinations):                                              # its swatches
        x0, y0, x1, y1 = lay.swatch(i, len(destinations))
        assert image.getpixel(((x0 + x1) // 2, (y0 + y1) // 2)) == rgb(TAB20[dst % 20])
    assert lay.swatch(8, 16)[0] > lay.swatch(7, 16)[0] and lay.swatch(8, 16)[1] == lay.swatch(0, 16)[1]
    assert non_background(image, (lay.left, lay.bottom + 6, lay.right, lay.height)) > 300   # ticks and unit
    assert non_background(image, (0, lay.top, lay.left - 6, lay.bottom)) > 16 * 40          # rank labels


def test_lanes_and_colours_match_the_matplotlib_timeline(ring):
    """transfers_timeline's PolyCollection: each bar's row, lane (from its y) and colour are the PNG's."""
    import matplotlib.cm as cm

    from distlab.sim.plots import transfers_timeline
    assert [rgb(c) for c in TAB20] == [tuple(round(255 * v) for v in cm.tab20(d / 20)[:3]) for d in range(20)]
    lay, placed = layout(ring)
    assert max(lay.lanes.values()) > 1                            # concurrent channels: several lanes
    poly, = transfers_timeline(ring).axes[0].collections
    assert len(poly.get_paths()) == len(placed)
    for (t, lane), path, face in zip(placed, poly.get_paths(), poly.get_facecolors()):
        row = lay.sources.index(t.src)
        y0, y1 = path.vertices[:, 1].min(), path.vertices[:, 1].max()
        assert (y0 - (row - 0.4)) / (y1 - y0) == pytest.approx(lane)
        assert tuple(round(255 * v) for v in face[:3]) == rgb(TAB20[t.dst % 20])


def test_switch_row_does_not_push_out_a_rank():
    """NVLS sends from the switch (-1): its row comes on top of the 16 ranks, not instead of rank 15."""
    trace, algorithm = simulate_collective("all_reduce", 2**20, load_cluster("dgx-h100", 2), "nvls_tree",
                                           record_transfers=True)
    lay, _ = layout(trace)
    assert lay.sources == [-1] + list(range(16))


def test_nice_ticks():
    assert nice_ticks(373.9) == [0, 50, 100, 150, 200, 250, 300, 350]
    assert nice_ticks(0.9) == [0, 0.2, 0.4, 0.6, 0.8]
    assert nice_ticks(12) == [0, 2, 4, 6, 8, 10, 12]
    assert nice_ticks(0) == [0.0]


def test_cli_png_timeline_never_imports_matplotlib(tmp_path, monkeypatch, capsys):
    """The PNG path of `collective --timeline` (check, simulate, draw, write) works with matplotlib unimportable."""
    from distlab.runtime.cli import main
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)             # any import of it raises ImportError
    out = tmp_path / "t.png"
    assert main(["collective", "all_reduce", "--size", "1MiB", "--nodes", "2", "--algo", "nvls_tree",
                 "--timeline", str(out)]) == 0, capsys.readouterr().err
    assert Image.open(out).size == (1440, round((0.35 * 17 + 2.0) * 120))        # the switch and 16 ranks
