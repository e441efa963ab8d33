"""Multi-label training's parts against independent computations: thresholds (sklearn's precision-recall curve),
metrics (sklearn), mixing (by hand), every image counted once under a DDP sampler's padding, and the head switch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, f1_score, precision_recall_curve
from torch.utils.data import DistributedSampler

from tests.helpers import TINY_DIM
from vit.errors import UserValueError
from vit.tasks.heads import MultiLabelHead, SingleLabelHead, data_label_kind, head_for
from vit.tasks.multilabel import LabelScores, MultiLabelMixup, choose_thresholds, label_metrics, mix_targets


def sklearn_cut(scores: np.ndarray, positive: np.ndarray) -> float:
    """The F1-optimal cut by sklearn: the lowest score at the best F1, and midway to the next lower score."""
    precision, recall, cuts = precision_recall_curve(positive, scores)
    f1 = 2 * precision[:-1] * recall[:-1] / np.maximum(precision[:-1] + recall[:-1], 1e-12)
    best = cuts[np.argmax(f1)]  # cuts ascend: argmax takes the lowest cut among equal F1s
    lower = scores[scores < best]
    return (best + (lower.max() if len(lower) else 0.0)) / 2


def random_case(n: int = 300, c: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    targets = (torch.rand(n, c, generator=g) < 0.3).float()
    probs = (targets * 0.3 + torch.rand(n, c, generator=g) * 0.7).clamp(0, 1)
    targets[torch.rand(n, c, generator=g) < 0.1] = -1.0
    return probs, targets


def test_thresholds_are_sklearns_f1_optimal_cut_and_rare_classes_keep_the_default():
    probs, targets = random_case()
    targets[:, 4] = torch.where(targets[:, 4] == 1, 0.0, targets[:, 4])
    targets[:3, 4] = 1.0  # 3 positives: under min_positives=5
    cuts = choose_thresholds(probs, targets, min_positives=5)
    for c in range(4):
        known = (targets[:, c] >= 0).numpy()
        want = sklearn_cut(probs[known, c].numpy(), targets[known, c].numpy() == 1)
        assert cuts[c].item() == pytest.approx(want, abs=1e-6)
    assert cuts[4].item() == 0.5
    assert choose_thresholds(probs, targets, min_positives=3)[4].item() != 0.5  # the other side of the floor


def test_a_tie_in_f1_takes_the_largest_count_of_positives():
    """Labels 1,1,1,1,0,0,0,1,1 on scores descending, 6 positives: F1 = 2TP / (k + 6) is 8/10 = 0.8 at k = 4 and
    12/15 = 0.8 at k = 9 (every image positive). The largest k's cut lies midway between the lowest score and 0."""
    scores = torch.linspace(0.95, 0.05, 9)
    labels = torch.tensor([1, 1, 1, 1, 0, 0, 0, 1, 1], dtype=torch.float32)
    cut = choose_thresholds(scores[:, None], labels[:, None], min_positives=5)[0].item()
    assert cut == pytest.approx(0.05 / 2)  # k = 4 would cut at (0.6125 + 0.5) / 2 = 0.55625


def test_the_checkpoints_thresholds_are_recomputed_from_its_val_split(quadrant_run):
    """Independently: the saved network's sigmoid on the val images (no Lightning), and sklearn's cut."""
    from tests.dummies import QuadrantLabels
    from vit.deploy.classifier import read_classifier

    ckpt = quadrant_run / "model.ckpt"
    saved = torch.load(ckpt, weights_only=False)["vit"]["thresholds"]
    images, targets = QuadrantLabels().sets["val"].tensors
    with torch.no_grad():
        probs = torch.sigmoid(read_classifier(ckpt).model(images)).numpy()
    for c in range(4):
        positive = targets[:, c].numpy() == 1
        want = sklearn_cut(probs[:, c], positive) if positive.sum() >= 5 else 0.5
        assert saved[c] == pytest.approx(want, abs=1e-5)


def test_metrics_match_sklearn_with_unknown_labels_left_out():
    probs, targets = random_case(seed=1)
    cuts = torch.tensor([0.3, 0.4, 0.5, 0.6, 0.7])
    got = label_metrics(probs, targets, cuts, test=True)
    p, t, decided = probs.numpy(), targets.numpy(), (probs >= cuts).numpy()
    known = t >= 0
    aps = [average_precision_score(t[known[:, c], c], p[known[:, c], c]) for c in range(5)]
    assert got["map"].item() == pytest.approx(np.mean(aps), abs=1e-5)
    assert got["f1_micro"].item() == pytest.approx(f1_score(t[known], decided[known]), abs=1e-5)
    per_class = [f1_score(t[known[:, c], c], decided[known[:, c], c]) for c in range(5)]
    assert got["f1_macro"].item() == pytest.approx(np.mean(per_class), abs=1e-5)
    assert got["hamming_loss"].item() == pytest.approx((t[known] != decided[known]).mean(), abs=1e-5)
    exact = np.mean([(t[i][known[i]] == decided[i][known[i]]).all() for i in range(len(t))])
    assert got["exact_match"].item() == pytest.approx(exact, abs=1e-5)


