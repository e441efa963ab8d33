"""The Hugging Face hub and its cache (`vit.checkpoints.hub`): which repository a name means, what the cache holds,
and the one-message failure offline."""

from __future__ import annotations

import pytest
import torch
from timm.models import get_pretrained_cfg

from tests.formats import write_hf_cache
from vit.checkpoints.hub import cached_file, check_reachable, hub_folder, hub_repo, hub_weights
from vit.errors import WeightsUnavailableError

TAG = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, found through $HF_HUB_CACHE, in offline mode."""
    import huggingface_hub.constants

    folder = tmp_path / "hub"
    folder.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return folder


def test_hub_repo_reads_a_shared_models_name_and_timms_table():
    assert hub_repo("hf-hub:someone/digits@v2") == ("someone/digits", "v2")
    assert hub_repo("hf-hub:someone/digits") == ("someone/digits", None)
    assert hub_repo(TAG) == (get_pretrained_cfg(TAG).hf_hub_id, None) == (f"timm/{TAG}", None)


def test_the_cache_is_read_offline_and_an_empty_one_says_where_it_looked(cache):
    weights = {"w": torch.arange(3.0)}
    assert cached_file(f"timm/{TAG}", None) is None
    with pytest.raises(WeightsUnavailableError, match=rf"(?s)not in the cache, and HF_HUB_OFFLINE is set.*"
                                                      rf"models--timm--{TAG}") as error:
        hub_weights(TAG)
    assert "Three ways on" in str(error.value)
    repo = write_hf_cache(cache, f"timm/{TAG}", "model.safetensors", weights)
    found = next(repo.glob("snapshots/*/model.safetensors"))
    assert cached_file(f"timm/{TAG}", None) == hub_weights(TAG) == str(found)
    assert cached_file(f"timm/{TAG}", None, ("config.json",)) is None


def test_a_shared_model_folder_needs_its_config_beside_the_weights(cache):
    repo = write_hf_cache(cache, "someone/digits", "model.safetensors", {"w": torch.zeros(1)})
    snapshot = next(repo.glob("snapshots/*"))
    with pytest.raises(WeightsUnavailableError, match=r"cannot load 'hf-hub:someone/digits': not in the cache"):
        hub_folder("hf-hub:someone/digits")  # the weights alone: not a folder timm or vit can read
    (snapshot / "config.json").write_text("{}")
    assert hub_folder("hf-hub:someone/digits") == snapshot


def test_check_reachable_names_an_unreachable_hub(monkeypatch, cache):
    import huggingface_hub.constants

    from tests.conftest import free_port

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(WeightsUnavailableError, match=r"the hub at http://127\.0\.0\.1:\d+ is unreachable"):
        check_reachable(TAG, f"timm/{TAG}")
