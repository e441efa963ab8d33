"""scripts/experiments/distill_demo.py: the student is at least 4x cheaper than the teacher, counted independently, and
each arm's flags are ones `vit fit` accepts. (The figures take minutes: docs/small-folders.md.)"""

from __future__ import annotations

from pathlib import Path

import yaml
from PIL import Image

from tests import load_script


def _hand_flops(embed_dim: int, depth: int, tokens: int, patch: int = 8, chans: int = 3, classes: int = 10) -> int:
    """2 x the multiply-adds of the patch embedding, of each block's qkv, proj, fc1 and fc2 (mlp ratio 4) on every
    token, of the attention's two products, and of the head: what the counter's figure is checked against."""
    blocks = depth * tokens * 2 * (3 + 1 + 8) * embed_dim**2
    attention = depth * 2 * 2 * tokens * tokens * embed_dim
    embed = 2 * (tokens - 1) * patch * patch * chans * embed_dim
    return blocks + attention + embed + 2 * embed_dim * classes


def test_the_student_costs_at_least_4x_fewer_flops_than_the_teacher():
    import torch

    from vit.nn.vision import create_model

    demo = load_script("distill_demo")
    student_kwargs = yaml.safe_load(demo.STUDENT % "avg")
    teacher = create_model("vit_scratch_patch8_32", num_classes=10, global_pool="avg").eval()
    student = create_model("vit_scratch_patch8_32", num_classes=10, **student_kwargs).eval()
    counted = {name: demo.flops_per_image(m, (3, 32, 32)) for name, m in (("teacher", teacher), ("student", student))}
    assert counted["teacher"] == _hand_flops(96, 4, 17)
    assert counted["student"] == _hand_flops(48, 3, 17)
    assert counted["teacher"] / counted["student"] >= 4
    assert torch.is_grad_enabled()  # the counter's no_grad does not leak


def test_the_distilled_students_last_block_computes_only_its_two_head_tokens():
    """Why the distilled student counts fewer FLOPs than the same ViT alone, though it carries one more token: its
    heads read the cls and dist tokens only, so the last block projects keys and values for all 18 tokens but
    queries, proj and MLP for those 2 (`vit.nn.attention`: queries from a subset of the keys' tokens)."""
    import torch

    from vit.nn.vision import create_model

    demo = load_script("distill_demo")
    D, depth, tokens, heads = 48, 3, 18, 2  # 16 patches + cls + dist; 2 of them read by the heads
    kwargs = {**yaml.safe_load(demo.STUDENT % "token"), "distilled": True}
    student = create_model("vit_scratch_patch8_32", num_classes=10, **kwargs).eval()
    full = _hand_flops(D, depth - 1, tokens, classes=0) - 2 * (tokens - 1) * 8 * 8 * 3 * D  # blocks only
    last = 2 * 2 * tokens * D**2 + 2 * heads * (1 + 1 + 8) * D**2 + 2 * 2 * heads * tokens * D  # kv; q, proj, MLP
    embed = 2 * (tokens - 2) * 8 * 8 * 3 * D
    assert demo.flops_per_image(student, (3, 32, 32)) == full + last + embed + 2 * 2 * D * 10  # two heads
    assert torch.is_grad_enabled()


def test_each_arm_is_the_recipe_with_the_student_and_the_teacher_of_its_seed(tmp_path):
    from vit.cli.main import build_model_and_data

    demo = load_script("distill_demo")
    folder = tmp_path / "photos"
    for split in ("train", "val", "test"):
        for name in ("a", "b"):
            (folder / split / name).mkdir(parents=True)
            Image.new("L", (8, 8), 255 if name == "a" else 0).save(folder / split / name / "0.png")
    args = demo.arm_args("distilled", folder, 2, tmp_path, 1, 1, 0, ["--data.init_args.hflip", "0"])
    assert args[args.index("--config") + 1].endswith("configs/distill_small.yaml")
    teacher_dir = Path(args[args.index("--model.init_args.teacher_dir") + 1])
    assert teacher_dir == tmp_path / "teacher_2" / "logs" / "scratch_small" / "checkpoints"
    for arm in demo.ARMS:
        module, data, _ = build_model_and_data(demo.arm_args(arm, folder, 0, tmp_path, 1, 1, 0, []), "fit")
        assert module.model.embed_dim == (96 if arm == "teacher" else 48) and data.root == folder
        assert module.hparams.get("distillation") == ("soft" if arm == "distilled" else None)  # the recipe's own
