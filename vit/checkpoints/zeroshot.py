"""A zero-shot classifier as an ordinary `vit` checkpoint: the image tower of a CLIP/SigLIP model with a head whose
rows are the class names' text embeddings.

    classes x templates -> tokenizer -> encode_text, normalised          (C*T, E)
                        -> mean over the templates, normalised again     (C, E)   (OpenCLIP's recipe)
    head = exp(logit_scale) * rows (+ SigLIP's logit_bias), over the image tower's normalised embedding

`vit predict`, `serve`, `export`, `attention`, `probe` and `calibrate` read the result as any `vit fit` checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vit.checkpoints.clip import LoadedCLIP
from vit.checkpoints.meta import classifier_checkpoint, classify_meta
from vit.data.clip_text import TextTokenizer, check_template
from vit.errors import UserValueError
from vit.nn.clip import CLIP
from vit.nn.vision import VisionTransformer


def class_names(names: Sequence[str]) -> list[str]:
    """The class list, stripped; empty or repeated names are errors that say how to give them."""
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise UserValueError('the class list is empty: give --classes "oak,maple,birch" or --classes_file FILE '
                             "(one name a line)")
    if len(names) == 1:  # a softmax over one class says 1.0 to every image: nothing is classified
        raise UserValueError(f"one class, {names[0]!r}: a zero-shot classifier chooses among at least two; add the "
                             f'others it should tell it from (--classes "{names[0]},other") or a --classes_file')
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserValueError(f"class names given twice: {', '.join(repeated)}")
    return names


@torch.no_grad()
def class_embeddings(model: CLIP, tokenizer: TextTokenizer, classes: Sequence[str], templates: Sequence[str],
                     batch_size: int = 256) -> Tensor:
    """One normalised text embedding per class (C, E): its templates' normalised embeddings averaged."""
    texts = [t.replace("{}", c) for c in classes for t in templates]
    device = next(model.parameters()).device
    rows = [model.encode_text(tokenizer(texts[i:i + batch_size]).to(device), normalize=True)
            for i in range(0, len(texts), batch_size)]
    per_class = torch.cat(rows).reshape(len(classes), len(templates), -1).mean(dim=1)  # (C, E)
    return F.normalize(per_class, dim=-1)


def zeroshot_classifier(model: CLIP, tokenizer: TextTokenizer, classes: Sequence[str], templates: Sequence[str],
                        batch_size: int = 256) -> VisionTransformer:
    """The image tower as a classifier of ``classes``, its head the classes' text embeddings averaged over the
    ``templates`` (`class_embeddings`, `CLIP.classifier`): the one builder of a zero-shot head, for `vit zeroshot`
    and for the contrastive task's ``head_init: zeroshot``."""
    for template in templates:
        check_template(template, "a zero-shot template")
    return model.classifier(class_embeddings(model, tokenizer, classes, templates, batch_size))


def zero_shot_checkpoint(loaded: LoadedCLIP, classes: Sequence[str], templates: Sequence[str],
                         batch_size: int = 256) -> dict[str, Any]:
    """A `vit fit`-format classify checkpoint of ``loaded``'s image tower with the classes' text head."""
    classes = class_names(classes)
    model = zeroshot_classifier(loaded.model, loaded.tokenizer, classes, templates, batch_size)
    meta = classify_meta(f"{loaded.model.family}_zeroshot", model.config.to_dict(), classes,
                         loaded.preprocessing.to_dict())
    about = {"source": loaded.source, "family": loaded.model.family, "templates": list(templates)}
    return classifier_checkpoint(meta, model.state_dict(), zeroshot=about)
