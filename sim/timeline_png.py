"""The transfers timeline as a PNG drawn with Pillow: what `distlab collective --timeline OUT.png` writes.

The same figure as sim/plots.py ``transfers_timeline`` (matplotlib; still used for .svg/.pdf and in the
lessons): one row per sending rank, one bar per transfer in the same lanes (sim/chrome.py
``transfer_lanes``) and colours (matplotlib's tab20, by destination), a time axis with ticks and its unit,
one title and a legend of destinations. Drawn without matplotlib, whose import alone (~0.4 s) cost more than
the simulation it shows (issue 12.6: the command with --timeline within 2x of the command without it).
Size: matplotlib's figure at 120 dpi, 1440 x (0.35 x rows + 2) x 120 pixels.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from functools import lru_cache

# matplotlib's "tab20" colormap (matplotlib/_cm.py _tab20_data); destination d gets TAB20[d % 20]
TAB20 = ["#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896", "#9467bd",
         "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d",
         "#17becf", "#9edae5"]
UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6}     # Pillow's default font has no µ: "us", as in plots.py
DPI, WIDTH_IN = 120, 12
BACKGROUND, INK, GRID = "#ffffff", "#222222", "#e4e4e4"
TITLE_H, AXIS_H, LEGEND_COLUMN_W = 44, 64, 80


def rank_label(rank: int) -> str:
    return "switch" if rank < 0 else str(rank)


@dataclass
class Layout:
    """Where things go, in pixels: the plot area (left, top, right, bottom), rows of ``row_h`` pixels (one
    per source, ``lanes`` lanes each), and ``time_max_s`` at the right edge."""
    width: int
    height: int
    left: int
    top: int
    right: int
    bottom: int
    sources: list[int]
    lanes: dict[int, int]
    time_max_s: float

    row_h: float = field(init=False)
    row: dict[int, int] = field(init=False)            # source -> its row, from the top

    def __post_init__(self):
        self.row_h = (self.bottom - self.top) / max(len(self.sources), 1)
        self.row = {src: i for i, src in enumerate(self.sources)}

    def x(self, time_s: float) -> float:
        return self.left + time_s / self.time_max_s * (self.right - self.left)

    def swatch(self, i: int, count: int) -> tuple[int, int, int, int]:
        """(x0, y0, x1, y1) of the legend's i-th colour of ``count`` (at most 20: 1 column up to 12, else 2)."""
        per_col = count if count <= 12 else math.ceil(count / 2)
        x, y = self.right + 16 + (i // per_col) * LEGEND_COLUMN_W, self.top + 24 + (i % per_col) * 20
        return x, y, x + 14, y + 12

    def bar(self, t, lane: int) -> tuple[int, int, int, int]:
        """(x0, y0, x1, y1) of a transfer's bar, inclusive pixels: 80% of its row, split among its lanes."""
        h = 0.8 * self.row_h / self.lanes[t.src]
        y0 = self.top + (self.row[t.src] + 0.1) * self.row_h + lane * h
        x0, x1 = round(self.x(t.start)), round(self.x(t.end))
        return x0, round(y0), max(x0, x1 - 1), max(round(y0), round(y0 + h) - 1)


def nice_ticks(hi: float, target: int = 8) -> list[float]:
    """Ticks 0, step, 2 step, ... <= hi with step 1, 2 or 5 x 10^k, about ``target`` of them."""
    if hi <= 0:
        return [0.0]
    raw = hi / target
    base = 10 ** math.floor(math.log10(raw))
    step = next(m * base for m in (1, 2, 5, 10) if m * base >= raw)
    return [round(k * step, 12) for k in range(int(hi / step + 1e-9) + 1)]


@lru_cache(maxsize=None)
def _font(size: int):
    from PIL import ImageFont
    return ImageFont.load_default(size=size)


def layout(trace, max_ranks: int = 16) -> tuple[Layout, list]:
    """The Layout of ``trace``'s timeline and its [(transfer, lane)] (sim/chrome.py ``transfer_lanes``)."""
    from distlab.sim.chrome import transfer_lanes
    sources, placed, lanes = transfer_lanes(trace.transfers, max_ranks)
    width, height = WIDTH_IN * DPI, round((0.35 * len(sources) + 2.0) * DPI)
    label_w = max([_font(13).getlength(f"rank {rank_label(s)}") for s in sources] + [40])
    ncol = 1 if len({t.dst for t in trace.transfers}) <= 12 else 2
    end = max((t.end for t, _ in placed), default=0.0) or 1e-6
    return Layout(width, height, left=int(label_w) + 20, top=TITLE_H, right=width - 40 - LEGEND_COLUMN_W * ncol,
                  bottom=height - AXIS_H, sources=sources, lanes=lanes, time_max_s=end * 1.01), placed


NOTE = ("each bar: one transfer (a step of the collective) from its row's rank, in its destination's colour; "
        "bars stacked in a row: transfers at the same time (NCCL's channels)")


class _Canvas:
    """Pillow's ImageDraw, keeping the box of every text drawn (``boxes``: (text, (x0, y0, x1, y1)) in pixels,
    y down), so a test can check that no two overlap (sim/figure_text.py ``overlaps``)."""

    def __init__(self, image, boxes: list | None):
        from PIL import ImageDraw
        self.draw, self.boxes = ImageDraw.Draw(image), boxes

    def text(self, xy, text: str, **kw) -> None:
        self.draw.text(xy, text, **kw)
        if self.boxes is not None:
            x0, y0, x1, y1 = self.draw.textbbox(xy, text, font=kw.get("font"), anchor=kw.get("anchor"))
            self.boxes.append((text, (x0, -y1, x1, -y0)))        # y up, as matplotlib's display boxes

    def __getattr__(self, name):
        return getattr(self.draw, name)


def timeline_png(trace, title: str | None = None, max_ranks: int = 16, unit: str = "us",
                 boxes: list | None = None) -> bytes:
    """The PNG bytes of the transfers timeline of ``trace`` (a Trace recorded with record_transfers=True);
    ``boxes``, if given, receives every text's box (``_Canvas``)."""
    from PIL import Image
    scale = UNITS[unit]
    lay, placed = layout(trace, max_ranks)
    image = Image.new("RGB", (lay.width, lay.height), BACKGROUND)
    draw = _Canvas(image, boxes)
    small, normal, big = _font(12), _font(13), _font(16)
    for tick in nice_ticks(lay.time_max_s * scale):                      # grid and x axis
        x = round(lay.x(tick / scale))
        draw.line((x, lay.top, x, lay.bottom), fill=GRID)
        draw.line((x, lay.bottom, x, lay.bottom + 5), fill=INK)
        draw.text((x, lay.bottom + 8), f"{tick:g}", fill=INK, font=small, anchor="mt")
    draw.text(((lay.left + lay.right) / 2, lay.bottom + 28), f"time ({unit})", fill=INK, font=normal,
              anchor="mt")
    draw.text((lay.left, lay.bottom + 46), NOTE, fill=INK, font=small, anchor="lt")
    for t, lane in placed:                                                # one bar per transfer
        draw.rectangle(lay.bar(t, lane), fill=TAB20[t.dst % 20])
    for row, src in enumerate(lay.sources):                               # rank labels
        y = lay.top + (row + 0.5) * lay.row_h
        draw.line((lay.left - 5, y, lay.left, y), fill=INK)
        draw.text((lay.left - 8, y), "switch" if src < 0 else f"rank {src}", fill=INK, font=normal, anchor="rm")
    draw.rectangle((lay.left, lay.top, lay.right, lay.bottom), outline=INK)
    ranks = len({t.src for t in trace.transfers if t.src >= 0})
    shown = sum(s >= 0 for s in lay.sources)
    title = ", ".join(p for p in (title, f"first {shown} of {ranks} sending ranks" if shown < ranks else "") if p)
    if title:
        draw.text((lay.left, TITLE_H // 2), title, fill=INK, font=big, anchor="lm")
    _legend(draw, lay, sorted({t.dst for t in trace.transfers}), normal, small)
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _legend(draw, lay: Layout, destinations: list[int], font, small) -> None:
    """"to rank" and a swatch per destination (the first 20: tab20 repeats after), in 1 or 2 columns."""
    shown = destinations[:20]
    draw.text((lay.right + 16, lay.top), "to rank" + (" (first 20)" if len(destinations) > 20 else ""), fill=INK,
              font=font)
    for i, dst in enumerate(shown):
        x0, y0, x1, y1 = lay.swatch(i, len(shown))
        draw.rectangle((x0, y0, x1, y1), fill=TAB20[dst % 20])
        draw.text((x1 + 6, (y0 + y1) / 2), rank_label(dst), fill=INK, font=small, anchor="lm")


def save_timeline_png(trace, path: str, title: str | None = None, max_ranks: int = 16) -> None:
    """Write the timeline PNG to ``path`` atomically (sim/io.py ``write_atomic``)."""
    from distlab.sim.io import write_atomic
    write_atomic(path, timeline_png(trace, title, max_ranks))
