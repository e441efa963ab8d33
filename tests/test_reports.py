"""The figures of the reports (`vit.reports`): the error grid."""

from __future__ import annotations


def test_the_error_grid_shows_each_image_beside_its_overlay_under_its_caption():
    """Every pair lands in its own cell of the one picture drawn (four pairs a row), unaltered; long captions
    wrap to two lines."""
    import numpy as np

    from vit.reports import error_grid_figure

    rng = np.random.default_rng(0)
    images = [rng.random((20, 20, 3)) for _ in range(6)]
    overlays = [rng.random((20, 20, 3)) for _ in range(6)]
    captions = [f"true class {k}, predicted class {k + 1} (90%)" for k in range(5)] + ["true " + "x" * 120]
    fig = error_grid_figure(images, overlays, captions)
    (ax,) = fig.axes
    canvas = np.asarray(ax.images[0].get_array())
    found = []
    for picture in (*images, *overlays):  # where each picture is, found by its top-left pixel, then compared
        ys, xs = np.nonzero((canvas == picture[0, 0]).all(axis=-1))
        (y, x), = [(y, x) for y, x in zip(ys, xs) if np.array_equal(canvas[y:y + 20, x:x + 20], picture)]
        found.append((y, x))
    rows = sorted({y for y, _ in found})
    assert len(rows) == 2 and [sum(y == rows[0] for y, _ in found), sum(y == rows[1] for y, _ in found)] == [8, 4]
    for k in range(6):  # the overlay to the right of its image, in the same row
        (yi, xi), (yo, xo) = found[k], found[6 + k]
        assert yi == yo and xi + 20 <= xo and (yi == rows[0]) == (k < 4)
        x, y = ax.texts[k].get_position()  # its caption starts at the image's left edge, just above it
        assert x == xi and yi - 20 / 4 <= y < yi
    texts = [t.get_text() for t in ax.texts]
    assert texts[:5] == captions[:5] and texts[5].count("\n") == 1 and texts[5].endswith("...")


def test_the_label_error_captions_stay_inside_their_panels():
    """Long class lists ran into the next panel: every caption, drawn, lies within its own column's width and
    clear of its neighbours' captions (measured on the rendered figure)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from vit.reports import label_errors_figure

    names = ", ".join(f"label_number_{k}" for k in range(9))
    captions = [f"FP class_{k} 0.93\ntrue {names}\nsaid {names}" for k in range(8)]
    fig = label_errors_figure([np.zeros((8, 8, 3))] * 8, captions)
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    axes = fig.axes
    boxes = [ax._left_title.get_window_extent(renderer) for ax in axes[:8]]  # (set_title(loc="left")'s text)
    for k, box in enumerate(boxes):
        column = axes[k].get_position()  # its panel's share of the figure
        right = (axes[k + 1].get_position().x0 if k % 6 < 5 else 1.0) * fig.bbox.width
        assert box.x0 >= column.x0 * fig.bbox.width - 1 and box.x1 <= right + 1, (k, box, right)
        assert box.y0 >= axes[k].get_window_extent(renderer).y1 - 1  # above its image, not over it
    assert all(not a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    images = [ax.get_window_extent(renderer) for ax in axes[:8]]  # a row's captions clear of the row above
    assert not [(i, j) for i, box in enumerate(boxes) for j, image in enumerate(images)
                if i != j and box.overlaps(image)]
    assert not [(i, j) for i, a in enumerate(images) for j, b in enumerate(images) if i < j and a.overlaps(b)]
    title = fig._suptitle.get_window_extent(renderer)  # the figure's title clear of the first row's captions
    assert all(not title.overlaps(box) for box in boxes), [title, boxes[:6]]


def test_the_curves_middle_panel_shows_a_multi_label_runs_map_and_says_so():
    """A multi-label run logs val_map and F1, no accuracy: the panel showed "no val accuracy logged"."""
    from vit.reports import training_curves_figure

    val = {"val_loss": [(5, 0.6)], "val_map": [(5, 0.4), (10, 0.7)], "val_f1_micro": [(5, 0.5), (10, 0.6)]}
    fig = training_curves_figure([(1, 2.0)], val, [(1, 0.1)])
    middle = fig.axes[1]
    assert middle.get_title() == "validation mAP, f1 micro"
    assert sorted(line.get_label() for line in middle.get_lines()) == ["val_f1_micro", "val_map"]
    assert [list(line.get_ydata()) for line in middle.get_lines() if line.get_label() == "val_map"] == [[0.4, 0.7]]
    assert not middle.texts
    single = {"val_loss": [(5, 0.6)], "val_acc": [(5, 0.8)], "val_acc_balanced": [(5, 0.7)]}
    middle = training_curves_figure([(1, 2.0)], single, [(1, 0.1)]).axes[1]
    assert middle.get_title() == "validation accuracy"
    assert sorted(line.get_label() for line in middle.get_lines()) == ["val_acc", "val_acc_balanced"]
    empty = training_curves_figure([(1, 2.0)], {"val_loss": [(5, 0.6)]}, [(1, 0.1)]).axes[1]
    assert empty.texts[0].get_text() == "no validation metric logged"
