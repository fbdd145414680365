"""A small ViT whose block linears can be swapped for WASI layers for fine-tuning.

Every linear layer is a `Dense` (a plain nn.Linear whose forward is `F.linear`), so the saved-
tensor measurement can tell the linear layers' saved tensors from the rest. `to_wasi` replaces
the linears inside the transformer blocks (qkv, proj, fc1, fc2) by `WASILinear` layers sharing
their parameters; the patch embedding and the classifier head stay dense in both variants.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from workloads.wasi.lowrank import (
    WASILinearFunction, init_weight_factors, subspace_step, tucker_power_step,
)


class Dense(nn.Linear):
    """nn.Linear; a distinct type so that measurements can scope saved tensors to linear layers."""


class WASILinear(Dense):
    """A linear layer trained by WASI.

    Parameters are the dense weight W (it receives grad_W and is updated by the optimizer, as in
    the paper's released code) and the bias. Buffers: the weight factors L [out, k], R [k, in]
    used by every forward, and the activation factors U_n warm-starting the next step's Tucker
    power step. `init_subspace` picks k once by explained variance; `refresh` runs the one
    warm-started subspace-iteration step per training step."""

    def __init__(self, in_features: int, out_features: int, bias: bool, act_ranks: tuple[int, int, int],
                 r_from: str = "new", seed: int = 0, sequential: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.act_ranks = tuple(act_ranks)
        self.sequential = sequential
        self.r_from = r_from
        self.rank = 0
        self.register_buffer("left", torch.empty(0))
        self.register_buffer("right", torch.empty(0))
        self.act_factors: list[torch.Tensor] | None = None
        self.generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def init_subspace(self, threshold: float) -> int:
        self.left, self.right, self.rank = init_weight_factors(self.weight, threshold)
        return self.rank

    @torch.no_grad()
    def refresh(self) -> None:
        self.left, self.right = subspace_step(self.weight, self.left, self.r_from)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rank == 0:
            raise RuntimeError("WASILinear.init_subspace(threshold) must run before the first forward")
        if not (torch.is_grad_enabled() and self.training):
            return F.linear(x @ self.right.t(), self.left, self.bias)  # low-rank inference
        if x.dim() != 3:
            raise ValueError(f"WASILinear compresses [B, N, C] activations, got shape {tuple(x.shape)}")
        with torch.no_grad():
            core, factors = tucker_power_step(x, self.act_ranks, self.act_factors, self.generator, self.sequential)
        self.act_factors = factors
        return WASILinearFunction.apply(x, self.weight, self.bias, self.left, self.right, core, *factors)

    # The rank, the activation factors and the generator travel in the state dict, so that a
    # resumed run warm-starts exactly where the interrupted one stopped.
    def get_extra_state(self) -> dict:
        return {"rank": self.rank, "act_factors": self.act_factors, "generator": self.generator.get_state()}

    def set_extra_state(self, state: dict) -> None:
        self.rank = int(state["rank"])
        self.act_factors = state["act_factors"]
        self.generator.set_state(state["generator"])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # noqa: ANN001
        # The factors' shapes are known only once k is chosen: take them from the checkpoint.
        for name in ("left", "right"):
            if prefix + name in state_dict:
                setattr(self, name, torch.empty_like(state_dict[prefix + name], device=self.weight.device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = Dense(dim, 3 * dim)
        self.proj = Dense(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = Dense(dim, mlp_ratio * dim)
        self.fc2 = Dense(mlp_ratio * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # [B, H, N, c/H]
        # Attention written out (no fused kernel) so that its saved tensors and flops are visible.
        attn = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads), dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    """Patch embedding (Dense over flattened patches), a class token, learned positions, pre-norm
    blocks, and a linear head on the normalised class token."""

    def __init__(self, image: int, patch: int, dim: int, depth: int, heads: int, mlp_ratio: int,
                 classes: int, init_std: float, channels: int = 1) -> None:
        super().__init__()
        self.patch = patch
        tokens = (image // patch) ** 2
        self.embed = Dense(patch * patch * channels, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, tokens + 1, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = Dense(dim, classes)
        for m in self.modules():
            if isinstance(m, Dense):
                _init_dense(m, init_std)
        nn.init.trunc_normal_(self.pos, std=init_std, a=-2 * init_std, b=2 * init_std)
        nn.init.trunc_normal_(self.cls, std=init_std, a=-2 * init_std, b=2 * init_std)

    def patches(self, images: torch.Tensor) -> torch.Tensor:
        """[B, H, W] -> [B, (H/p)(W/p), p*p]; [B, C, H, W] -> [B, (H/p)(W/p), C*p*p]."""
        p = self.patch
        if images.dim() == 4:
            b, c, h, w = images.shape
            x = images.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
            return x.reshape(b, (h // p) * (w // p), c * p * p)
        b, h, w = images.shape
        x = images.reshape(b, h // p, p, w // p, p).permute(0, 1, 3, 2, 4)
        return x.reshape(b, (h // p) * (w // p), p * p)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(self.patches(images))
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


class PretrainedViT(nn.Module):
    """A transformers ViT backbone (loaded by `from_pretrained`) with a `Dense` head on its
    normalised class token, fed the same images as the local ViT: [B, H, W] or [B, C, H, W] in
    [0, 1], resized (bilinear) to the checkpoint's image size, grey images repeated over its
    channels, and scaled to [-1, 1] as the image processor of Google's ViT checkpoints does."""

    def __init__(self, backbone: nn.Module, classes: int, init_std: float) -> None:
        super().__init__()
        self.vit = backbone
        self.size = int(backbone.config.image_size)
        self.channels = int(backbone.config.num_channels)
        self.head = new_head(int(backbone.config.hidden_size), classes, init_std)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images[:, None] if images.dim() == 3 else images  # [B, C, H, W]
        if x.shape[1] != self.channels:
            x = x.mean(1, keepdim=True).expand(-1, self.channels, -1, -1)
        if x.shape[-2:] != (self.size, self.size):
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        hidden = self.vit(pixel_values=(x - 0.5) / 0.5).last_hidden_state  # [B, N, D], layer-normed
        return self.head(hidden[:, 0])

    def block_linears(self) -> list[tuple[str, nn.Linear]]:
        """Every linear layer of the encoder blocks (attention q/k/v/output, MLP in/out)."""
        return [(f"vit.{name}", m) for name, m in self.vit.named_modules() if isinstance(m, nn.Linear)]


def load_pretrained(model: str, classes: int, init_std: float) -> PretrainedViT:
    """`ViTModel.from_pretrained(model)` (a folder, or a hub id already in the local Hugging Face
    cache: nothing is downloaded), its pooler dropped; eager attention, so that its saved tensors
    and flops are those of the written-out attention, as in the local ViT."""
    from transformers import ViTModel

    backbone = ViTModel.from_pretrained(model, add_pooling_layer=False, local_files_only=True,
                                        attn_implementation="eager", dtype=torch.float32)
    return PretrainedViT(backbone, classes, init_std)


def _init_dense(layer: Dense, std: float) -> None:
    nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
    nn.init.zeros_(layer.bias)


def new_head(dim: int, classes: int, init_std: float) -> Dense:
    """A fresh classifier for the fine-tuning classes, drawn from the global generator."""
    head = Dense(dim, classes)
    _init_dense(head, init_std)
    return head


def block_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """(name, layer) of the linear layers inside the blocks, the ones WASI replaces."""
    if isinstance(model, PretrainedViT):
        return model.block_linears()
    return [(f"blocks.{i}.{name}", getattr(b, name)) for i, b in enumerate(model.blocks)
            for name in ("qkv", "proj", "fc1", "fc2")]


def to_wasi(model: nn.Module, act_ranks: tuple[int, int, int], r_from: str, seed: int,
            sequential: bool = False) -> list[WASILinear]:
    """Swap every block linear for a WASILinear sharing its parameters (in place)."""
    layers = []
    for i, (name, dense) in enumerate(block_linears(model)):
        layer = WASILinear(dense.in_features, dense.out_features, dense.bias is not None, act_ranks,
                           r_from=r_from, seed=seed * 1000 + i, sequential=sequential)
        layer.weight, layer.bias = dense.weight, dense.bias
        block, attr = name.rsplit(".", 1)
        setattr(model.get_submodule(block), attr, layer)
        layers.append(layer)
    return layers


def to_dense(model: nn.Module) -> nn.Module:
    """A copy of a WASI model with every WASILinear back to a Dense holding the same W and bias:
    the vanilla model at the same weights, the twin that WASI's step is timed against."""
    twin = copy.deepcopy(model)
    for name, layer in list(twin.named_modules()):
        if isinstance(layer, WASILinear):
            dense = Dense(layer.in_features, layer.out_features, bias=layer.bias is not None)
            dense.weight, dense.bias = layer.weight, layer.bias
            parent, _, attr = name.rpartition(".")
            setattr(twin.get_submodule(parent) if parent else twin, attr, dense)
    return twin


def wasi_layers(model: nn.Module) -> list[WASILinear]:
    return [m for m in model.modules() if isinstance(m, WASILinear)]
