"""The model card of `vit export --format hub`: a Hugging Face ``README.md`` written from what the run knows.

    checkpoint ──► classes, input preparation, base weights (``pretrained``), epoch and step
    run folder ──► config.yaml (the recipe), metrics.csv (val and test accuracy), confusion_matrix.png
    base weights ─► license and ``base_model``, from timm's pretrained_cfg of the tag (never guessed)

The run folder is the `vit fit` logger's ``version_N`` folder whose config.yaml wrote this checkpoint
(`find_run`). A number the run does not hold (test accuracy of a checkpoint other than the tested best, a
license for weights trained from scratch) is left out and named in the card as the user's to fill in.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vit.checkpoints.io import best_checkpoint_state
from vit.deploy.classifier import Classifier

# The test metrics the card reports (when the run has them), with their Hub metric types.
TEST_KEYS = {"test_acc": "accuracy", "test_acc_top5": "top_5_accuracy", "test_acc_balanced": "balanced_accuracy"}
FILL_IN = "*(not known to the run: yours to fill in)*"
# An absolute POSIX path (not a URL's): after a space, quote, colon-space or line start; one path, to a space or quote
ABSOLUTE = re.compile(r"(?<![\w.:/~-])/(?:[^\s'\"/]+/)+[^\s'\",\]}]*")


@dataclass
class RunFacts:
    """What the card may say about a checkpoint: read from the checkpoint and its run folder, nothing else."""

    checkpoint: Path
    epoch: int | None = None
    step: int | None = None
    base: str | None = None  # model.init_args.pretrained: a timm tag, hf-hub:owner/name, a file, or None
    run: Path | None = None
    config: str | None = None  # the run's config.yaml, as written
    data: str | None = None  # the DataModule's class_path
    dataset: dict[str, Any] | None = None  # Hugging Face data's name, revision and fingerprint (vit.data.HFDataset)
    val_acc: float | None = None
    test: dict[str, float] = field(default_factory=dict)  # only when this checkpoint is the one the run tested
    tested: str | None = None  # the checkpoint the run tested, when it is another
    confusion: Path | None = None


def _dirpath(config: dict[str, Any]) -> str | None:
    return ((config or {}).get("checkpoint") or {}).get("dirpath")


def _same_folder(dirpath: str, folder: Path, run: Path) -> bool:
    """Whether a config's checkpoint.dirpath (absolute, or relative to where `vit fit` ran) names ``folder``."""
    path = Path(dirpath)
    if path.is_absolute():
        return path.resolve() == folder.resolve()
    return folder.resolve().parts[-len(path.parts):] == path.parts or (run / path).resolve() == folder.resolve()


def find_run(checkpoint: str | os.PathLike) -> Path | None:
    """The `vit fit` run folder (config.yaml, metrics.csv) that wrote ``checkpoint``, or None.

    Lightning's own layout (``version_N/checkpoints/``) or a ``checkpoint.dirpath`` named in a config.yaml up to
    three folders below the checkpoint folder's parent; of several runs sharing that folder, the one that was
    still logging when the file was written (its metrics.csv changed last at or after the checkpoint's time)."""
    path = Path(checkpoint)
    folder, top = path.parent, path.parent.parent
    if (top / "config.yaml").is_file() and not _dirpath(_yaml(top / "config.yaml")):
        return top
    found = []
    configs = [top / "config.yaml", *(p for depth in ("*", "*/*", "*/*/*") for p in top.glob(f"{depth}/config.yaml"))]
    for config in configs:
        dirpath = _dirpath(_yaml(config))
        metrics = config.parent / "metrics.csv"
        if (dirpath and _same_folder(dirpath, folder, config.parent) and metrics.is_file()
                and metrics.stat().st_mtime >= path.stat().st_mtime - 1):  # still logging when the file was written
            found.append((metrics.stat().st_mtime, config.parent))
    return min(found)[1] if found else None


def _yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _last(rows: list[dict[str, str]], key: str) -> float | None:
    values = [row[key] for row in rows if row.get(key)]
    return float(values[-1]) if values else None


