"""Files of weights, ours and others': `vit fit` checkpoints, their metadata and run folders, and pretrained
weights from timm, torchvision, big_vision, DINOv2 and CLIP files or the hub.

    io.py       checkpoint files: atomic writes, reads with clear errors (damaged, missing, sharded)
    meta.py     ``checkpoint["vit"]``: the task and what rebuilds its model
    runs.py     a config's run folders and their best/last checkpoints
    weights.py  `load_pretrained`: others' weights into our ViT, all or nothing (LoRA checkpoints merged)
    hub.py      the Hugging Face hub and its cache: a tag's or a shared model's files, offline in seconds
    pretrained_cfg.py  what a pretrained source says its images went through (`vit fit` follows the weights)
    convert.py  the key converters from other layouts to timm's
    convert_clip.py  two-tower checkpoints (OpenCLIP, transformers) -> `vit.nn.clip.CLIP`'s names and configs
    clip.py     `load_clip`: a CLIP or SigLIP model, both towers, with its tokenizer and image preparation
    zeroshot.py a zero-shot classifier (an image tower and a head of class-name embeddings) as a checkpoint
    lora.py     thin checkpoints of adapter fine-tuning: what trained, and the base they name
    average.py  weight-space averages of classifier checkpoints (WiSE-FT, uniform soups)
"""

from vit.checkpoints.io import read_checkpoint, save_checkpoint
from vit.checkpoints.meta import META_KEY, expect_task
from vit.checkpoints.weights import load_pretrained

__all__ = ["META_KEY", "expect_task", "load_pretrained", "read_checkpoint", "save_checkpoint"]
