"""A ViT as a multi-scale backbone: ViTDet's simple feature pyramid (Li et al., 2022).

A plain ViT has one map, at the patch stride. ViTDet builds the four levels a detection or segmentation
head wants from that last map alone, with no top-down path:

image (B, 3, H, W) -> VisionTransformer, last block, prefix token dropped    (B, D, H/16, W/16)
  p2: deconv 2x2/2, LayerNorm, GELU, deconv 2x2/2                           (B, D/4, H/4,  W/4)
  p3: deconv 2x2/2                                                          (B, D/2, H/8,  W/8)
  p4: identity                                                              (B, D,   H/16, W/16)
  p5: max-pool 2x2/2                                                        (B, D,   H/32, W/32)
  each then: conv 1x1 -> LayerNorm -> conv 3x3 -> LayerNorm                 (B, out_channels, ...)

(strides for patch 16; in general patch/4, patch/2, patch, 2*patch). The output is an ordered dict with
an ``out_channels`` attribute on the module: torchvision's detection models take it as their backbone.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import Tensor, nn

from vit.nn.vision import VisionTransformer


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of a (B, C, H, W) map."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _conv_norm(in_channels: int, out_channels: int, kernel_size: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False),
        LayerNorm2d(out_channels, eps=1e-6),
    )


class SimpleFeaturePyramid(nn.Module):
    """``features_only`` for a ViT: maps at strides patch/4, patch/2, patch, 2*patch as ``{"p2": ..., "p5": ...}``.

    Takes the backbone over: its head (and final norm, unless ``norm``) are pruned, as timm's
    ``prune_intermediate_layers`` does. Build the backbone with ``dynamic_img_size=True`` for inputs of
    any size divisible by the patch; levels are named by log2 of their stride (p2 = stride 4).
    """

    def __init__(self, backbone: VisionTransformer, out_channels: int = 256, *, norm: bool = False) -> None:
        super().__init__()
        patch = backbone.patch_size
        if patch[0] != patch[1] or patch[0] % 4:
            raise ValueError(
                f"the pyramid upsamples the patch grid 4x: patch size {patch} must be square, a multiple of 4"
            )
        backbone.prune_intermediate_layers(1, prune_norm=not norm, prune_head=True)
        self.backbone, self.norm = backbone, norm
        self.out_channels = out_channels
        D, p = backbone.embed_dim, patch[0]
        scales = {
            p // 4: nn.Sequential(
                nn.ConvTranspose2d(D, D // 2, 2, stride=2), LayerNorm2d(D // 2, eps=1e-6), nn.GELU(),
                nn.ConvTranspose2d(D // 2, D // 4, 2, stride=2),
            ),
            p // 2: nn.ConvTranspose2d(D, D // 2, 2, stride=2),
            p: nn.Identity(),
            2 * p: nn.MaxPool2d(2, stride=2),
        }
        widths = {p // 4: D // 4, p // 2: D // 2, p: D, 2 * p: D}
        self.strides = {f"p{stride.bit_length() - 1}": stride for stride in scales}
        self.levels = nn.ModuleDict({
            name: nn.Sequential(
                scales[stride], _conv_norm(widths[stride], out_channels, 1), _conv_norm(out_channels, out_channels, 3)
            )
            for name, stride in self.strides.items()
        })

    def forward(self, x: Tensor) -> OrderedDict[str, Tensor]:
        """Images (B, C, H, W) -> {"p2": (B, out_channels, H/4, W/4), ..., "p5": (B, out_channels, H/32, W/32)}."""
        (last,) = self.backbone.forward_intermediates(x, indices=1, norm=self.norm, intermediates_only=True)
        return OrderedDict((name, level(last)) for name, level in self.levels.items())
