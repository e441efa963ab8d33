"""An interactive attention explorer for Jupyter (ipywidgets, the `vit[notebook]` extra), for both models.

>>> AttentionExplorer(vit_model, image, display_image=rgb)      # click a patch; layer, head, rollout, mask
>>> AttentionExplorer(translator, "4 1 7 19 3")                 # pick a token; layer, head, kind, mask

Controls: the layer, the head (or their mean), the kind of attention (text), the query (a grid of patch
buttons plus the prefix tokens for an image, a token list for a sentence), attention rollout (image), the
DINO-style mask that keeps a share of the attention mass, and whether prefix tokens (cls, registers) are
shown. Every change redraws the figure into an ``Image`` widget as PNG bytes, so tests can set the controls
and read the output headless. Displayed in a notebook it also carries that PNG as ``image/png``: where widgets
do not render (GitHub, nbconvert), the static picture shows instead. All weights are computed once.
"""

from __future__ import annotations

import base64
import io
from typing import Any

from vit.errors import MissingPackageError
from vit.explain.query import QueryMap, mass_mask, plot_query, prefix_labels
from vit.nn.vision import VisionTransformer


def _widgets() -> Any:
    try:
        import ipywidgets
    except ImportError:
        raise MissingPackageError(
            "ipywidgets is not installed; the attention explorer needs it: pip install 'vit[notebook]' "
            "(vit.explain.query.plot_query draws the same view as a static figure)"
        ) from None
    return ipywidgets


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


