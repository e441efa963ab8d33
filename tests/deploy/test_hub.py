"""`vit export --format hub`: the folder timm (`local-dir:`) and transformers (AutoModelForImageClassification,
pipeline) load with our logits and class names, its model card, `hf-hub:` as a source, and the upload.

Expected values come from timm, transformers and huggingface_hub themselves, and from the run's metrics.csv read
with the csv module here; the upload is checked by the HTTP requests huggingface_hub sends (its httpx2 transport
replaced), not by which function was called.
"""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import transformers
from PIL import Image

import vit
from tests.deploy.test_export import FAMILIES
from tests.helpers import TINY_DIM
from vit.commands import main
from vit.nn.configs import MODEL_CONFIGS


def _ours(fitted):
    from vit.deploy import load_classifier

    return load_classifier(next((fitted / "ckpt").glob("best-*.ckpt")))


def _digits(digit_pngs, n=8):
    paths, _ = digit_pngs
    return paths[:n]


def test_timm_local_dir_gives_our_logits_and_class_names(fitted, hub, digit_pngs):
    ours = _ours(fitted)
    theirs = timm.create_model(f"local-dir:{hub}", pretrained=True).eval()
    assert theirs.pretrained_cfg["label_names"] == ours.class_names
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=theirs))
    paths = _digits(digit_pngs)
    # Each side reads the file its own way: ours as grayscale (as vit predict does), timm's as RGB.
    x_ours = torch.stack([ours.eval_transform()(Image.open(p).convert("L")) for p in paths])
    x_timm = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])
    assert x_timm.shape[1] == 3 and x_ours.shape[1] == 1
    with torch.no_grad():
        torch.testing.assert_close(theirs(x_timm), ours(x_ours), atol=1e-5, rtol=0)


def test_timm_on_a_colour_image_gives_our_logits_on_its_luma(tmp_path):
    """A 1-channel model's export takes RGB and sees its luma: on random colour images (R, G, B apart, where any
    weights summing to 1 would pass on gray ones) timm's logits are ours on PIL's convert("L") of them (ITU-R 601-2
    luma), up to PIL's rounding of the luma to whole levels. Weights moved off their init: logits that follow the
    pixels."""
    from tests.nn.test_vision import perturb
    from vit.deploy.card import RunFacts
    from vit.deploy.classifier import Classifier
    from vit.deploy.hub import export_hub

    model = perturb(vit.create_model("vit_digits_patch2_8", depth=1, embed_dim=TINY_DIM, num_heads=2, num_classes=3),
                    scale=0.2).eval()
    classifier = Classifier(model, model_name="vit_digits_patch2_8", class_names=["cat", "dog", "owl"], mean=[0.5],
                            std=[0.5], crop_pct=1.0, interpolation="bicubic")
    assert classifier.in_chans == 1
    export_hub(classifier, RunFacts(tmp_path / "none.ckpt"), tmp_path)
    theirs = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=theirs))
    rng = np.random.default_rng(4)
    pictures = [Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "RGB") for _ in range(8)]
    x_timm = torch.stack([transform(p) for p in pictures])
    x_ours = torch.stack([classifier.eval_transform()(p.convert("L")) for p in pictures])
    assert x_timm.shape[1] == 3 and x_ours.shape[1] == 1
    with torch.no_grad():
        got, want = theirs(x_timm), model(x_ours)
    # PIL's whole levels move a logit by 0.005 here; the luma weights in BGR order by 0.39 (a spread of 0.4)
    assert (got - want).abs().max() <= 0.05 < want.std()


def test_vit_predict_reads_the_hub_folder_as_the_checkpoint(fitted, hub, digit_pngs, tmp_path):
    """`vit predict --ckpt DIR` (a hub folder) writes the rows `vit predict --ckpt best.ckpt` writes."""
    folder = _digits(digit_pngs)[0].parent
    main(["predict", "--ckpt", str(next((fitted / "ckpt").glob("best-*.ckpt"))), str(folder), "--out", "a.csv"])
    main(["predict", "--ckpt", str(hub), str(folder), "--out", "b.csv"])
    a, b = (list(csv.DictReader(Path(f).read_text().splitlines())) for f in ("a.csv", "b.csv"))
    assert [r["class_1"] for r in a] == [r["class_1"] for r in b]
    assert max(abs(float(x["prob_1"]) - float(y["prob_1"])) for x, y in zip(a, b, strict=True)) <= 1e-5


