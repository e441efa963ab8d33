"""Translator: training through `vit fit`, metrics, checkpoints that translate on their own."""

from __future__ import annotations

import codecs
import csv
import logging
import random
import re
from pathlib import Path

import pytest
import sacrebleu
import torch

from tests import CONFIGS
from tests.conftest import free_port, quiet_run
from tests.helpers import TINY_DIM, quick_trainer
from vit.cli.main import cli
from vit.commands import main, run
from vit.data.tokenizers import build_tokenizer
from vit.data.translation import SyntheticTranslationDataModule, TranslationDataModule
from vit.tasks import load_task
from vit.tasks.translate import Translator, inverse_sqrt_schedule

TINY_MODEL = ["--model.init_args.embed_dim", str(TINY_DIM), "--model.init_args.num_heads", "2",
              "--model.init_args.num_encoder_layers", "1", "--model.init_args.num_decoder_layers", "1"]


def tiny_translation_task(dm, **kwargs) -> Translator:
    torch.manual_seed(0)
    return Translator(dm.tokenizers, embed_dim=TINY_DIM, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                      **kwargs)


def test_translator_needs_tokenizers_and_valid_options():
    with pytest.raises(ValueError, match="needs tokenizers"):
        Translator()
    dm = SyntheticTranslationDataModule("copy", num_train=50, num_val=5, num_test=5)
    with pytest.raises(ValueError, match=r"model\.decoding"):
        tiny_translation_task(dm, decoding="sampling")
    small = dict(num_train=50, num_val=5, num_test=5, min_len=1, max_len=4)
    with pytest.raises(ValueError, match=r"data\.share_vocab"):
        numbers = SyntheticTranslationDataModule("numbers", **small)
        tiny_translation_task(numbers, share_embeddings=True)  # digits in, words out
    shared = SyntheticTranslationDataModule("numbers", share_vocab=True, **small)
    model = tiny_translation_task(shared, share_embeddings=True)
    assert model.model.src_embed.token is model.model.tgt_embed.token


def test_loss_is_label_smoothed_and_ignores_padding():
    dm = SyntheticTranslationDataModule("reverse", num_train=64, num_val=8, num_test=8, batch_size=8)
    dm.setup()
    model = tiny_translation_task(dm, drop_rate=0.0)
    batch = next(iter(dm.train_dataloader()))
    logits = model(batch["src"], batch["tgt_in"], batch["src_padding_mask"])
    keep = batch["tgt_out"] != 0
    expected = torch.nn.functional.cross_entropy(logits[keep], batch["tgt_out"][keep], label_smoothing=0.1)
    torch.testing.assert_close(model._loss(logits, batch["tgt_out"]), expected)
    # Three more padded target positions change nothing.
    pad = torch.zeros(batch["tgt_in"].shape[0], 3, dtype=torch.long)
    longer = model(batch["src"], torch.cat([batch["tgt_in"], pad], 1), batch["src_padding_mask"])
    torch.testing.assert_close(model._loss(longer, torch.cat([batch["tgt_out"], pad], 1)), expected)


def test_inverse_square_root_schedule():
    factor = inverse_sqrt_schedule(100)
    assert factor(0) == pytest.approx(0.01) and factor(49) == pytest.approx(0.5)
    assert factor(99) == 1.0  # the peak, at the end of warm-up
    assert factor(399) == pytest.approx(0.5) and factor(1599) == pytest.approx(0.25)
    dm = SyntheticTranslationDataModule("copy", num_train=50, num_val=5, num_test=5)
    model = tiny_translation_task(dm, warmup_steps=400)
    optimizer = model.configure_optimizers()["optimizer"]
    assert optimizer.defaults["lr"] == pytest.approx(32**-0.5 * 400**-0.5)  # the paper's peak
    assert optimizer.defaults["fused"]


@pytest.mark.parametrize("kind", ["word", "char"])
def test_bleu_reads_text_as_the_tokenizer_does_and_chrf_is_sacrebleus(kind):
    """Word BLEU for a word vocabulary, character BLEU for a character one (sacrebleu's ``tokenize="char"``),
    and chrF beside it, each as sacrebleu computes it."""
    refs = ["the cat sat on the mat", "a dog ran home", "abcdefgh"]
    hyps = ["the cat sat on a mat", "a dog ran to home", "abcdefgx"]
    tokenizer = build_tokenizer(kind, refs).to_dict()
    model = Translator({"source": tokenizer, "target": tokenizer}, embed_dim=TINY_DIM, num_heads=2,
                       num_encoder_layers=1, num_decoder_layers=1)
    model.val_metrics["bleu"].update(hyps, [[r] for r in refs])
    model.val_metrics["chrf"].update(hyps, refs)
    words = sacrebleu.corpus_bleu(hyps, [refs]).score / 100
    chars = sacrebleu.corpus_bleu(hyps, [refs], tokenize="char").score / 100
    assert abs(words - chars) > 0.1  # the two readings tell apart
    expected = chars if kind == "char" else words
    assert model.val_metrics["bleu"].compute().item() == pytest.approx(expected, abs=1e-5)
    chrf = sacrebleu.corpus_chrf(hyps, [refs]).score / 100  # chrF, not chrF++ (word_order 0)
    assert model.val_metrics["chrf"].compute().item() == pytest.approx(chrf, abs=1e-5)