def run_facts(checkpoint: dict[str, Any], path: str | os.PathLike, run: str | os.PathLike | None = None) -> RunFacts:
    """The card's facts of the checkpoint ``checkpoint`` read from ``path``; ``run``: its run folder (None: found
    by `find_run`)."""
    facts = RunFacts(Path(path), checkpoint.get("epoch"), checkpoint.get("global_step"),
                     (checkpoint.get("hyper_parameters") or {}).get("pretrained"))
    facts.dataset = next((v["data_source"] for v in checkpoint.values()  # (the DataModule's state, by its class)
                          if isinstance(v, dict) and isinstance(v.get("data_source"), dict)), None)
    facts.run = Path(run) if run is not None else find_run(path) if Path(path).is_file() else None
    if facts.run is None:
        return facts
    if (facts.run / "config.yaml").is_file():
        facts.config = (facts.run / "config.yaml").read_text()
        facts.data = (_yaml(facts.run / "config.yaml").get("data") or {}).get("class_path")
    rows = list(csv.DictReader((facts.run / "metrics.csv").open())) if (facts.run / "metrics.csv").is_file() else []
    seen = [r for r in rows if _int(r.get("epoch")) <= (facts.epoch or 0) and _int(r.get("step")) <= (facts.step or 0)]
    facts.val_acc = _last(seen, "val_acc")
    best = (best_checkpoint_state(checkpoint) or {}).get("best_model_path")
    if best and Path(best).name != Path(path).name:
        facts.tested = Path(best).name  # `vit fit` tests its best checkpoint, not this one
    elif best:
        facts.test = {k: v for k in TEST_KEYS if (v := _last(rows, k)) is not None}
        image = facts.run / "confusion_matrix.png"
        facts.confusion = image if image.is_file() and facts.test else None
    return facts


def _int(value: str | None) -> int:
    return int(float(value)) if value else -1


# ---- the card ------------------------------------------------------------------------------------
def base_weights(base: str | None) -> dict[str, Any]:
    """``base_model``, ``license`` (and its source) of the base weights, where the tag says: a timm tag's
    pretrained_cfg, a shared model's Hub id. A file or no base gives nothing."""
    if not base:
        return {}
    if base.startswith("hf-hub:"):
        return {"base_model": base.removeprefix("hf-hub:").partition("@")[0]}
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(base) if "." in base and os.sep not in base else None
    if cfg is None or not cfg.hf_hub_id:
        return {}
    out: dict[str, Any] = {"base_model": cfg.hf_hub_id.partition("@")[0]}
    if cfg.license:
        out["license_source"] = f"timm's pretrained_cfg of {base}"
        if cfg.license in HUB_LICENSES:
            out["license"] = cfg.license
        else:  # terms of their own (DINOv3's): the Hub's "other", named, linked to the weights' page
            out.update(license="other", license_name=cfg.license, license_link=f"https://huggingface.co/{out['base_model']}")
    return out


# Hub license identifiers the base weights in timm use; any other name is written as "other" with its name.
HUB_LICENSES = ("apache-2.0", "mit", "bsd-3-clause", "cc-by-4.0", "cc-by-nc-4.0", "cc-by-sa-4.0", "cc-by-nc-sa-4.0",
                "cc-by-nc-nd-4.0", "gemma", "llama2", "llama3", "openrail")


def card_data(classifier: Classifier, facts: RunFacts, architecture: str, name: str) -> Any:
    """The front matter as `huggingface_hub.ModelCardData`: timm's library, the task, the base weights and their
    license, and a model-index of the test metrics the run measured on this checkpoint."""
    from huggingface_hub import EvalResult, ModelCardData

    base = base_weights(facts.base)
    hf = facts.dataset or {}
    results = [EvalResult(task_type="image-classification", dataset_type=hf.get("name") or facts.data or "unknown",
                          dataset_name=hf.get("name") or (facts.data or "unknown").rsplit(".", 1)[-1],
                          dataset_split="test", dataset_revision=hf.get("revision"),
                          metric_type=TEST_KEYS[key], metric_name=key, metric_value=value)
               for key, value in facts.test.items()]
    return ModelCardData(
        library_name="timm", pipeline_tag="image-classification", tags=["image-classification", "timm", "vit"],
        base_model=base.get("base_model"), base_model_relation="finetune" if base.get("base_model") else None,
        license=base.get("license"), license_name=base.get("license_name"), license_link=base.get("license_link"),
        model_name=name if results else None, eval_results=results or None,
        datasets=[hf["name"]] if hf.get("name") else None,
    )


