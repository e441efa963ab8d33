"""Tokenizers, bucketed batches and synthetic tasks of the translation data. (Reading the corpus: test_corpus.py.)"""

from __future__ import annotations

import logging
import random
import re

import pytest
import torch
from torch.utils.data import SequentialSampler

from tests.data.test_corpus import write_tsv
from tests.formats import CORPUS
from vit.data.tokenizers import (
    BOS_ID,
    EOS_ID,
    UNK_ID,
    tokenizer_from_dict,
)
from vit.data.translation import (
    EpochSampler,
    LengthBucketBatchSampler,
    SyntheticTranslationDataModule,
    TranslationDataModule,
    collate_pairs,
)


def test_vocabulary_comes_from_the_training_split_only(tmp_path):
    train = write_tsv(tmp_path / "train.tsv", [f"{s}\t{t}" for s, t in CORPUS])
    val = write_tsv(tmp_path / "val.tsv", ["Zebras sing.\tLes zèbres chantent."])
    dm = TranslationDataModule(train, val, tokenizer="word", lowercase=True)
    assert "zebras" not in dm.source_tokenizer.tokens and "zèbres" not in dm.target_tokenizer.tokens
    dm.setup("fit")
    (src, tgt, *_), = dm.datasets["val"].examples
    assert src[0] == UNK_ID and tgt[1] == UNK_ID
    saved = tokenizer_from_dict(dm.tokenizers["target"])
    assert saved.encode("le chat") == dm.target_tokenizer.encode("le chat")
    shared = TranslationDataModule(train, val, share_vocab=True)
    assert shared.tokenizers["source"] == shared.tokenizers["target"]
    assert "chat" in shared.source_tokenizer.tokens and "cat" in shared.source_tokenizer.tokens


def test_held_out_validation_split_and_length_filter(tmp_path, caplog):
    lines = [f"{'a ' * n}\t{'b ' * n}" for n in range(1, 41)]
    corpus = write_tsv(tmp_path / "c.tsv", lines)
    dm = TranslationDataModule(corpus, val_fraction=0.25, max_length=20, seed=3)
    assert len(dm.pairs["train"]) == 30 and len(dm.pairs["val"]) == 10
    assert not set(dm.pairs["train"]) & set(dm.pairs["val"])
    order = list(range(40))  # without repeated pairs the split is a seeded shuffle of the lines, as it always was
    random.Random(3).shuffle(order)
    assert dm.pairs["val"] == [(("a " * (i + 1)).strip(), ("b " * (i + 1)).strip()) for i in order[:10]]
    # An export that repeats pairs: every copy of a held-out pair is held out with it.
    repeated = TranslationDataModule(write_tsv(tmp_path / "r.tsv", [f"s{i % 10}\tt{i % 10}" for i in range(200)]),
                                     val_fraction=0.1)
    assert len(repeated.pairs["val"]) == 20 and not set(repeated.pairs["train"]) & set(repeated.pairs["val"])
    # Pairs over max_length are an error that names a line, unless skipped on request (and counted).
    with pytest.raises(ValueError, match=r"c\.tsv: 1\d pair\(s\) .* longer than data\.max_length=20 .*first line \d+ "):
        dm.setup("fit")
    dm = TranslationDataModule(corpus, val_fraction=0.25, max_length=20, seed=3, skip_bad_lines=True)
    with caplog.at_level(logging.WARNING, logger="vit.data.translation"):
        dm.setup("fit")
    left_out = [int(n) for n in re.findall(r"left out (\d+) of", caplog.text)]
    assert sum(left_out) == 21  # n >= 20 of 1..40: a target of n tokens plus EOS exceeds 20
    assert re.search(r"line (\d+) \(\1 source, \d+ target tokens\)", caplog.text)
    kept = dm.datasets["train"].examples + dm.datasets["val"].examples
    assert len(kept) == 19  # target + EOS must fit in 20 tokens: n <= 19
    assert max(len(t) for _, t, *_ in kept) == 19
    with pytest.raises(ValueError, match="no test split"):
        dm.test_dataloader()


