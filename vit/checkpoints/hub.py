"""The Hugging Face hub and its cache: where the files of a timm tag or of a shared model are, on disk or online.

    timm tag (vit_small_patch16_224.augreg_in21k) ─► hub_repo ─► (timm/<name>, revision) ─┐
    shared model (hf-hub:owner/name[@revision]) ────────────────────────────────────────────┤
                                      cached_file (the cache, offline) ◄─────────────────────┘
                                      else check_reachable (seconds, not huggingface_hub's retries) ─► download

Reading the files found here is `vit.checkpoints.weights`'s (and `vit.checkpoints.clip`'s for both towers); this
module finds them and says, in one message, the three ways on when it cannot.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from vit.errors import WeightsUnavailableError
from vit.network import unreachable

# The weights file of a Hugging Face hub folder, as `vit export` writes it and timm publishes it (`timm/<name>`).
HUB_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
HF_HUB = "hf-hub:"  # a model shared on the Hub in timm's layout (`vit export --format hub`): hf-hub:owner/name[@rev]
HUB_PROBE_SECONDS = 5.0


def hub_repo(name: str) -> tuple[str, str | None] | None:
    """(repository, revision) of a timm name whose weights timm publishes as a timm-format hub repository, else
    None (unknown names, other hosts or files: `timm.create_model` fetches those). ``hf-hub:owner/name[@revision]``:
    that repository."""
    from timm.models import get_pretrained_cfg

    if name.startswith(HF_HUB):
        repo_id, _, revision = name.removeprefix(HF_HUB).partition("@")
        return repo_id, revision or None

    cfg = get_pretrained_cfg(name)
    if cfg is None or not cfg.hf_hub_id or cfg.hf_hub_filename or cfg.source:
        return None
    repo_id, _, revision = cfg.hf_hub_id.partition("@")
    return repo_id, revision or None


def cached_file(repo_id: str, revision: str | None, filenames: Sequence[str] = HUB_WEIGHTS) -> str | None:
    """The first of ``filenames`` (by default the weights) the Hugging Face cache holds of the repository, or None."""
    from huggingface_hub import try_to_load_from_cache

    for filename in filenames:
        cached = try_to_load_from_cache(repo_id, filename, revision=revision, cache_dir=hub_cache())
        if isinstance(cached, str):
            return cached
    return None


def check_reachable(name: str, repo_id: str) -> None:
    """Raise with the ways on when weights not in the cache cannot be downloaded (offline mode, no answer)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise WeightsUnavailableError(hub_advice(name, repo_id, "not in the cache, and HF_HUB_OFFLINE is set"))
    why = _unreachable(constants.ENDPOINT)
    if why:
        raise WeightsUnavailableError(hub_advice(name, repo_id, f"not in the cache, and {why}"))


def download(name: str, repo_id: str, revision: str | None, filenames: Sequence[str]) -> str:
    """The first of ``filenames`` the repository has, downloaded into the cache (its path there)."""
    import timm
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    missing = []
    for filename in filenames:
        try:
            return hf_hub_download(repo_id, filename, revision=revision, cache_dir=hub_cache(),
                                   library_name="timm", library_version=timm.__version__)
        except EntryNotFoundError as e:  # not in the repository: try the next
            missing.append(f"{filename}: {type(e).__name__}")
        except Exception as e:  # network, authentication, a broken cache: the same advice
            raise WeightsUnavailableError(hub_advice(name, repo_id, f"{type(e).__name__}: {e}")) from e
    raise WeightsUnavailableError(hub_advice(name, repo_id, "; ".join(missing)))


def hub_weights(name: str) -> str | None:
    """The weights file of a timm tag or a shared model, in timm's names: from the Hugging Face cache when it holds
    one, else downloaded (offline, within seconds: an error with the ways on). None: timm publishes the tag's
    weights elsewhere or in another layout (`timm.create_model` fetches those).

    timm publishes its ViT weights as ``timm/<name>`` repositories holding a timm-format ``model.safetensors``
    (or ``pytorch_model.bin``): read straight from there, without building timm's model. huggingface_hub itself
    retries an unreachable hub for about 25 s per file, hence the probe first.
    """
    hub = hub_repo(name)
    if hub is None:
        return None
    repo_id, revision = hub
    cached = cached_file(repo_id, revision)
    if cached:
        return cached
    check_reachable(name, repo_id)
    return download(name, repo_id, revision, HUB_WEIGHTS)


def hub_folder(name: str) -> Path:
    """The folder of a shared model ``hf-hub:owner/name[@revision]`` (config.json and its weights): the Hugging
    Face cache's snapshot when it holds both, else downloaded there; offline and not cached, an error in one line.
    The same look-up as a timm tag's weights (`hub_weights`)."""
    repo_id, revision = hub_repo(name) or (name, None)
    weights = cached_file(repo_id, revision)
    config = cached_file(repo_id, revision, ("config.json",))
    if weights and config and Path(config).parent == Path(weights).parent:
        return Path(weights).parent
    check_reachable(name, repo_id)
    download(name, repo_id, revision, ("config.json",))
    return Path(download(name, repo_id, revision, HUB_WEIGHTS)).parent


def hub_cache() -> str:
    """The Hugging Face cache folder as the environment says now: $HF_HUB_CACHE, else $HF_HOME/hub.

    huggingface_hub reads these once, when it is imported (timm imports it early); a process that sets them
    afterwards (a test, a notebook) would otherwise be looked up in the old place."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return constants.HF_HUB_CACHE


def _unreachable(endpoint: str, timeout: float = HUB_PROBE_SECONDS) -> str | None:
    """Why the hub at ``endpoint`` cannot be reached within ``timeout`` seconds, or None."""
    from urllib.parse import urlparse

    url = urlparse(endpoint)
    why = unreachable(url.hostname or "", url.port or (443 if url.scheme == "https" else 80), timeout)
    return why and f"the hub at {endpoint} is unreachable: {why}"


def hub_advice(name: str, repo_id: str, reason: str) -> str:
    """Where the weights of a timm name were looked for, and the three ways on without network."""
    folder = Path(hub_cache()) / f"models--{repo_id.replace('/', '--')}"
    if name.startswith(HF_HUB):  # a shared model: no timm file to point at instead
        return (f"cannot load {name!r}: {reason}; looked in {folder}: fill it on a connected machine "
                f"(`hf download {repo_id}`), copy it here and set HF_HUB_OFFLINE=1")
    return (
        f"cannot load pretrained weights {name!r}: {reason}.\n"
        f"Looked in the Hugging Face cache: {folder} ($HF_HUB_CACHE, else $HF_HOME/hub).\n"
        "Three ways on:\n"
        f"  1. fill the cache on a connected machine (`hf download {repo_id} model.safetensors`), copy "
        f"{folder.name} here and set HF_HUB_OFFLINE=1;\n"
        f"  2. pass a local file: --model.init_args.pretrained path/to/model.safetensors (or .pth, .npz; "
        f"from https://huggingface.co/{repo_id});\n"
        "  3. train from scratch: vit fit --config configs/scratch_small.yaml --data.init_args.root YOUR_FOLDER\n"
        "     (not --model.init_args.pretrained null here: random weights at a fine-tuning lr learn little)."
    )