def _data_line(facts: RunFacts) -> str:
    """The training data as the run knew it: Hugging Face data by name, revision and fingerprint, else the class."""
    hf = facts.dataset
    if not hf:
        return f"`{facts.data or 'unknown'}`"
    return f"`{hf['name']}` (revision {hf.get('revision') or '-'}, fingerprint {hf.get('fingerprint') or '-'})"


def _results(facts: RunFacts) -> list[str]:
    at = f" (epoch {facts.epoch}, step {facts.step})" if facts.epoch is not None else ""
    if facts.run is None:
        return [f"No `vit fit` run folder was found for `{facts.checkpoint.name}` (pass `--run`), so no accuracy is "
                f"reported: {FILL_IN}"]
    lines = [f"From the run folder `{facts.run.name}` of `vit fit`:", ""]
    lines.append(f"- validation accuracy{at}: {facts.val_acc:.4f}" if facts.val_acc is not None
                 else f"- validation accuracy: not logged by the run {FILL_IN}")
    for key, value in facts.test.items():
        lines.append(f"- {key.replace('_', ' ').replace('acc', 'accuracy')}: {value:.4f}")
    if facts.tested:
        lines.append(f"- test accuracy: not measured on this checkpoint (the run tested {facts.tested}) {FILL_IN}")
    elif not facts.test:
        lines.append(f"- test accuracy: not logged by the run {FILL_IN}")
    if facts.confusion is not None:
        lines += ["", "![confusion matrix on the test split](confusion_matrix.png)"]
    return lines


def _preparation(classifier: Classifier, rgb_from_gray: bool) -> list[str]:
    h, w = classifier.img_size
    lines = [f"- input: {classifier.in_chans} channel(s), {h}x{w}; resize the short side to "
             f"{classifier.eval_short_side()} ({classifier.interpolation}), centre crop {h}x{w} "
             f"(crop_pct {classifier.crop_pct})",
             f"- normalise: mean {list(classifier.mean)}, std {list(classifier.std)}"]
    if rgb_from_gray:
        lines.append("- trained on grayscale images: this folder's patch embedding takes RGB and computes PIL's "
                     "luma (0.299 R + 0.587 G + 0.114 B) first, so RGB pipelines give the grayscale model's logits")
    return lines


def _confidence(classifier: Classifier) -> list[str]:
    """What `vit calibrate` fit, if it ran: the numbers timm's and transformers' loaders do not apply."""
    c = classifier.calibration
    if c is None:
        return ["Not calibrated: `vit calibrate --ckpt ...` fits a temperature and an \"unknown\" threshold."]
    report = (classifier.confidence.report or {}) if classifier.confidence is not None else {}
    if isinstance(c.temperature, list):  # multi-label: a T per class, the thresholds moved with them
        lines = [f"- a temperature per class, T = {[round(t, 4) for t in c.temperature]}: calibrated probabilities "
                 "are sigmoid(logit_c / T_c), cut at the thresholds sigmoid(logit(t_c) / T_c) (the same labels); "
                 "timm and transformers return the plain logits, so divide them by T yourself"]
    else:
        lines = [f"- temperature T = {c.temperature:.4f}: calibrated probabilities are softmax(logits / T); timm "
                 "and transformers return the plain logits, so divide them by T yourself"]
    lines.append("- `config.json` carries it (`calibration`), and `vit predict` on this folder applies it; T never "
                 "changes the top class")
    if c.tta == "flip":  # the one stored choice that can move the top class away from timm's and transformers'
        tta = report.get("tta", {})
        measured = (f" ({tta['flip']['top1']:.4f} of validation images right against {tta['none']['top1']:.4f})"
                    if "flip" in tta else "")
        lines.append("- test-time augmentation: `vit predict` and `vit serve` average each image's logits with its "
                     f"mirror's, which answered more validation images right{measured}; timm and transformers see "
                     "the image once, so on a near tie their top class can differ")
    if "before" in report:
        lines.append(f"- validation ECE {report['before']['ece']:.4f} before, {report['after']['ece']:.4f} after")
    if c.threshold is not None:
        lines.append(f"- \"{c.label}\": a `{c.score}` score above {c.threshold:.4g} (chosen to accept "
                     f"{100 * (c.acceptance or 0):.0f}% of validation images); only `vit predict` and `vit serve` "
                     "compute it, from this model's checkpoint or ONNX export")
    return lines


