"""The error report of a test run: the most confident mistakes, their rollout from the model under test, and the
per-class accuracy chart."""

from __future__ import annotations

import torch

from tests.conftest import short_digits_run
from vit.commands import main
from vit.deploy import load_classifier
from vit.tasks import mistakes
from vit.tasks.mistakes import ConfidentMistakes


def test_confident_mistakes_keeps_the_most_confident_wrong_predictions_across_batches():
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(6, 1, 4, 4, generator=g), torch.randn(6, 3, generator=g) * 3,
                torch.randint(0, 3, (6,), generator=g)) for _ in range(3)]
    kept = ConfidentMistakes(4)
    for images, logits, labels in batches:
        kept.update(images, logits, labels)
    # Independently: every mistake of every batch, sorted by its softmax top probability.
    every = []
    for images, logits, labels in batches:
        for x, z, y in zip(images, logits, labels):
            p = torch.softmax(z, 0)
            if int(p.argmax()) != int(y):
                every.append((float(p.max()), int(y), int(p.argmax()), x))
    every.sort(key=lambda m: -m[0])
    assert len(every) > 4
    assert kept.confidence.tolist() == [m[0] for m in every[:4]]
    assert kept.true.tolist() == [m[1] for m in every[:4]] and kept.predicted.tolist() == [m[2] for m in every[:4]]
    assert all(torch.equal(a, m[3]) for a, m in zip(kept.images, every[:4]))
    kept.reset()
    assert len(kept) == 0


def test_vit_test_writes_the_error_grid_from_the_checkpoints_own_model(fitted, monkeypatch, tmp_path):
    best = sorted((fitted / "ckpt").glob("best-*.ckpt"))[0]
    assert (fitted / "logs" / "digits" / "version_0" / "errors.png").is_file()  # from the test after `vit fit`
    seen = {}
    original = mistakes.collect_attention

    def spy(model, images, *args, **kwargs):
        seen["weights"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        seen["images"] = images.detach().cpu().clone()
        return original(model, images, *args, **kwargs)

    monkeypatch.setattr(mistakes, "collect_attention", spy)
    recorded = {}
    save = mistakes.save_error_report

    def keep(model, found, *args):
        recorded.update(predicted=found.predicted.clone(), confidence=found.confidence.clone())
        return save(model, found, *args)

    monkeypatch.setattr("vit.tasks.mistakes.save_error_report", keep)
    # its own folder: the fit is shared by the test processes, and another's `vit test` may write a version beside it
    main(["test", *short_digits_run(tmp_path), "--ckpt_path", str(best)])
    run = tmp_path / "logs" / "digits" / "version_0"
    for name in ("errors.png", "class_accuracy.png", "confusion_matrix.png"):
        assert (run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The overlays came from the checkpoint's weights, and the images shown are mistakes of that model.
    checkpoint_model = load_classifier(best).model
    reference = checkpoint_model.state_dict()
    assert seen["weights"].keys() == reference.keys()
    assert all(torch.equal(seen["weights"][k].cpu(), reference[k]) for k in reference)
    with torch.no_grad():
        probs = checkpoint_model(seen["images"]).softmax(-1)
    assert torch.equal(probs.argmax(-1), recorded["predicted"])
    torch.testing.assert_close(probs.max(-1).values, recorded["confidence"], atol=1e-5, rtol=0)


def test_tensorboard_gets_the_figures_as_images(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.helpers import quick_trainer, tiny_classifier
    from tests.tasks.test_classify import loader

    model = tiny_classifier()
    quick_trainer(tmp_path, logger=TensorBoardLogger(tmp_path, name="tb")).test(model, loader(n=40), verbose=False)
    run = tmp_path / "tb" / "version_0"
    events = EventAccumulator(str(run)).Reload()
    assert {"test/errors", "test/class_accuracy"} <= set(events.Tags()["images"])
    assert (run / "errors.png").is_file() and (run / "class_accuracy.png").is_file()