class AttentionExplorer:
    """Widgets over one input's attention; ``widget`` is the box to display, ``image.value`` the PNG shown."""

    def __init__(self, model: Any, x: Any, *, display_image: Any = None, target: str | None = None,
                 beam_size: int = 1) -> None:
        w = _widgets()
        self.is_image = isinstance(model, VisionTransformer)
        if self.is_image:
            from vit.explain.maps import collect_attention
            from vit.explain.plot import to_display_image

            images = x[None] if x.dim() == 3 else x
            maps = collect_attention(model, images[:1])
            self.weights = {"encoder": maps.weights[:, 0]}  # (L, H, N, N)
            self.grid = maps.grid
            self.prefix = prefix_labels(model)
            self.display_image = to_display_image(images[0], min_side=224) if display_image is None else display_image
            kinds = ["encoder"]
        else:
            from vit.explain.text import translation_attention

            self.att = translation_attention(model, x, target, beam_size=beam_size)
            self.weights = {kind: self.att.weights(kind) for kind in ("encoder", "decoder", "cross")}
            kinds = ["cross", "decoder", "encoder"]
        layers, heads = self.weights[kinds[0]].shape[:2]
        self.kind = w.Dropdown(options=kinds, value=kinds[0], description="kind", disabled=self.is_image)
        self.layer = w.Dropdown(options=list(range(layers)), value=layers - 1, description="layer")
        self.head = w.Dropdown(options=["mean", *range(heads)], value="mean", description="head")
        self.rollout = w.Checkbox(value=False, description="rollout", disabled=not self.is_image)
        self.keep = w.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.05, description="keep mass",
                                  readout_format=".0%")
        self.show_prefix = w.Checkbox(value=True, description="prefix tokens", disabled=not self.is_image)
        self.image = w.Image(format="png")
        self.status = w.HTML()
        if self.is_image:
            self.query: Any = "cls" if "cls" in self.prefix else (0, 0)
            h, wd = self.grid
            self.buttons = {}
            for r in range(h):
                for c in range(wd):
                    button = w.Button(description="", layout=w.Layout(width="22px", height="22px", padding="0"),
                                      tooltip=f"patch ({r}, {c})")
                    button.on_click(lambda _, r=r, c=c: self.set_query((r, c)))
                    self.buttons[(r, c)] = button
            for name in self.prefix:
                button = w.Button(description=name, layout=w.Layout(width="60px"))
                button.on_click(lambda _, name=name: self.set_query(name))
                self.buttons[name] = button
            picker = w.VBox([w.HBox([self.buttons[n] for n in self.prefix]),
                             w.GridBox([self.buttons[(r, c)] for r in range(h) for c in range(wd)],
                                       layout=w.Layout(grid_template_columns=f"repeat({wd}, 24px)"))])
        else:
            self.token = w.Dropdown(description="query")
            self.token.observe(lambda _: self.update(), "value")
            picker = self.token
            self.query = 0
            self._token_options()
        for control in (self.layer, self.head, self.rollout, self.keep, self.show_prefix):
            control.observe(lambda _: self.update(), "value")
        self.kind.observe(self._kind_changed, "value")
        controls = w.VBox([self.kind, self.layer, self.head, self.rollout, self.keep, self.show_prefix, picker])
        self.widget = w.HBox([controls, w.VBox([self.image, self.status])])
        self.update()

    # ---- callbacks --------------------------------------------------------------------------------
    def _token_options(self) -> None:
        rows, _ = self.att.labels(self.kind.value)
        self.token.options = [(f"{i}: {piece}", i) for i, piece in enumerate(rows)]
        self.token.value = 0

    def _kind_changed(self, _: Any) -> None:
        self._token_options()
        self.update()

    def set_query(self, query: Any) -> None:
        """A patch (row, col), a prefix token's name, or (text) a token index; redraws."""
        if self.is_image:
            self.query = query
            self.update()
        else:
            self.token.value = query  # observed: redraws

    def current(self) -> QueryMap:
        """The query map the controls select, computed from the stored weights."""
        weights = self.weights[self.kind.value]  # (L, H, rows, columns)
        layer, head = self.layer.value, self.head.value
        if self.is_image:
            P, (h, w) = len(self.prefix), self.grid
            if isinstance(self.query, str):
                index, label = self.prefix.index(self.query), self.query
            else:
                index, label = P + self.query[0] * w + self.query[1], f"patch {self.query}"
            if self.rollout.value:
                from vit.explain.maps import rollout_layer, rollout_matrix

                chosen = weights[: layer + 1, None]  # (layers, 1, H, N, N)
                per_layer = [rollout_layer(a if head == "mean" else a[:, [head]], "mean") for a in chosen]
                row = rollout_matrix(per_layer)[0, index]
                label += f", rollout to layer {layer}"
            else:
                row = (weights[layer].mean(0) if head == "mean" else weights[layer, head])[index]
            return QueryMap(weights=row[P:].reshape(h, w).float(), query_label=label, prefix=row[:P].float(),
                            prefix_labels=self.prefix)
        rows, columns = self.att.labels(self.kind.value)
        t = self.token.value or 0
        row = weights[layer].mean(0)[t] if head == "mean" else weights[layer, head, t]
        return QueryMap(weights=row.float(), query_label=f"{self.kind.value}: {rows[t]!r}", labels=list(columns))

    def figure(self) -> Any:
        """The current view as a static matplotlib Figure."""
        m = self.current()
        grid_query = self.query if self.is_image and not isinstance(self.query, str) else None
        return plot_query(m, self.display_image if self.is_image else None, keep=self.keep.value,
                          show_prefix=self.show_prefix.value, grid_query=grid_query)

    def update(self) -> None:
        """Redraw the image widget and the status line from the controls."""
        m = self.current()
        self.image.value = _png(self.figure())
        kept = int(mass_mask(m.weights, self.keep.value).sum()) if self.keep.value > 0 else m.weights.numel()
        top = int(m.weights.flatten().argmax())
        where = m.labels[top] if m.labels else f"patch ({top // m.weights.shape[1]}, {top % m.weights.shape[1]})"
        self.status.value = (f"<b>{m.query_label}</b>: layer {self.layer.value}, head {self.head.value}; "
                             f"looks most at {where}; {kept} of {m.weights.numel()} kept")

    # ---- display ------------------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        # The widget for live front-ends, and the PNG for those that cannot run widgets.
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["image/png"] = base64.b64encode(self.image.value).decode()
        return bundle


__all__ = ["AttentionExplorer"]