def test_mixed_targets_follow_the_images_and_unknown_stays_unknown():
    targets = torch.tensor([[1.0, 0.0, -1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    mixed = mix_targets(targets, 0.7)
    assert torch.allclose(mixed[0], torch.tensor([0.7 + 0.3, 0.3, -1.0]))
    assert torch.allclose(mixed[1], torch.tensor([0.0, 0.0, 1.0]))  # the middle image mixes with itself
    assert torch.allclose(mixed[2], torch.tensor([1.0, 0.7, -1.0]))  # its mirror's third label is unknown
    torch.manual_seed(0)
    images = torch.rand(4, 1, 8, 8)
    out, soft = MultiLabelMixup(mixup_alpha=1.0)(images, targets[[0, 1, 2, 1]])
    lam = ((out[0] - images[3]) / (images[0] - images[3])).mean().item()  # the images tell the mixing weight
    assert soft[0, 0].item() == pytest.approx(lam, abs=1e-5)  # image 0's label, not its mirror's
    out, soft = MultiLabelMixup(cutmix_alpha=1.0)(images, targets[[0, 1, 2, 1]])
    kept = (out[0] == images[0]).float().mean().item()  # cutmix: the share of image 0 left in place
    assert soft[0, 0].item() == pytest.approx(kept, abs=1e-6)
    assert MultiLabelMixup(mixup_alpha=1.0, prob=0.0)(images, targets[[0, 1, 2, 1]])[0] is images


@pytest.mark.parametrize("size", [7, 8])
def test_every_image_counts_once_under_a_distributed_samplers_padding(size):
    """Two ranks' shares, concatenated in rank order as torchmetrics gathers them: the padding is dropped."""
    probs, targets = torch.rand(size, 3), torch.arange(size, dtype=torch.float32)[:, None].expand(size, 3)
    dataset = list(range(size))
    gathered = LabelScores()
    for rank in (0, 1):
        share = list(DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=False))
        gathered.update(probs[share], targets[share])
    gathered.set_sampler(DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=False))
    got_probs, got_targets = gathered.compute()
    assert torch.equal(got_targets, targets) and torch.equal(got_probs, probs)
    gathered.set_sampler(None)  # no sampler to undo: as gathered (8 rows for 7 images: one counted twice)
    assert len(gathered.compute()[0]) == 2 * -(-size // 2)


def test_the_head_follows_the_data():
    assert isinstance(head_for(SingleLabelHead(), "multi"), MultiLabelHead)
    assert head_for(SingleLabelHead(), "single") == SingleLabelHead()
    assert head_for(MultiLabelHead(loss="asl"), None) == MultiLabelHead(loss="asl")
    assert head_for(MultiLabelHead(loss="asl"), "multi") == MultiLabelHead(loss="asl")
    with pytest.raises(UserValueError, match="MultiLabelHead"):
        head_for(SingleLabelHead(mixup_alpha=0.8), "multi")  # settings of a single-label head are not dropped silently
    with pytest.raises(UserValueError, match="one label per image"):
        head_for(MultiLabelHead(), "single")
    with pytest.raises(UserValueError, match="single, multi"):
        head_for(SingleLabelHead(), "several")
    # the word `vit fit` links from a DataModule's multi_label
    assert [data_label_kind(x) for x in (True, False, None)] == ["multi", "single", None]
    with pytest.raises(UserValueError, match="'bce' or 'asl'"):
        MultiLabelHead(loss="focal")


def test_positive_weights_are_negatives_over_positives_capped():
    counts = torch.tensor([[10.0, 1.0, 50.0], [100.0, 1000.0, 100.0]])  # positives, known labels
    weights = MultiLabelHead(class_weighting=True, max_pos_weight=100).class_weights(counts, ["a", "b", "c"])
    assert weights.tolist() == [9.0, 100.0, 1.0]
    assert MultiLabelHead().class_weights(counts, ["a", "b", "c"]) is None
    with pytest.raises(UserValueError, match="'b'"):
        MultiLabelHead(class_weighting=True).class_weights(torch.tensor([[1.0, 0.0], [5.0, 5.0]]), ["a", "b"])


@pytest.mark.processes
@pytest.mark.slow
def test_vit_test_on_two_ddp_processes_reports_the_mAP_of_one(quadrant_run, tmp_path):
    """`vit test` of one multi-label checkpoint, on one process and on two (gloo on CPU): the same test macro mAP,
    the one sklearn gives on the 67 test images. 67 is odd: the DistributedSampler repeats an image to even the
    shards, and counting it twice would change the figure (checked), so the padding must be dropped."""
    import re
    import subprocess
    import sys

    from sklearn.metrics import average_precision_score

    from tests.conftest import free_port, subprocess_env
    from tests.dummies import QuadrantLabels
    from vit.cli.main import cli
    from vit.deploy.classifier import read_classifier

    images, targets = QuadrantLabels().sets["test"].tensors
    with torch.no_grad():
        probs = torch.sigmoid(read_classifier(quadrant_run / "model.ckpt").model(images)).numpy()
    expected = average_precision_score(targets.numpy(), probs, average="macro")
    padded = average_precision_score(np.r_[targets.numpy(), targets.numpy()[:1]], np.r_[probs, probs[:1]])
    assert len(images) % 2 == 1 and abs(padded - expected) > 1e-5

    def command(devices: int) -> list[str]:
        return ["test", "--model=vit.tasks.ImageClassifier", "--model.model=vit_digits_patch2_8",
                f"--model.model_kwargs={{depth: 2, embed_dim: {TINY_DIM}, num_heads: 2}}",
                "--data=tests.dummies.QuadrantLabels",
                f"--ckpt_path={quadrant_run / 'model.ckpt'}", "--trainer.accelerator=cpu",
                f"--trainer.devices={devices}", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
                f"--trainer.strategy={'ddp' if devices > 1 else 'auto'}", f"--trainer.default_root_dir={tmp_path}"]

    one = float(cli(command(1)).trainer.callback_metrics["test_map"])  # in this process: one start-up less
    env = subprocess_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    done = subprocess.run([sys.executable, "-m", "vit", *command(2)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    two = float(re.search(r"test_map\s*│\s*([\d.]+)", done.stdout).group(1))
    assert one == pytest.approx(expected, abs=1e-5)
    assert two == pytest.approx(expected, abs=1e-5)


def test_positive_weights_count_the_known_labels_of_the_training_split():
    """Unknown labels are neither positives nor negatives in the counts the weights come from."""
    from tests.dummies import QuadrantLabels

    data = QuadrantLabels(unknown=0.25)
    targets = data.sets["train"].tensors[1]
    counts = MultiLabelHead().training_counts(data)
    assert counts.tolist() == [[float((targets[:, c] == 1).sum()) for c in range(4)],
                               [float((targets[:, c] != -1).sum()) for c in range(4)]]
    assert (counts[1] < len(targets)).all()


@pytest.mark.parametrize("multi", [True, False])
def test_a_checkpoint_written_before_label_kind_loads_as_the_kind_it_says(quadrant_run, tmp_path, multi):
    """Checkpoints from before ``label_kind`` hold ``multi_label`` beside the head as given (the default single-label
    one, which the flag turned into the multi-label head); Lightning would drop the unknown argument silently."""
    from vit.tasks import ImageClassifier, load_task

    checkpoint = torch.load(quadrant_run / "model.ckpt", weights_only=False)
    hparams = checkpoint["hyper_parameters"]
    assert hparams.pop("label_kind") == "multi" and hparams["head"]["class_path"].endswith("SingleLabelHead")
    checkpoint["hyper_parameters"] = {**hparams, "multi_label": multi}
    torch.save(checkpoint, tmp_path / "old.ckpt")
    task = load_task(tmp_path / "old.ckpt", ImageClassifier)
    assert isinstance(task.head, MultiLabelHead if multi else SingleLabelHead)
    if multi:  # and the thresholds chosen on val come back with it
        assert task.evaluation.thresholds.tolist() == pytest.approx(checkpoint["vit"]["thresholds"])


def test_the_label_error_gallery_keeps_fp_and_fn_in_their_columns_when_a_class_lacks_one(tmp_path):
    """Class 0 has only a false positive, class 1 both, class 2 only a false negative, class 3 neither: the rows
    shifted (class 1's FN fell under an FP). Each class shown now fills an FP then an FN panel, "none" where it has
    no such image."""
    from vit.tasks.multilabel import LabelMistakes, save_label_report

    # image i is filled with i, so each panel can be traced to its image
    images = torch.arange(4.0)[:, None, None, None].expand(4, 3, 4, 4).clone()
    probs = torch.tensor([[0.9, 0.8, 0.9, 0.1], [0.1, 0.2, 0.3, 0.1], [0.2, 0.1, 0.9, 0.2], [0.7, 0.1, 0.2, 0.8]])
    targets = torch.tensor([[0, 0, 1, 0], [0, 1, 1, 0], [0, 0, 1, 0], [1, 0, 0, 1]])  # each class: a 1 and a 0
    # at 0.5: class 0: FP image 0; class 1: FP image 0, FN image 1; class 2: FN image 1; class 3: nothing
    mistakes = LabelMistakes(4)
    mistakes.update(images, probs, targets, torch.full((4,), 0.5))
    kinds = [(kind, c, None if image is None else int(image[0, 0, 0])) for kind, c, image, _, _ in mistakes.items()]
    assert kinds == [("FP", 0, 0), ("FN", 0, None), ("FP", 1, 0), ("FN", 1, 1), ("FP", 2, None), ("FN", 2, 1)]
    figures = save_label_report(probs, targets.float(), torch.full((4,), 0.5), mistakes, ["a", "b", "c", "d"],
                                [0.0] * 3, [1.0] * 3, tmp_path)
    titles = [ax.get_title(loc="left").split("\n")[0] for ax in figures["label_errors"].axes]
    assert titles == ["FP a 0.90", "FN a: none", "FP b 0.80", "FN b 0.20", "FP c: none", "FN c 0.30"]
    assert [len(ax.images) for ax in figures["label_errors"].axes] == [1, 0, 1, 1, 0, 1]
