"""Text that never overlaps in distlab's figures: where each label lands, and which labels to drop.

    labels = [ax.text(x, y, name, clip_on=True) for x, y, name in ops]
    keep_fitting(fig, labels)          # after tight_layout: labels that overlap others or leave the axes go
    assert overlapping_text(fig) == [] # what tests/test_figures.py asserts for every figure of every command

The rule (issue 33): no two text boxes of a figure overlap, and no label is cut by its axes. matplotlib's
renderer gives each text's extent in display pixels (``Text.get_window_extent(renderer)``, after the figure is
drawn once); a figure that would put a label over another drops the label instead (the figure's legend or a
note under it says what the marks mean, so no information is only in a label that went).

``keep_fitting`` goes through the labels in the order given (put the ones that matter most first), keeps a label
when its box lies inside its axes and overlaps none of the figure's fixed texts (titles, axis labels, tick
labels, legend) nor a label already kept, and hides it otherwise. The Pillow figure of `collective --timeline`
(sim/timeline_png.py) records its own boxes and is checked with ``overlaps``.

Why not adjustText (the library that places labels): it moves labels apart by repelling them, iteratively, and
draws arrows back; it makes overlaps rarer but does not promise none, and a moved label points at a mark it no
longer sits on. Here a label stays where it belongs or goes, and tests/test_figures.py can assert that nothing
overlaps; the functions below do it on matplotlib's own text extents, with no dependency.
"""
from __future__ import annotations

PAD_PX = 1.0      # boxes closer than this count as touching, not overlapping (antialiasing)


def renderer_of(fig, draw: bool = True):
    """A renderer for ``fig`` (Agg; attaches a canvas to a Figure made without pyplot), after one draw (which
    places the tick labels) unless ``draw`` is False (enough for texts placed in data coordinates)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    if draw:
        fig.canvas.draw()
    return fig.canvas.get_renderer()


def visible_texts(fig) -> list:
    """Every visible, non-empty Text of ``fig`` that a draw puts on it: titles, axis labels, the tick labels of
    ticks inside the view, legends, annotations (not the labels of ticks matplotlib skips)."""
    from matplotlib.text import Text
    skipped = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                loc = tick.get_loc()
                if loc is None or not (lo - 1e-9 * abs(hi - lo) <= loc <= hi + 1e-9 * abs(hi - lo)) \
                        or not tick.get_visible():
                    skipped |= {id(tick.label1), id(tick.label2)}
    out = []
    for t in fig.findobj(Text):
        if id(t) in skipped or not t.get_visible() or not t.get_text().strip():
            continue
        if t.axes is not None and not t.axes.get_visible():
            continue
        out.append(t)
    return out


def text_boxes(fig, cut: list | None = None) -> list[tuple[str, tuple[float, float, float, float]]]:
    """(text, (x0, y0, x1, y1) in display pixels) of every visible text of ``fig`` as drawn; ``cut``, if given,
    receives the texts their clip box (their axes) cuts in part."""
    renderer = renderer_of(fig)
    out = []
    for t in visible_texts(fig):
        box = t.get_window_extent(renderer)
        if box.width <= 0 or box.height <= 0:
            continue
        b = (box.x0, box.y0, box.x1, box.y1)
        clip = t.get_clip_box() if t.get_clip_on() else None
        if clip is not None:
            area = (clip.x0, clip.y0, clip.x1, clip.y1)
            if not _intersects(b, area):
                continue                               # clipped away entirely: not on the figure
            if cut is not None and not _inside(b, area):
                cut.append(t.get_text())
        out.append((t.get_text(), b))
    return out


def _intersects(a, b, pad: float = PAD_PX) -> bool:
    return a[0] < b[2] - pad and b[0] < a[2] - pad and a[1] < b[3] - pad and b[1] < a[3] - pad


def _inside(a, b) -> bool:
    return a[0] >= b[0] - PAD_PX and a[1] >= b[1] - PAD_PX and a[2] <= b[2] + PAD_PX and a[3] <= b[3] + PAD_PX


def overlaps(boxes: list[tuple[str, tuple]]) -> list[tuple[str, str]]:
    """The pairs of texts whose boxes overlap (by more than PAD_PX): sweep over x, so thousands are cheap."""
    order = sorted(boxes, key=lambda b: b[1][0])
    out, active = [], []
    for text, box in order:
        active = [(t, b) for t, b in active if b[2] - PAD_PX > box[0]]
        out += [(t, text) for t, b in active if _intersects(b, box)]
        active.append((text, box))
    return out


def overlapping_text(fig) -> list[tuple[str, str]]:
    """The pairs of visible texts of ``fig`` that overlap, (text, 'cut by its axes') for a clipped label its
    axes cut, (text, 'leaves its axes') for a label on the data (``ax.texts``: ax.text, ax.annotate) that
    runs past its axes and, for a figure that laid itself out (saved without a tight box:
    ``fig.distlab_fast``), (text, 'outside the figure') for a text the canvas cuts: empty for a figure that
    reads."""
    clipped: list = []
    boxes = text_boxes(fig, clipped)
    w, h = fig.canvas.get_width_height()
    cut = [(t, "outside the figure") for t, b in boxes
           if getattr(fig, "distlab_fast", False) and not _inside(b, (0, 0, w, h))]
    renderer = fig.canvas.get_renderer()
    strays = []
    for ax in fig.axes:                    # labels on the data (ax.text, ax.annotate) stay inside their axes
        area = ax.get_window_extent(renderer)
        for t in ax.texts:
            b = t.get_window_extent(renderer)
            if t.get_visible() and t.get_text().strip() and b.width > 0 and not _inside(
                    (b.x0, b.y0, b.x1, b.y1), (area.x0, area.y0, area.x1, area.y1)):
                strays.append((t.get_text(), "leaves its axes"))
    return overlaps(boxes) + cut + [(t, "cut by its axes") for t in clipped] + strays


def keep_fitting(fig, labels: list, within=None) -> list:
    """Hide the ``labels`` (Text artists, most important first) that would leave their axes (``within``: an
    Axes to stay inside instead) or overlap another text inside it (a label kept before them, a legend); return
    the ones kept. Call it once the figure is laid out (after tight_layout). No draw: a label's box comes from
    the renderer's font metrics (thousands of labels take a fraction of a second)."""
    renderer = renderer_of(fig, draw=False)
    wanted = set(map(id, labels))
    kept, taken = [], []
    for ax in {id(a): a for a in [within] + [t.axes for t in labels] if a is not None}.values():
        area = ax.get_window_extent(renderer)
        for t in ax.texts + ([ax.get_legend()] if ax.get_legend() else []):
            if id(t) not in wanted and t.get_visible():
                b = t.get_window_extent(renderer)
                if _intersects((b.x0, b.y0, b.x1, b.y1), (area.x0, area.y0, area.x1, area.y1)):
                    taken.append((b.x0, b.y0, b.x1, b.y1))
    for label in labels:
        ax = within or label.axes
        area = ax.get_window_extent(renderer) if ax is not None else None
        b = label.get_window_extent(renderer)
        box = (b.x0, b.y0, b.x1, b.y1)
        fits = area is None or _inside(box, (area.x0, area.y0, area.x1, area.y1))
        if fits and not any(_intersects(box, t) for t in taken):
            kept.append(label)
            taken.append(box)
        else:
            label.set_visible(False)
    return kept


