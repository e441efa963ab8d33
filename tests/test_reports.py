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