def shifted_words(path: Path, n: int = 400) -> None:
    """A character-level TSV task: a word of 4-7 letters from a-j, each letter moved 3 on (a -> d, h -> a).
    Every target is one "word": word 4-gram BLEU is 0 on it at any accuracy."""
    rng = random.Random(0)
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice("abcdefghij") for _ in range(rng.randint(4, 7))))
    shift = {c: "abcdefghij"[(i + 3) % 10] for i, c in enumerate("abcdefghij")}
    path.write_text("".join(f"{w}\t{''.join(shift[c] for c in w)}\n" for w in sorted(words)), encoding="utf-8")


def test_the_tsv_recipe_on_a_char_task_keeps_a_trained_best_and_its_bleu_rises(tmp_path):
    """configs/translate_tsv.yaml with the character tokenizer, tiny: its monitor moves as the model learns, so
    `best` is a trained checkpoint (word BLEU, 0 throughout, kept epoch 0's), and BLEU read by characters rises
    with exact match. The best checkpoint's decodings, scored by sacrebleu, give the figures logged for it."""
    corpus = tmp_path / "shift.tsv"
    shifted_words(corpus)
    run = cli(["fit", *quiet_run(tmp_path, str(CONFIGS / "translate_tsv.yaml")), "--trainer.accelerator=cpu",
               f"--data.init_args.train={corpus}", "--data.init_args.tokenizer=char", "--data.init_args.batch_size=16",
               "--data.init_args.val_fraction=0.15", "--trainer.max_epochs=10", *TINY_MODEL,
               "--model.init_args.drop_rate=0.0", "--model.init_args.lr=0.005", "--model.init_args.warmup_steps=30"])
    rows = csv.DictReader((Path(run.trainer.logger.log_dir) / "metrics.csv").open())
    epochs = {int(r["epoch"]): {k: float(v) for k, v in r.items() if k.startswith("val_") and v}
              for r in rows if r.get("val_exact_match")}
    assert sorted(epochs) == list(range(10))
    exact, bleu = ([epochs[e][name] for e in range(10)] for name in ("val_exact_match", "val_bleu"))

    best = Path(run.best_checkpoint.best_model_path)
    epoch = int(re.search(r"epoch=(\d+)", best.name).group(1))
    assert epoch > 0 and exact[epoch] > exact[0] + 0.2  # a trained model, not the first epoch's
    assert exact[0] < 0.05 and max(exact) > 0.3 and bleu[0] < 0.1 and bleu[exact.index(max(exact))] > 0.5
    assert torch.corrcoef(torch.tensor([bleu, exact]))[0, 1] > 0.8  # BLEU on characters rises with exact match
    chrf = [epochs[e]["val_chrf"] for e in range(10)]
    assert run.best_checkpoint.monitor == "val_chrf" and epoch == chrf.index(max(chrf)) and chrf[epoch] > chrf[0] + 0.3

    sources, refs = zip(*run.datamodule.pairs["val"])
    hyps = load_task(best, Translator).translate(list(sources))
    assert epochs[epoch]["val_exact_match"] == pytest.approx(sum(map(str.__eq__, hyps, refs)) / len(refs))
    assert epochs[epoch]["val_bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(hyps, [list(refs)], tokenize="char").score / 100, abs=1e-4)
    assert epochs[epoch]["val_chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [list(refs)]).score / 100, abs=1e-4)
    assert sacrebleu.corpus_bleu(hyps, [list(refs)]).score == 0.0  # what the words' BLEU said of the same outputs


@pytest.mark.parametrize("schedule", ["cosine", "inverse_sqrt"])
def test_a_resumed_run_trains_on_this_runs_schedule(tmp_path, schedule):
    """2 epochs, then resumed for 4 from the checkpoint: every step after the resume has the lr an uninterrupted
    4-epoch run has at that step. The cosine's length is the run's, so the lr of the step after the resume must come
    from the new plan: torch's LambdaLR kept the optimiser's saved lr (the 2-epoch cosine's last, near 0) for it.
    (The inverse square root does not depend on the run's length: both schedulers resume it alike.)"""
    from lightning.pytorch import Callback, Trainer

    lrs: dict[str, dict[int, float]] = {"straight": {}, "first": {}, "resumed": {}}

    class Record(Callback):
        def __init__(self, name: str) -> None:
            self.name = name

        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            lrs[self.name][trainer.global_step] = trainer.optimizers[0].param_groups[0]["lr"]

    def fit(name: str, epochs: int, ckpt_path=None) -> Trainer:
        dm = SyntheticTranslationDataModule("reverse", num_train=64, num_val=8, num_test=8, batch_size=16)
        trainer = quick_trainer(tmp_path, max_epochs=epochs, limit_train_batches=3, limit_val_batches=0,
                                callbacks=[Record(name)])
        trainer.fit(tiny_translation_task(dm, lr=0.01, warmup_steps=2, lr_schedule=schedule), dm, ckpt_path=ckpt_path)
        return trainer

    fit("straight", 4)
    fit("first", 2).save_checkpoint(tmp_path / "two.ckpt")
    fit("resumed", 4, ckpt_path=tmp_path / "two.ckpt")
    assert sorted(lrs["resumed"]) == list(range(6, 12))
    for step, lr in lrs["resumed"].items():
        assert lr == pytest.approx(lrs["straight"][step], rel=1e-12), step


@pytest.mark.slow
def test_fit_test_and_translate_from_the_checkpoint_alone(tmp_path, capsys, caplog):
    data = [f"--data.init_args.{k}={v}" for k, v in dict(
        task="reverse", num_train=4000, num_val=64, num_test=128, min_len=2, max_len=4, num_symbols=6,
        batch_size=32,
    ).items()]
    common = ["--config", str(CONFIGS / "translate_reverse.yaml"), *data, *TINY_MODEL,
              "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false"]
    main(["fit", *common, "--model.init_args.lr", "0.01", "--model.init_args.warmup_steps", "30",
          "--trainer.max_steps", "500", "--trainer.val_check_interval", "250", "--test_after_fit", "false",
          "--checkpoint.dirpath", str(tmp_path / "ckpt")])
    best = next((tmp_path / "ckpt").glob("best*.ckpt"))
    capsys.readouterr()

    main(["test", *common, "--ckpt_path", str(best)])
    assert "test_exact_match" in capsys.readouterr().out

    # The checkpoint alone (no config, no data) rebuilds the tokenizers and the model.
    translator = load_task(best, Translator)
    dm = SyntheticTranslationDataModule("reverse", num_train=4000, num_val=64, num_test=128, min_len=2,
                                        max_len=4, num_symbols=6)
    sources, refs = zip(*dm.pairs["test"])
    assert all(r.split() == s.split()[::-1] for s, r in zip(sources, refs))
    hyps = translator.translate(list(sources))
    exact = sum(h == r for h, r in zip(hyps, refs)) / len(refs)
    assert exact > 0.8  # a real outcome: reversing 2-4 symbols is learnt in 500 steps

    # `vit test` computed the same exact match and SacreBLEU on these decodings.
    trainer_metrics = Translator.load_from_checkpoint(best)
    from lightning.pytorch import Trainer

    dm.setup("test")
    results = Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False).test(
        trainer_metrics, datamodule=dm, verbose=False)[0]
    assert results["test_exact_match"] == pytest.approx(exact, abs=1e-6)
    bleu = sacrebleu.corpus_bleu(hyps, [list(refs)]).score / 100
    assert results["test_bleu"] == pytest.approx(bleu, abs=1e-4)
    assert 0.8 < results["test_token_acc"] <= 1.0

    capsys.readouterr()
    main(["translate", "--ckpt", str(best), *sources[:20]])
    printed = capsys.readouterr().out.splitlines()
    assert printed == hyps[:20]
    # what `vit translate` prints is the reversed input, judged against the reversal itself
    assert sum(p.split() == s.split()[::-1] for p, s in zip(printed, sources)) >= 16
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(sources[:5]) + "\n\n", encoding="utf-8")
    main(["translate", "--ckpt", str(best), "--file", str(lines), "--beam_size", "3"])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 6 and out[5] == ""  # one line out per line in, empty stays empty
    assert out[:5] == translator.translate(list(sources[:5]), beam_size=3)

    # A file as editors and users write it: a byte-order mark first, a U+2028 (a line separator to str.splitlines,
    # text to a file's reader) inside a line, and a line longer than the model's positions, which must not cost
    # the other lines their translation.
    limit = translator.model.src_embed.max_positions
    long_line = " ".join([sources[0].split()[0]] * (limit + 88))
    lines.write_bytes(codecs.BOM_UTF8 + "\n".join([sources[0], f"{sources[1]}\u2028{sources[2]}", long_line,
                                                    sources[3]]).encode())
    with caplog.at_level(logging.WARNING, logger="vit.tasks.translate"):
        main(["translate", "--ckpt", str(best), "--file", str(lines)])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and out[0] == hyps[0] and out[3] == hyps[3]
    assert f"sentence 3 has {limit + 88} tokens, over the model's {limit} positions" in caplog.text
    lines.write_bytes(b"Go.\ncaf\xe9\n")  # latin-1, not UTF-8
    for argv, words in [(["--file", str(lines)], r"lines\.txt line 2: not valid UTF-8.*iconv"),
                        (["--batch_size", "0", "a"], r"--batch_size must be 1 or more")]:
        with pytest.raises((ValueError, SystemExit)) as err:
            run(["translate", "--ckpt", str(best), *argv])
        said = capsys.readouterr().err if err.type is SystemExit else str(err.value)  # argparse prints its own
        assert re.search(words, said), (argv, said)


