"""LoRA and DoRA adapters on a ViT's linear layers, merged exactly into plain timm-layout weights.

LoRA (Hu et al., 2021) adds a low-rank update to a frozen weight W (out, in); DoRA (Liu et al., 2024) also
rescales each output row to a learned magnitude:

    LoRA   y = W x + b + s · B A x                      A (r, in) random, B (out, r) zero, s = alpha / r
    DoRA   y = g ⊙ (W x + s · B A x) + b                g = m / ‖W + s·B A‖ per row (the norm detached, as
                                                         the paper's §4.3), m starts at ‖W‖ per row

B starts at zero and m at the rows' own norms, so an adapted model computes its base model's outputs exactly
(bit for bit) until the first update. `merge_adapters` folds the update into W (W + s·B A, times g for DoRA)
and puts plain ``nn.Linear`` layers back: the merged model has timm's state-dict names and nothing else.

Targets, by role in every encoder block (`LoraConfig.targets`):

    q, k, v     slices of the fused ``attn.qkv`` (rows [q; k; v]): one adapter per slice, computed for all
                slices together in two matmuls (x Aᵀ, then a block matrix of the Bs); no loop per head,
                and attention keeps its fused SDPA path
    qkv         the whole fused matrix, one adapter (what PEFT can express on timm's ViT)
    proj        ``attn.proj``
    fc1, fc2    ``mlp.fc1``, ``mlp.fc2``

A `LoraLinear` keeps the base layer's ``weight`` and ``bias`` under their own names (so a model with adapters
loads and saves base weights under timm's keys) and adds ``lora_A.<part>``, ``lora_B.<part>`` and, for DoRA,
``lora_magnitude.<part>``, where a part is q, k, v or ``all`` (the whole matrix). `adapter_names` lists them;
`adapter_state_dict` holds them alone. `base_layers` shows the model without adapters for a while (e.g. to
load base weights into it), and `init_magnitudes` restarts DoRA's m from the weights loaded.

What DoRA adds is a `LoraVariant` (as PEFT's ``tuners/lora/layer.py`` has it): `DoraVariant` owns the magnitudes,
the rescaled output and the rescaled merge, so `LoraLinear` itself never asks which kind it is.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vit.errors import UserValueError
from vit.hashing import digest

QKV_PARTS = ("q", "k", "v")
TARGETS = (*QKV_PARTS, "qkv", "proj", "fc1", "fc2")
LAYERS = {"qkv": "attn.qkv", "proj": "attn.proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}  # role -> path in a block
ADAPTER_PREFIXES = ("lora_A.", "lora_B.", "lora_magnitude.")


@dataclass
class LoraConfig:
    """What the adapters look like: rank r, scale alpha (the update is alpha / r · B A), dropout on the adapter's
    input, the roles they adapt (see the module docstring), the last ``last_blocks`` blocks only (None: all),
    and DoRA's per-row magnitude on top (``dora``)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q", "v")
    last_blocks: int | None = None
    dora: bool = False

    def __post_init__(self) -> None:
        self.targets = tuple(self.targets)
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise UserValueError(f"lora targets must be some of {', '.join(TARGETS)}, got {list(self.targets)}")
        if "qkv" in self.targets and set(self.targets) & set(QKV_PARTS):
            raise UserValueError(f"lora targets: 'qkv' adapts the whole fused matrix, which q, k or v would adapt "
                                 f"twice: give one or the other, got {list(self.targets)}")
        if self.rank < 1:
            raise UserValueError(f"lora rank must be at least 1, got {self.rank}")
        if not 0.0 <= self.dropout < 1.0:
            raise UserValueError(f"lora dropout must be in [0, 1), got {self.dropout}")
        if self.last_blocks is not None and self.last_blocks < 1:
            raise UserValueError(f"lora last_blocks must be at least 1 (or null: all blocks), got {self.last_blocks}")

    def to_dict(self) -> dict:
        """Plain JSON-able values (targets as a list), what a checkpoint and an adapter export record."""
        return {**{f.name: getattr(self, f.name) for f in fields(LoraConfig)}, "targets": list(self.targets)}

    @classmethod
    def from_dict(cls, values: dict) -> LoraConfig:
        """The config from `to_dict`'s keys (a checkpoint's ``lora`` entry: its other keys ignored)."""
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})

    @property
    def scaling(self) -> float:
        """The update's factor s = alpha / r."""
        return self.alpha / self.rank


