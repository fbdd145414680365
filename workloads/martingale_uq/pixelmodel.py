"""The image scenario's frozen generator: a tiny PixelCNN over quantized colour pixels, and its bits per dim.

PixelCNN (van den Oord et al., "Pixel Recurrent Neural Networks", 2016), the plain variant: a 7x7
masked convolution of type A, residual blocks of masked 3x3 and 1x1 convolutions of type B, and a
1x1 head with `levels` logits per sub-pixel. The masks make it autoregressive in raster order,
and within a pixel red -> green -> blue: the logits of sub-pixel (row, column, colour) see only the
rows above, the pixels to the left in its row and that pixel's earlier colours. So it gives
an exact likelihood of each image (the metric) and samples ancestrally (the generator's draws),
as GPT-2 does for a text in the paper's text setting. Its hidden channels are split into three
colour groups; the receptive field's blind spot of the plain variant is kept (small and known).

An image is [3, S, S] integer levels 0..levels-1 (8-bit values quantized by `quantize`); its
metric value is the NLL in bits per sub-pixel ("bits per dim", the standard image-likelihood
unit; with levels = 256 the usual one of the 8-bit images).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

COLOURS = 3
FORMAT = "martingale_uq.pixelcnn/1"
"""The `format` entry of a saved generator (`save`), checked by `load`."""


def quantize(pixels: torch.Tensor, levels: int) -> torch.Tensor:
    """8-bit values (uint8, any shape) -> levels 0..levels-1 (int64): v * levels // 256."""
    return pixels.long() * levels // 256


def _groups(channels: int) -> torch.Tensor:
    """The colour group of each of `channels` hidden channels: three equal blocks."""
    return torch.arange(channels) * COLOURS // channels


class MaskedConv2d(torch.nn.Conv2d):
    """A same-padded convolution that sees only earlier sub-pixels (type 'B' also the same colour
    group at the centre; type 'A' only earlier colour groups: the first layer's, so no output sees its own input)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, kind: str, in_groups: torch.Tensor,
                 out_groups: torch.Tensor) -> None:
        super().__init__(c_in, c_out, kernel, padding=kernel // 2)
        k = kernel // 2
        mask = torch.ones(c_out, c_in, kernel, kernel)
        mask[:, :, k, k + 1 :] = 0  # right of the centre in its row
        mask[:, :, k + 1 :] = 0  # rows below
        centre = in_groups[None, :] < out_groups[:, None] if kind == "A" else in_groups[None, :] <= out_groups[:, None]
        mask[:, :, k, k] = centre.float()
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight * self.mask, self.bias, padding=self.padding)


class PixelCNN(torch.nn.Module):
    def __init__(self, levels: int, hidden: int, layers: int) -> None:
        super().__init__()
        if hidden % COLOURS:
            raise ValueError(f"hidden={hidden} channels must split into {COLOURS} colour groups (a multiple of 3)")
        self.levels, self.hidden, self.layers = levels, hidden, layers
        g_in, g_hidden = torch.arange(COLOURS), _groups(hidden)
        g_out = torch.arange(COLOURS * levels) // levels  # logits laid out colour-major: [colour, level]
        self.first = MaskedConv2d(COLOURS, hidden, 7, "A", g_in, g_hidden)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.ReLU(), MaskedConv2d(hidden, hidden, 3, "B", g_hidden, g_hidden),
                                torch.nn.ReLU(), MaskedConv2d(hidden, hidden, 1, "B", g_hidden, g_hidden))
            for _ in range(layers))
        self.head = MaskedConv2d(hidden, COLOURS * levels, 1, "B", g_hidden, g_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Levels [B, 3, S, S] -> logits [B, 3, levels, S, S] of each sub-pixel given the earlier ones."""
        h = self.first(x.float() * (2.0 / (self.levels - 1)) - 1.0)  # levels to [-1, 1]
        for block in self.blocks:
            h = h + block(h)
        b, _, s, t = x.shape
        return self.head(F.relu(h)).view(b, COLOURS, self.levels, s, t)


def bits_per_dim(model: PixelCNN, x: torch.Tensor) -> torch.Tensor:
    """NLL of each image in bits per sub-pixel, [B] (differentiable: the training loss is its mean)."""
    nll = F.cross_entropy(model(x).transpose(1, 2), x, reduction="none")  # classes second; [B, 3, S, S] nats
    return nll.flatten(1).mean(1) / math.log(2.0)


@torch.no_grad()
def score(model: PixelCNN, images: torch.Tensor, batch: int, device: torch.device) -> torch.Tensor:
    """Bits per dim of every image [N, 3, S, S], in batches on `device`, [N] on the CPU."""
    return torch.cat([bits_per_dim(model, images[i : i + batch].to(device)).cpu()
                      for i in range(0, len(images), batch)])


@torch.no_grad()
def generate(model: PixelCNN, count: int, size: int, temperature: float, gen: torch.Generator, batch: int,
             device: torch.device) -> torch.Tensor:
    """[count, 3, size, size] levels sampled ancestrally (one forward pass per sub-pixel), on the CPU."""
    out = []
    for i in range(0, count, batch):
        x = torch.zeros(min(batch, count - i), COLOURS, size, size, dtype=torch.long, device=device)
        for r in range(size):
            for c in range(size):
                for colour in range(COLOURS):
                    logits = model(x[:, :, : r + 1])[:, colour, :, r, c]  # rows below are masked: leave them out
                    probs = torch.softmax(logits.float() / temperature, dim=-1)
                    x[:, colour, r, c] = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        out.append(x.cpu())
    return torch.cat(out)


def save(model: PixelCNN, path: str | Path, image_size: int) -> None:
    """The trained generator as one file: its weights and the sizes `load` rebuilds it from."""
    Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": FORMAT, "levels": model.levels, "hidden": model.hidden, "layers": model.layers,
                "image_size": image_size, "state_dict": {k: v.cpu() for k, v in model.state_dict().items()}},
               Path(path).expanduser())


def read(path: str | Path) -> dict:
    """The saved file's contents (weights only: nothing in it is executed); ValueError when it is not one."""
    try:
        saved = torch.load(Path(path).expanduser(), map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: say which and why
        raise ValueError(f"generator_path={str(path)!r} cannot be read by torch.load: {exc}") from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise ValueError(f"generator_path={str(path)!r} is not a generator saved by martingale_uq (format {FORMAT!r})")
    return saved


def load(path: str | Path) -> tuple[PixelCNN, int]:
    """(the saved generator, frozen in eval mode on the CPU, the image size it was trained at)."""
    saved = read(path)
    model = PixelCNN(int(saved["levels"]), int(saved["hidden"]), int(saved["layers"]))
    model.load_state_dict(saved["state_dict"])
    model.eval().requires_grad_(False)
    return model, int(saved["image_size"])
