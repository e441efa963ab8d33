"""Where a Vision Transformer looks: attention maps, rollout and overlays.

>>> maps = collect_attention(model, images)          # logits + every layer's weights
>>> maps.cls_maps()                                  # (layers, B, heads, h, w)
>>> maps.rollout(head_fusion="mean")                 # (B, h, w)
>>> fig = plot_attention(image, maps.cls_maps()[:, 0], layers=maps.layers, rollout=maps.rollout()[0])

The maps are collected in `vit.explain.maps` and drawn by `vit.explain.plot`. The translation model's attention is
in `vit.explain.text`, any query token's in `vit.explain.query`, the
Jupyter explorer in `vit.explain.widget`, the faithfulness checks in `vit.explain.checks`, and one image
prepared for a trained classifier and drawn with its top classes (`vit attention`'s figure) in `vit.explain.image`.
"""

from vit.explain.maps import (
    AttentionMaps,
    attention_rollout,
    cls_attention_maps,
    collect_attention,
    gradient_rollout,
    mean_attention_distance,
    rollout_layer,
    rollout_map,
    rollout_matrix,
    rollout_streaming,
)
from vit.explain.plot import normalise_map, overlay, plot_attention, to_display_image, upsample_map
from vit.explain.query import QueryMap, attention_from
from vit.explain.text import SentenceAttention, translation_attention

__all__ = [
    "AttentionMaps",
    "QueryMap",
    "SentenceAttention",
    "attention_from",
    "attention_rollout",
    "cls_attention_maps",
    "collect_attention",
    "gradient_rollout",
    "mean_attention_distance",
    "normalise_map",
    "overlay",
    "plot_attention",
    "rollout_layer",
    "rollout_map",
    "rollout_matrix",
    "rollout_streaming",
    "to_display_image",
    "translation_attention",
    "upsample_map",
]