def test_collate_pads_shifts_targets_and_builds_masks():
    batch = collate_pairs([([5, 6, 7], [8], "x y z", "w"), ([5], [9, 10], "x", "u v")])
    assert batch["src"].tolist() == [[5, 6, 7], [5, 0, 0]]
    assert batch["src_padding_mask"].tolist() == [[False, False, False], [False, True, True]]
    assert batch["tgt_in"].tolist() == [[BOS_ID, 8, 0], [BOS_ID, 9, 10]]
    assert batch["tgt_out"].tolist() == [[8, EOS_ID, 0], [9, 10, EOS_ID]]
    assert batch["tgt_padding_mask"].tolist() == [[False, False, True], [False, False, False]]
    assert batch["target_text"] == ["w", "u v"]


def test_length_buckets_cover_every_sentence_once_with_little_padding():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 60, (2000,), generator=g).tolist()
    sampler = LengthBucketBatchSampler(EpochSampler(lengths, seed=0), 32, lengths=lengths, shuffle=True)

    def padding_fraction(batches):
        padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
        return 1 - sum(lengths) / padded

    epoch1 = list(sampler)
    sampler.sampler.set_epoch(1)  # Lightning calls this at every epoch start
    epoch2 = list(sampler)
    assert sorted(i for b in epoch1 for i in b) == list(range(2000))
    assert epoch1 != epoch2  # reshuffled every epoch ...
    assert list(sampler) == epoch2  # ... by the epoch alone, so a resumed run draws the same batches
    order = torch.randperm(2000, generator=g).tolist()
    random_batches = [order[i : i + 32] for i in range(0, 2000, 32)]
    assert padding_fraction(epoch1) < 0.1 < 0.3 < padding_fraction(random_batches)
    fixed = LengthBucketBatchSampler(SequentialSampler(lengths), 32, lengths=lengths, shuffle=False)
    assert list(fixed) == list(fixed) and len(list(fixed)) == len(fixed) == 63
    assert len(sampler) == 63 and len(list(LengthBucketBatchSampler(EpochSampler(lengths), 32, True, lengths=lengths,
                                                                    shuffle=True))) == 62  # 2000 = 62 x 32 + 16


def test_under_ddp_each_rank_buckets_its_own_share_of_the_sentences():
    """Lightning rebuilds the batch sampler on a DistributedSampler: the ranks' batches split the data."""
    from torch.utils.data import DistributedSampler

    lengths = torch.randint(2, 60, (1000,), generator=torch.Generator().manual_seed(0)).tolist()
    shares = []
    for rank in (0, 1):
        share = DistributedSampler(lengths, num_replicas=2, rank=rank, shuffle=True, seed=0)
        share.set_epoch(3)
        batches = list(LengthBucketBatchSampler(share, 32, lengths=lengths, shuffle=True))
        assert len(batches) == 16  # 500 each: the same count on every rank, so no rank waits for another
        shares.append(sorted(i for b in batches for i in b))
    assert sorted(shares[0] + shares[1]) == list(range(1000))


def test_synthetic_data_module_holds_out_unseen_sources():
    dm = SyntheticTranslationDataModule("reverse", num_train=300, num_val=50, num_test=100, min_len=2,
                                        max_len=4, num_symbols=5, batch_size=16)
    train = {s for s, _ in dm.pairs["train"]}
    val, test = {s for s, _ in dm.pairs["val"]}, {s for s, _ in dm.pairs["test"]}
    assert len(dm.pairs["test"]) == 100 and not (train & val) and not (train & test) and not (val & test)
    assert dm.source_tokenizer.vocab_size == 4 + 5
    batch = next(iter(dm.test_dataloader()))
    assert batch["src"].shape[0] == 16 and batch["tgt_out"].eq(EOS_ID).sum() == 16
    with pytest.raises(ValueError, match="too small"):
        _ = SyntheticTranslationDataModule("copy", num_train=100, num_val=100, min_len=1, max_len=1,
                                           num_symbols=3).pairs