OFFSETS = ((5, 3, "left", "bottom"), (5, -3, "left", "top"), (-5, 3, "right", "bottom"), (-5, -3, "right", "top"),
           (0, 7, "center", "bottom"), (0, -7, "center", "top"))       # points from the mark, and the alignment


def place_labels(fig, ax, points: list[tuple[float, float, str]], fontsize: float = 7) -> list:
    """Name marks on ``ax``: each (x, y, text) is tried at OFFSETS around its point in turn and kept at the first
    place where it stays inside the axes and overlaps no text placed before it (nor a legend or title); a label
    with no free place is left out. Returns the Text artists kept. Call it after the axes are laid out."""
    renderer = renderer_of(fig, draw=False)
    area = ax.get_window_extent(renderer)
    area = (area.x0, area.y0, area.x1, area.y1)
    taken = [(b.x0, b.y0, b.x1, b.y1) for b in (t.get_window_extent(renderer) for t in ax.texts if t.get_visible())]
    if ax.get_legend() is not None:
        b = ax.get_legend().get_window_extent(renderer)
        taken.append((b.x0, b.y0, b.x1, b.y1))
    kept = []
    for x, y, text in points:
        label = ax.annotate(text, (x, y), xytext=OFFSETS[0][:2], textcoords="offset points", fontsize=fontsize,
                            ha=OFFSETS[0][2], va=OFFSETS[0][3])
        for dx, dy, ha, va in OFFSETS:
            label.set_position((dx, dy))
            label.set_ha(ha)
            label.set_va(va)
            b = label.get_window_extent(renderer)
            box = (b.x0, b.y0, b.x1, b.y1)
            if _inside(box, area) and not any(_intersects(box, t) for t in taken):
                taken.append(box)
                kept.append(label)
                break
        else:
            label.remove()
    return kept