def test_the_hub_folder_carries_t_and_vit_predict_on_it_applies_it(calibrated, digit_pngs, tmp_path):
    """config.json holds the checkpoint's T (not its unknown score, which timm's weights cannot compute), the card
    states it, and `vit predict` on the folder answers softmax(timm's logits / T): the checkpoint's probabilities."""
    from huggingface_hub import ModelCard
    from scipy.special import softmax

    ckpt, _ = calibrated
    from vit.commands import run

    stored = torch.load(ckpt, weights_only=False)["confidence"]
    temperature = stored["temperature"]
    main(["export", "--ckpt", str(ckpt), "--format", "hub", "--out", str(tmp_path / "hub")])
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    assert config["calibration"] == {"temperature": temperature, "tta": stored["tta"]}
    assert f"temperature T = {temperature:.4f}" in ModelCard.load(tmp_path / "hub" / "README.md").text
    paths = _digits(digit_pngs)
    theirs = timm.create_model(f"local-dir:{tmp_path / 'hub'}", pretrained=True).eval()  # it ignores the key
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=theirs))
    with torch.no_grad():
        logits = theirs(torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])).double().numpy()
    want = softmax(logits / temperature, axis=1)
    assert np.abs(want - softmax(logits, axis=1)).max() > 1e-3  # T moves them
    rows = run(["predict", "--ckpt", str(tmp_path / "hub"), *map(str, paths), "--out", str(tmp_path / "p.json"),
                "--top_k", "10", "--tta", "none"])  # timm's logits are the plain image's
    got = np.zeros_like(want)
    for i, r in enumerate(rows):
        got[i, [e["class"] for e in r["top_k"]]] = [e["probability"] for e in r["top_k"]]
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert [r["answer"] for r in rows] == [str(i) for i in want.argmax(1)]  # no unknown score travels: the class


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_loads_in_timm_and_transformers(name, tmp_path):
    """Random weights, tiny widths: the hub folder of every ViT family timm builds gives our logits in timm's
    local-dir and in transformers (which builds it through timm)."""
    from vit.deploy.card import RunFacts
    from vit.deploy.classifier import Classifier
    from vit.deploy.hub import export_hub

    p = MODEL_CONFIGS[name]["patch_size"]
    model = vit.create_model(name, img_size=2 * p, depth=1, embed_dim=TINY_DIM, num_heads=2, num_classes=3).eval()
    classifier = Classifier(model, model_name=name, class_names=["cat", "dog", "owl"], mean=[0.5] * 3,
                            std=[0.5] * 3, crop_pct=1.0, interpolation="bicubic")
    export_hub(classifier, RunFacts(tmp_path / "none.ckpt"), tmp_path)
    x = torch.randn(2, 3, 2 * p, 2 * p)
    theirs = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    hf = transformers.AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(theirs(x), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(hf(pixel_values=x).logits, expected, atol=1e-5, rtol=0)
    assert theirs.pretrained_cfg["label_names"] == ["cat", "dog", "owl"]
    assert hf.config.id2label == {0: "cat", 1: "dog", 2: "owl"}


# ---- the upload, against huggingface_hub's real API with its HTTP transport replaced -----------------------------
class FakeHub:
    """What the Hub's HTTP API answers to an upload (create repo, branch, preupload, LFS batch and PUT, commit), and
    every request it received. Bytes in LFS mode are the large-file path a real Hub asks for *.safetensors."""

    def __init__(self):
        self.requests: list[tuple[str, str, bytes]] = []
        self.stored: dict[str, bytes] = {}  # LFS uploads by oid
        self.hub_headers: list = []  # of the requests to the Hub's API (not the LFS store's signed URLs)

    def __call__(self, request):
        import httpx2

        body, path = request.read(), request.url.path
        self.requests.append((request.method, path, body))
        if request.url.host == "huggingface.co":
            self.hub_headers.append((request.method, path, request.headers.get("authorization")))
        if path == "/api/repos/create":
            return httpx2.Response(200, json={"url": "https://huggingface.co/owner/name", "name": "owner/name"})
        if path == "/api/validate-yaml":  # the Hub checks the card's metadata before the commit
            return httpx2.Response(200, json={"errors": [], "warnings": []})
        if "/branch/" in path:
            return httpx2.Response(200, json={})
        if "/preupload/" in path:
            files = json.loads(body)["files"]
            return httpx2.Response(200, json={"files": [
                {"path": f["path"], "uploadMode": "lfs" if f["path"].endswith((".safetensors", ".png")) else "regular",
                 "shouldIgnore": False} for f in files]})
        if path.endswith(".git/info/lfs/objects/batch"):
            objects = json.loads(body)["objects"]
            return httpx2.Response(200, json={"transfer": "basic", "objects": [
                {"oid": o["oid"], "size": o["size"],
                 "actions": {"upload": {"href": f"https://lfs.example/{o['oid']}"}}} for o in objects]})
        if request.url.host == "lfs.example" and request.method == "PUT":
            self.stored[path.strip("/")] = body
            return httpx2.Response(200)
        if "/commit/" in path:
            return httpx2.Response(200, json={"commitUrl": "https://huggingface.co/owner/name/commit/abc",
                                              "commitOid": "abc"})
        return httpx2.Response(404, json={"error": f"unexpected {request.method} {path}"})


@pytest.fixture
def fake_hub(monkeypatch):
    """huggingface_hub online, with a token, its httpx2 client on `FakeHub` (Xet off: its uploads bypass httpx)."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    hub = FakeHub()
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setenv("HF_TOKEN", "hf_fake_token")
    _http.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(hub), follow_redirects=True,
                                                   event_hooks={"request": [_http.hf_request_event_hook]}))
    yield hub
    _http.set_client_factory(_http.default_client_factory)


@pytest.mark.parametrize("private", [True, False])
def test_push_to_hub_sends_the_folder_a_real_hub_would_receive(fitted, tmp_path, fake_hub, capsys, private):
    """--private --revision v1: a private repository, a branch v1 and the commit on it; without: public, on main."""
    import base64
    import hashlib

    out, branch = tmp_path / "digits", "v1" if private else "main"
    main(["export", "--ckpt", str(next((fitted / "ckpt").glob("best-*.ckpt"))), "--format", "hub", "--out", str(out),
          "--push_to_hub", "owner/name", *(["--private", "--revision", "v1"] if private else [])])
    calls = [(m, p) for m, p, _ in fake_hub.requests if m != "GET"]  # GETs: huggingface_hub's own look-ups
    assert calls[0] == ("POST", "/api/repos/create")
    assert calls[-1] == ("POST", f"/api/models/owner/name/commit/{branch}")
    assert (("POST", "/api/models/owner/name/branch/v1") in calls) == private
    (create,) = [json.loads(body) for m, p, body in fake_hub.requests if p == "/api/repos/create"]
    assert create["name"] == "name" and create["organization"] == "owner" and create["type"] == "model"
    assert create["visibility"] == ("private" if private else "public")
    commit = [body for m, p, body in fake_hub.requests if p == f"/api/models/owner/name/commit/{branch}"]
    assert len(commit) == 1
    lines = [json.loads(line) for line in commit[0].decode().splitlines()]
    assert lines[0]["key"] == "header" and lines[0]["value"]["summary"] == "vit export --format hub: digits"
    regular = {x["value"]["path"]: base64.b64decode(x["value"]["content"]) for x in lines if x["key"] == "file"}
    lfs = {x["value"]["path"]: x["value"]["oid"] for x in lines if x["key"] == "lfsFile"}
    assert regular == {name: (out / name).read_bytes() for name in ("README.md", "config.json")}
    assert set(lfs) == {"model.safetensors", "confusion_matrix.png"}
    for name, oid in lfs.items():  # the bytes the LFS store received are the files', under their sha256
        assert oid == hashlib.sha256((out / name).read_bytes()).hexdigest() and fake_hub.stored[oid] == (
            out / name).read_bytes()
    validated = [json.loads(body)["content"] for m, p, body in fake_hub.requests if p == "/api/validate-yaml"]
    assert validated and set(validated) == {(out / "README.md").read_text()}
    unauthorised = [(m, p) for m, p, auth in fake_hub.hub_headers if m != "GET" and auth != "Bearer hf_fake_token"]
    assert not unauthorised, unauthorised
    assert "pushed to owner/name: https://huggingface.co/owner/name/commit/abc" in capsys.readouterr().out


@pytest.mark.parametrize("why", ["offline", "no_token", "unreachable"])
def test_push_fails_in_one_line_naming_the_folder_written(fitted, tmp_path, monkeypatch, capsys, why):
    import socket

    from huggingface_hub import constants

    monkeypatch.setenv("HF_TOKEN", "hf_fake_token")
    if why != "offline":  # the conftest's HF_HUB_OFFLINE=1, as a user sets it, for "offline"
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    if why == "no_token":
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no_token"))
    if why == "unreachable":  # a Hub endpoint nothing listens on
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    out = tmp_path / "digits"
    with pytest.raises(SystemExit) as exit_:
        main(["export", "--ckpt", str(next((fitted / "ckpt").glob("best-*.ckpt"))), "--format", "hub",
              "--out", str(out), "--push_to_hub", "owner/name"])
    assert exit_.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{out} is written" in err[0] and "Traceback" not in err[0]
    assert {"offline": "HF_HUB_OFFLINE", "no_token": "HF_TOKEN", "unreachable": "ConnectError"}[why] in err[0]
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()


# ---- hf-hub:owner/name as a source, from a hand-made Hugging Face cache --------------------------------------------
def _cache_with(hub: Path, cache: Path, repo: str = "owner/digits") -> Path:
    """The Hugging Face cache as a download of ``repo`` leaves it: refs/main names a snapshot holding the files."""
    import shutil

    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(hub / name, snapshot / name)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("0" * 40)
    return snapshot


def test_hf_hub_pretrained_loads_from_the_cache_offline(hub, tmp_path, monkeypatch):
    """`pretrained: hf-hub:owner/digits` reads the cached weights (the luma patch embedding folded back to one
    channel); into a model with another head, the head stays fresh, as for a timm tag."""
    from safetensors.torch import load_file

    from vit.checkpoints.weights import load_pretrained

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    snapshot = _cache_with(hub, tmp_path / "hf")
    sd = load_file(snapshot / "model.safetensors")
    model = vit.create_model("vit_digits_patch4_16", depth=1, embed_dim=TINY_DIM, num_heads=2, num_classes=10)
    result = load_pretrained(model, "hf-hub:owner/digits")
    assert not result.head_reset and result.source == "hf-hub:owner/digits"
    torch.testing.assert_close(model.state_dict()["blocks.0.attn.qkv.weight"], sd["blocks.0.attn.qkv.weight"])
    torch.testing.assert_close(model.state_dict()["patch_embed.proj.weight"],
                               sd["patch_embed.proj.weight"].sum(1, keepdim=True), atol=1e-6, rtol=0)
    other = vit.create_model("vit_digits_patch4_16", depth=1, embed_dim=TINY_DIM, num_heads=2, num_classes=4)
    assert load_pretrained(other, "hf-hub:owner/digits").head_reset


def test_hf_hub_ckpt_predicts_as_the_checkpoint(fitted, hub, digit_pngs, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    _cache_with(hub, tmp_path / "hf")
    folder = _digits(digit_pngs)[0].parent
    main(["predict", "--ckpt", str(next((fitted / "ckpt").glob("best-*.ckpt"))), str(folder), "--out", "a.csv"])
    main(["predict", "--ckpt", "hf-hub:owner/digits", str(folder), "--out", "b.csv"])
    a, b = (list(csv.DictReader(Path(f).read_text().splitlines())) for f in ("a.csv", "b.csv"))
    assert len(a) == len(b) == len(digit_pngs[0]) and [r["class_1"] for r in a] == [r["class_1"] for r in b]
    assert max(abs(float(x["prob_1"]) - float(y["prob_1"])) for x, y in zip(a, b, strict=True)) <= 1e-5


def test_serve_answers_from_an_hf_hub_model_as_from_its_checkpoint(fitted, hub, digit_pngs, tmp_path, monkeypatch):
    """`vit serve --ckpt hf-hub:owner/digits` loads through the same loader: its answers are the checkpoint's."""
    import asyncio

    from tests.serve.conftest import client_of, make_app
    from vit.deploy import load_classifier
    from vit.serve.core import Predictor

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    _cache_with(hub, tmp_path / "hf")
    paths = _digits(digit_pngs, 6)

    async def answers(model: str) -> list[dict]:
        async with client_of(make_app(Predictor(load_classifier(model)))) as client:
            return [(await client.post("/predict", content=p.read_bytes(), headers={"Content-Type": "image/png"}))
                    .json()["top_k"][0] for p in paths]

    ours = asyncio.run(answers(str(next((fitted / "ckpt").glob("best-*.ckpt")))))
    shared = asyncio.run(answers("hf-hub:owner/digits"))
    assert [a["name"] for a in ours] == [a["name"] for a in shared]
    np.testing.assert_allclose([a["probability"] for a in ours], [a["probability"] for a in shared], atol=1e-5)


@pytest.mark.parametrize("network", ["HF_HUB_OFFLINE", "unreachable"])
@pytest.mark.parametrize("command", ["predict", "fit"])
def test_hf_hub_not_cached_fails_in_one_line(tmp_path, monkeypatch, capsys, network, command):
    """Nothing cached and no network (offline mode, or a hub that does not answer): one line, no traceback, naming
    the cache folder looked in; quickly."""
    import socket
    import time

    from huggingface_hub import constants

    from tests.conftest import short_digits_run

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    if network == "unreachable":
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    argv = (["predict", "--ckpt", "hf-hub:owner/missing", ".", "--out", "p.csv"] if command == "predict"
            else ["fit", *short_digits_run(tmp_path, "--model.init_args.pretrained=hf-hub:owner/missing")])
    start = time.monotonic()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code != 0 and time.monotonic() - start < 15
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
    assert len(err) == 1 and "hf-hub:owner/missing" in err[0], err
    assert str(tmp_path / "hf" / "models--owner--missing") in err[0] and "Traceback" not in err[0]