def _usage(name: str) -> list[str]:
    return [
        "```python", "import timm", f'model = timm.create_model("hf-hub:{name}", pretrained=True).eval()',
        "names = model.pretrained_cfg['label_names']", "", "from transformers import pipeline",
        f'classify = pipeline("image-classification", model="{name}")', "```", "",
        "With `vit`: `vit predict --ckpt hf-hub:" + name + " photos/`, or fine-tune further from it with "
        "`--model.init_args.pretrained hf-hub:" + name + "`.",
    ]


def local_paths_hidden(text: str) -> str:
    """``text`` with each absolute local path cut to its last two parts (``/home/me/photos/labels.csv`` ->
    ``…/photos/labels.csv``): a shared card names no one's folders. URLs and relative paths stay."""
    return ABSOLUTE.sub(lambda m: "…/" + "/".join(Path(m.group(0)).parts[-2:]), text)


def _architecture(classifier: Classifier, architecture: str, model_args: dict[str, Any] | None) -> str:
    """What the model is, in timm's words: its timm architecture, with the ``model_args`` that change it (a dim-96
    depth-4 model is not timm's ``vit_tiny_patch16_224``, only built from it)."""
    if not model_args:
        return f"`{classifier.model_name}`, as timm's `{architecture}`"
    args = ", ".join(f"{k}={v}" for k, v in model_args.items())
    return (f"`{classifier.model_name}` ({args}), which timm builds as `{architecture}` changed by config.json's "
            "`model_args`")


def model_card(classifier: Classifier, facts: RunFacts, architecture: str, name: str, *, repo_id: str | None = None,
               rgb_from_gray: bool = False, model_args: dict[str, Any] | None = None) -> str:
    """The ``README.md`` text: the front matter (`card_data`) and a body of the run's facts and the blanks;
    ``repo_id``: where it is shared (the examples say OWNER/NAME without it), else the title is the model's and
    the run's (not the output folder's name)."""
    if repo_id is None:
        name = classifier.model_name + (f" ({facts.run.parent.name})" if facts.run is not None else "")
    base = base_weights(facts.base)
    shown_base = local_paths_hidden(facts.base) if facts.base else None
    origin = (f"fine-tuned from `{shown_base}`" if facts.base else "trained from scratch (no pretrained weights)")
    license_line = (f"`{base['license_name'] if base.get('license') == 'other' else base['license']}`, "
                    f"from {base['license_source']}: the fine-tuned weights inherit the base weights' terms"
                    if base.get("license") else f"not known to the run ({origin}) {FILL_IN}; add `license:` above")
    names = ", ".join(f"`{n}`" for n in classifier.class_names)
    body = [
        f"# {name}", "",
        f"An image classifier trained with `vit`: {_architecture(classifier, architecture, model_args)}, {origin}.",
        "",
        f"## Classes ({len(classifier.class_names)})", "", names, "",
        "## Results", "", *_results(facts), "",
        "## Preprocessing", "", *_preparation(classifier, rgb_from_gray), "",
        "## Confidence", "", *_confidence(classifier), "",
        "## How to use", "", *_usage(repo_id or "OWNER/NAME"), "",
        "## Training recipe", "",
        *(["The run's own `config.yaml` (absolute local paths cut to their last two parts):", "", "```yaml",
           local_paths_hidden(facts.config.rstrip()), "```"] if facts.config
          else [f"The run's config.yaml was not found {FILL_IN}"]), "",
        "## License", "", f"License: {license_line}.", "",
        "## Intended use and limits", "", f"Intended use: {FILL_IN}", "",
        f"Out-of-scope use and known limits (data it was not trained on, classes it cannot say): {FILL_IN}", "",
        f"Training data and its license: {_data_line(facts)} {FILL_IN}", "",
    ]
    data = card_data(classifier, facts, architecture, name)
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body)