def test_tsv_config_runs_on_an_anki_export(tmp_path):
    pairs = [("Go.", "Va !"), ("Hi.", "Salut !"), ("Run!", "Cours !"), ("Who?", "Qui ?"),
             ("Wow!", "Ça alors !"), ("I see.", "Je comprends."), ("I try.", "J'essaye."),
             ("We won.", "Nous avons gagné.")] * 8
    lines = [f"{en}\t{fr}\tCC-BY 2.0 (France) Attribution: tatoeba.org" for en, fr in pairs]
    corpus = tmp_path / "fra.txt"
    corpus.write_text("\n".join([*lines, "a line without a tab"]) + "\n", encoding="utf-8")
    main(["fit", "--config", str(CONFIGS / "translate_tsv.yaml"), "--data.init_args.train", str(corpus),
          "--data.init_args.bpe_vocab_size", "120", *TINY_MODEL, "--trainer.fast_dev_run", "2",
          "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false"])
    dm = TranslationDataModule(str(corpus), tokenizer="bpe", bpe_vocab_size=120)
    _ = dm.pairs
    assert [n for n, _ in dm.malformed["train"]] == [len(lines) + 1]  # reported by line number


def test_a_translation_config_without_a_monitor_keeps_the_best_by_chrf(tmp_path):
    """`vit fit`'s default monitor is val_acc, which a Translator never logs: it is val_chrf for one."""
    import yaml

    config = yaml.safe_load((CONFIGS / "translate_tsv.yaml").read_text())
    del config["checkpoint"]
    (tmp_path / "no_monitor.yaml").write_text(yaml.safe_dump(config))
    corpus = tmp_path / "shift.tsv"
    shifted_words(corpus, n=40)
    run = cli(["fit", *quiet_run(tmp_path, str(tmp_path / "no_monitor.yaml")), "--trainer.accelerator=cpu",
               f"--data.init_args.train={corpus}", "--data.init_args.tokenizer=char", "--trainer.max_epochs=1",
               *TINY_MODEL])
    assert run.best_checkpoint.monitor == "val_chrf" and run.best_checkpoint.mode == "max"
    assert Path(run.best_checkpoint.best_model_path).name == "best-epoch=0-step=1.ckpt"


@pytest.mark.processes
@pytest.mark.slow
def test_ddp_on_two_cpu_processes_splits_the_sentences_between_ranks(tmp_path):
    """The length-bucketing batch sampler under DDP: each rank trains on its own half, and reports once."""
    import subprocess
    import sys

    from tests.conftest import subprocess_env

    cmd = [sys.executable, "-m", "vit", "fit", "--config", str(CONFIGS / "translate_reverse.yaml"),
           "--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.max_epochs=1",
           "--trainer.enable_progress_bar=false", "--trainer.logger=false", "--checkpoint.dirpath=ckpt",
           "--data.init_args.num_train=400", "--data.init_args.num_val=64", "--data.init_args.num_test=64",
           f"--model.init_args.embed_dim={TINY_DIM}", "--trainer.callbacks+=tests.dummies.RecordSources"]
    port = free_port()
    env = subprocess_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = [(tmp_path / f"sources.{rank}").read_text().splitlines() for rank in (0, 1)]
    assert len(seen[0]) == len(seen[1]) == 200 and len(set(seen[0]) | set(seen[1])) == 400
    assert done.stdout.count("test exact match of") == 1  # printed by rank 0 only