class LoraVariant:
    """What a kind of adapter makes of LoRA's update (PEFT's ``LoraVariant``): its own parameters on a layer, its
    output and its merged weight. Plain LoRA adds the update and nothing else."""

    name = "LoRA"

    def init(self, layer: LoraLinear) -> None:
        """Its parameters on ``layer`` (none)."""

    def forward(self, layer: LoraLinear, y: Tensor, delta: Tensor, keep: slice, bias: Tensor | None) -> Tensor:
        """The output from the base's ``y`` (its ``keep`` rows, ``bias`` theirs) and the update ``delta``."""
        return y + delta

    def merge(self, layer: LoraLinear, weight: Tensor) -> Tensor:
        """The merged weight from W + s·B A."""
        return weight


class DoraVariant(LoraVariant):
    """DoRA: a learned magnitude m per adapted row (``lora_magnitude``), the rows rescaled by g = m / ‖W + s·B A‖."""

    name = "DoRA"

    def init(self, layer: LoraLinear) -> None:
        like = dict(device=layer.weight.device, dtype=layer.weight.dtype)
        layer.lora_magnitude.update({p: nn.Parameter(torch.empty(b - a, **like)) for p, (a, b) in layer.parts.items()})
        layer.init_magnitudes()

    def forward(self, layer: LoraLinear, y: Tensor, delta: Tensor, keep: slice, bias: Tensor | None) -> Tensor:
        g = layer.row_scale()[keep].to(y.dtype)
        plain = y if bias is None else y - bias  # W x: g - 1 is 0 at the start, so the output is y exactly
        return y + (g - 1) * plain + g * delta

    def merge(self, layer: LoraLinear, weight: Tensor) -> Tensor:
        return layer.row_scale()[:, None] * weight


