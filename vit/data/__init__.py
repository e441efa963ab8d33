"""Data: image and text DataModules, and the Lightning-free reading and transforms beneath them.

``vit.data.io`` (reading, scanning, splits), ``vit.data.transforms`` and ``vit.data.tokenizers``
import no Lightning; the DataModules below are imported on first use, so reading an image for
prediction never loads Lightning.

    io.py           image files: reading any mode as RGB, scanning class folders, header checks, splits
    transforms.py   timm's training augmentation and evaluation crop; fast.py: its cheaper uint8 CPU side
    protocol.py     what a dataset offers (the Protocols the DataModules' splits follow); fingerprint.py: its hash
    base.py         what every image DataModule shares: the options linked into the model, and the loaders;
                    sizing.py: img_size auto, the side read from the training images; resume.py: the training
                    loader's seeded order and per-sample draws, so a run resumes mid-epoch bit for bit
    files.py        a dataset of image files (decoded, bad ones named or replaced), the header check across ranks
    folder.py       class folders (and ImageNet's layout); cifar.py, digits.py: the bundled formats;
                    balance.py: a training split's class counts, the imbalance warning, balanced sampling
    rows.py         a labels table's rows (CSV, TSV, JSONL) read without Lightning; table.py: its DataModule;
                    stratify.py: multi-label splits that keep each label's share; row_checks.py: the table's guesses
                    (separator, label kind, label column) checked before training
    hf.py           Hugging Face data (save_to_disk, Hub Parquet, hf://) found and read with pyarrow; hfrows.py: its
                    rows as a labels table; hub.py: its DataModule, HFDataset;
                    hfstream.py: its training rows streamed to every worker and rank, resumable
    captions.py     image-caption tables for contrastive training; clip_text.py: CLIP/SigLIP tokenizers, prompts
    shards.py       an image folder written as streaming shards; stream.py: read back, with mid-epoch resume;
                    seeds.py: the per-sample seeds that make a streamed sample's draws the same in any run
    unlabelled.py   a folder without labels, for MAE pre-training; pool.py: unlabelled images beside a labelled
                    folder (``unlabelled_root``), a second training loader for distillation and semi-supervision
    tokenizers.py   word, character and BPE tokenizers for the text Transformer; corpus.py: parallel text files;
                    translation.py: its batches and DataModules; synthetic.py: toy translation tasks
"""

from __future__ import annotations

import importlib
from typing import Any

# DataModule -> the module that defines it (each family in its own file).
_DATAMODULES = {
    "ImageDataModule": "vit.data.base",
    "Digits": "vit.data.digits",
    "CIFAR": "vit.data.cifar",
    "ImageFolder": "vit.data.folder",
    "ImageNet": "vit.data.folder",
    "LabelsFile": "vit.data.table",
    "HFDataset": "vit.data.hub",
    "ImageShards": "vit.data.stream",
    "UnlabelledFolder": "vit.data.unlabelled",
    "TranslationDataModule": "vit.data.translation",
    "SyntheticTranslationDataModule": "vit.data.translation",
}

__all__ = sorted(_DATAMODULES)


def __getattr__(name: str) -> Any:
    if name in _DATAMODULES:
        return getattr(importlib.import_module(_DATAMODULES[name]), name)
    raise AttributeError(f"module 'vit.data' has no attribute {name!r}")