class LoraLinear(nn.Module):
    """A frozen linear layer (its ``weight`` and ``bias``, shared with the layer it wraps) plus low-rank updates
    of row ranges ``parts``: {part name: (first row, end row)}."""

    def __init__(self, base: nn.Linear, parts: dict[str, tuple[int, int]], cfg: LoraConfig) -> None:
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.parts = dict(sorted(parts.items(), key=lambda item: item[1]))  # in row order
        self.scaling, self.rank = cfg.scaling, cfg.rank
        self.variant = DoraVariant() if cfg.dora else LoraVariant()
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()
        like = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.lora_A = nn.ParameterDict({p: nn.Parameter(torch.empty(cfg.rank, self.in_features, **like))
                                        for p in self.parts})
        self.lora_B = nn.ParameterDict({p: nn.Parameter(torch.zeros(b - a, cfg.rank, **like))
                                        for p, (a, b) in self.parts.items()})
        for a in self.lora_A.values():
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # nn.Linear's (and PEFT's) initialisation
        self.lora_magnitude = nn.ParameterDict()  # DoRA's (`DoraVariant`), empty for LoRA
        self.variant.init(self)

    def _updated_rows(self, part: str) -> Tensor:
        """W + s·B A on the rows of ``part``: (rows, in)."""
        a, b = self.parts[part]
        return self.weight[a:b] + self.scaling * (self.lora_B[part] @ self.lora_A[part])

    @torch.no_grad()
    def init_magnitudes(self) -> None:
        """DoRA's m as the rows' norms of the current weights: the layer computes its base layer's outputs."""
        for part, m in self.lora_magnitude.items():
            m.copy_(torch.linalg.vector_norm(self._updated_rows(part), dim=1))

    def _segments(self, fill: Iterable[tuple[str, Tensor]], empty: Callable[[int], Tensor]) -> Tensor:
        """The parts' row blocks ``fill`` in row order, with ``empty(n)`` for the n rows between them."""
        blocks, row = [], 0
        for part, block in fill:
            a, b = self.parts[part]
            if a > row:
                blocks.append(empty(a - row))
            blocks.append(block)
            row = b
        if row < self.out_features:
            blocks.append(empty(self.out_features - row))
        return blocks[0] if len(blocks) == 1 else torch.cat(blocks)

    def stacked_B(self) -> Tensor:
        """All the Bs as one (out, parts · r) block matrix: part i's B in its rows and columns i·r..(i+1)·r."""
        n = len(self.parts) * self.rank
        padded = ((p, F.pad(self.lora_B[p], (i * self.rank, n - (i + 1) * self.rank)))
                  for i, p in enumerate(self.parts))
        return self._segments(padded, lambda rows: self.weight.new_zeros(rows, n))

    def stacked_A(self) -> Tensor:
        """All the As as one (parts · r, in) matrix."""
        parts = [self.lora_A[p] for p in self.parts]  # ParameterDict sorts its keys: the parts' row order here
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def row_scale(self) -> Tensor:
        """DoRA's g (out,): m / ‖W + s·B A‖ on the adapted rows (the norm detached), 1 elsewhere."""
        g = ((p, m / torch.linalg.vector_norm(self._updated_rows(p), dim=1).detach())
             for p, m in ((p, self.lora_magnitude[p]) for p in self.parts))
        return self._segments(g, lambda rows: self.weight.new_ones(rows))

    def forward(self, x: Tensor, rows: slice | None = None) -> Tensor:
        """``x`` (..., in) -> (..., out), or only the output ``rows`` (attention's queries from a subset of tokens)."""
        keep = slice(None) if rows is None else rows
        bias = None if self.bias is None else self.bias[keep]
        y = F.linear(x, self.weight[keep], bias)  # bit for bit the base layer's output
        B = self.stacked_B()[keep]  # (out, R)
        delta = F.linear(F.linear(self.dropout(x), self.stacked_A()), B) * self.scaling  # (..., r) -> (..., out)
        return self.variant.forward(self, y, delta, keep, bias)

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` with the update folded into its weight (the variant's too); the bias unchanged."""
        weight = self.variant.merge(self, self.weight + self.scaling * (self.stacked_B() @ self.stacked_A()))
        return plain_linear(nn.Parameter(weight.to(self.weight.dtype), requires_grad=self.weight.requires_grad),
                            self.bias)

    def plain(self) -> nn.Linear:
        """The base layer, without the update (sharing the weight and bias tensors)."""
        return plain_linear(self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, {self.variant.name} r={self.rank} on {', '.join(self.parts)}"


def plain_linear(weight: nn.Parameter, bias: nn.Parameter | None) -> nn.Linear:
    """An ``nn.Linear`` that holds these very tensors (no copy, no new initialisation)."""
    layer = nn.Linear(1, 1, bias=False, device="meta")
    layer.in_features, layer.out_features = weight.shape[1], weight.shape[0]
    layer.weight, layer.bias = weight, bias
    return layer


def _parent(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    parent, _, name = path.rpartition(".")
    return (model.get_submodule(parent) if parent else model), name


def _adapted_blocks(model: nn.Module, cfg: LoraConfig) -> list[tuple[int, nn.Module]]:
    blocks = list(getattr(model, "blocks", []))
    if not blocks:
        raise UserValueError(f"LoRA adapts a ViT's encoder blocks; {type(model).__name__} has no .blocks")
    if cfg.last_blocks is not None and cfg.last_blocks > len(blocks):
        raise UserValueError(f"lora last_blocks is {cfg.last_blocks}, but the model has {len(blocks)} blocks")
    first = 0 if cfg.last_blocks is None else len(blocks) - cfg.last_blocks
    return list(enumerate(blocks))[first:]


def add_adapters(model: nn.Module, cfg: LoraConfig) -> None:
    """Wrap the targeted linear layers of ``model``'s blocks (all, or the last ``cfg.last_blocks``) in place."""
    if has_adapters(model):
        raise UserValueError("this model has adapters already: merge_adapters(model) first")
    for _, block in _adapted_blocks(model, cfg):
        for role, path in LAYERS.items():
            layer = block.get_submodule(path)
            if role == "qkv" and "qkv" not in cfg.targets:
                width = layer.out_features // 3
                parts = {p: (i * width, (i + 1) * width) for i, p in enumerate(QKV_PARTS) if p in cfg.targets}
            else:
                parts = {"all": (0, layer.out_features)} if role in cfg.targets else {}
            if parts:
                parent, name = _parent(block, path)
                setattr(parent, name, LoraLinear(layer, parts, cfg))


def lora_layers(model: nn.Module) -> Iterator[tuple[str, LoraLinear]]:
    """(name, layer) of every `LoraLinear` in ``model``."""
    return ((n, m) for n, m in model.named_modules() if isinstance(m, LoraLinear))


def has_adapters(model: nn.Module) -> bool:
    """Whether ``model`` holds any `LoraLinear`."""
    return next(lora_layers(model), None) is not None


def _replace_all(model: nn.Module, make: Callable[[LoraLinear], nn.Module]) -> list[tuple[nn.Module, str, LoraLinear]]:
    swapped = []
    for path, layer in list(lora_layers(model)):
        parent, name = _parent(model, path)
        setattr(parent, name, make(layer))
        swapped.append((parent, name, layer))
    return swapped


def merge_adapters(model: nn.Module) -> None:
    """Fold every adapter into its layer's weight, in place: plain ``nn.Linear`` layers, timm's state-dict keys."""
    _replace_all(model, LoraLinear.merged)


@contextmanager
def base_layers(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` without its adapters while the block runs (its base layers, sharing their tensors: loading
    weights into them loads the adapted model's base), then with them again."""
    swapped = _replace_all(model, LoraLinear.plain)
    try:
        yield model
    finally:
        for parent, name, layer in swapped:
            setattr(parent, name, layer)


def init_magnitudes(model: nn.Module) -> None:
    """Restart every DoRA magnitude from the current weights (after loading base weights into the model)."""
    for _, layer in lora_layers(model):
        layer.init_magnitudes()


def is_adapter(name: str) -> bool:
    """Whether the parameter ``name`` is an adapter's (A, B or a DoRA magnitude)."""
    return any(f".{prefix}" in f".{name}" for prefix in ADAPTER_PREFIXES)


def adapter_names(model: nn.Module) -> list[str]:
    """The names of ``model``'s adapter parameters."""
    return [n for n, _ in model.named_parameters() if is_adapter(n)]


def adapter_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The adapters alone: {name: tensor} (``blocks.3.attn.qkv.lora_A.q``, ...)."""
    return {n: p.detach() for n, p in model.named_parameters() if is_adapter(n)}


def base_digest(state: dict[str, Tensor], leave_out: Iterable[str] = ()) -> str:
    """The sha256 of the base weights in ``state`` (adapters and ``leave_out`` left out, the rest by sorted name):
    a checkpoint that holds only what trained names its base by it."""
    skip = set(leave_out)
    h = hashlib.sha256()
    for name in sorted(k for k in state if k not in skip and not is_adapter(k)):
        h.update(name.encode())
        digest(h, state[name])
    return h.hexdigest()


__all__ = ["TARGETS", "DoraVariant", "LoraConfig", "LoraLinear", "LoraVariant", "adapter_names",
           "adapter_state_dict", "add_adapters", "base_digest", "base_layers", "has_adapters", "init_magnitudes",
           "is_adapter", "lora_layers", "merge_adapters"]
