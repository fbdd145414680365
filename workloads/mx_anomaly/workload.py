"""mx_anomaly: Config, the measurement loop over block sizes, and the LM it quantizes (pre-trained by
`components.lm.pretrain` and cached, or read from a celerity_lm run folder)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from kernels import mx
from components import pretrained as on_disk
from components.lm import pretrain as lm
from workloads.mx_anomaly import pretrained

LINEARS = ("qkv", "proj", "fc", "out")  # every hidden matrix; embeddings and readout stay high precision
LM_PRESETS = tuple(lm.PRESETS)  # components.lm.pretrain's recipes: celerity_lm's default and smoke sizes
DISTRIBUTIONS = ("gaussian", "laplace")
PRETRAIN_SHARE = 0.9  # progress given to pre-training the LM when the trial trains it
UE4M3_MIN_NORMAL = 2.0**-6  # below it a UE4M3 scale is subnormal: its step is 2^-9, coarse (the paper's cause)
FP4_MAX = 6.0  # E2M1's largest magnitude: a block's scale is amax / 6
BASE_SEED = 0  # the project's tiny base model is one cached build (components.basemodel: seed 0 everywhere)


MAX_WORKERS = 1
"""mx_anomaly measures on one worker: the runner refuses more."""


@dataclass(frozen=True)
class Config:
    scale_format: str = "ue4m3"
    """Block-scale format: 'e8m0' (OCP MX), 'ue4m3' (NVFP4) or 'ue5m3' (the paper's proposal)."""
    global_scale: bool = False
    """NVFP4's per-tensor FP32 scale on top of the block scales (ue4m3/ue5m3 only)."""
    block_sizes: tuple[int, ...] = (256, 128, 64, 32, 16, 8)
    """Block sizes measured, largest first (each of 8, 16, 32, 64, 128, 256)."""
    elem_format: str = "e2m1"
    """Element format: 'e2m1' (FP4) or 'e4m3' (FP8)."""
    underflow: str = "flush"
    """A block scale below the format's smallest: 'flush' to zero or 'clamp' to the smallest."""
    ue5m3_bias: int = 15
    """Exponent bias of UE5M3 (the paper's encoding is not public; 15 matches OCP E5M3)."""
    sigmas: tuple[float, ...] = (0.001, 0.005, 0.02, 1.0)
    """Standard deviations of the synthetic tensors; LLM weights sit around 0.01-0.03."""
    distribution: str = "gaussian"
    """Synthetic tensor distribution: 'gaussian' or 'laplace' (heavier tails), zero mean."""
    synthetic_rows: int = 256
    """Rows of each synthetic tensor (1024 columns, so every block size divides a row)."""
    quantize_activations: bool = True
    """Also measure W4A4: the inputs of every hidden linear layer fake-quantized too."""
    lm_checkpoint: str = ""
    """A celerity_lm run folder (with run.json) whose newest checkpoint is quantized, the model built from
    the run's config; empty: the LM pre-trained here (components.lm.pretrain)."""
    lm_preset: str = "default"
    """When pre-training the LM here: the 'default' recipe (celerity_lm's default config) or the CPU-sized
    'smoke' one (its smoke config)."""
    lm_width: int = 0
    """When pre-training the LM here: its width (0 keeps the preset's)."""
    lm_tpp: float = 0.0
    """When pre-training the LM here: tokens per parameter (0 keeps the preset's)."""
    lm_cache: bool = True
    """When pre-training the LM here: keep it in the ladder cache (`$LADDER_CACHE`, default
    ~/.cache/ladder, under lm/) keyed by its recipe, seed and code, and reuse it there: a reproduction's
    trials, one per scale format, train the same LM once (the others wait for it). False: this trial
    trains it, in its own checkpoints."""
    lm_narrow_std: float = 0.005
    """Also measure a narrowed copy of the LM: qkv and fc weights rescaled to this std, their LayerNorms
    compensating, so the function is unchanged (large LLMs' weights are this narrow; 0 skips it)."""
    base_model: str = ""
    """Also measure the project's tiny base model, unscaled: 'tiny-local' (components.basemodel's Llama,
    built here once and cached, seed 0 as every workload loads it), its weights and its held-out loss on
    its own held-out sentences and sums; metrics named 'base'. Empty skips it."""
    eval_tokens: int = 32768
    """Held-out tokens for the loss of the quantized LM."""
    hf_model: str = ""
    """A pretrained LLM measured instead of the Celerity-shaped LM (the paper's observation): any Llama or
    Qwen checkpoint loaded by transformers' AutoModelForCausalLM.from_pretrained, in float32, from a
    folder written by save_pretrained or a hub id already in the local Hugging Face cache (e.g.
    'Qwen/Qwen2.5-0.5B'); nothing is downloaded. Every linear layer but the output head is quantized;
    its metrics are named 'llm' (eval/rel_mse/llm_weights/b32, eval/llm_dloss_w4a4/b32, ...). The
    lm_* fields do not apply. Empty: the Celerity-shaped LM."""
    text_path: str = ""
    """hf_model: the held-out text of its loss, a UTF-8 text file (WikiText-2 raw's wiki.test.raw) or a
    datasets save_to_disk folder with a 'text' column; empty: celerity_lm's held-out standard-library files."""
    text_split: str = "test"
    """hf_model: the split of a saved DatasetDict at text_path."""
    hf_seq_len: int = 512
    """hf_model: tokens per held-out window (each scored from its start)."""
    seed: int = 0
    """Seed of the synthetic tensors and of the LM pre-trained here."""


def smoke() -> Config:
    """Seconds on a CPU: a barely trained smoke-size LM, three block sizes. The reproduction's
    smoke size (`sweeps/repro/mx_anomaly.py`) trains the LM longer and measures every block size."""
    return Config(block_sizes=(64, 16, 8), sigmas=(0.005, 1.0), synthetic_rows=64, lm_preset="smoke", lm_tpp=1.0,
                  eval_tokens=4096)


def validate(cfg: Config, world_size: int = 1) -> None:
    if cfg.scale_format not in mx.SCALE_FORMATS:
        raise ValueError(f"scale_format must be one of {sorted(mx.SCALE_FORMATS)}, got {cfg.scale_format!r}")
    if cfg.global_scale and cfg.scale_format == "e8m0":
        raise ValueError("global_scale applies to ue4m3/ue5m3 scales; set global_scale=false for e8m0")
    if cfg.elem_format not in mx.ELEM_FORMATS:
        raise ValueError(f"elem_format must be one of {sorted(mx.ELEM_FORMATS)}, got {cfg.elem_format!r}")
    if cfg.underflow not in mx.UNDERFLOW_MODES:
        raise ValueError(f"underflow must be one of {mx.UNDERFLOW_MODES}, got {cfg.underflow!r}")
    bad = [b for b in cfg.block_sizes if b not in mx.BLOCK_SIZES]
    if not cfg.block_sizes or bad:
        raise ValueError(f"block_sizes must be a non-empty subset of {mx.BLOCK_SIZES}, got {cfg.block_sizes}")
    if len(set(cfg.block_sizes)) != len(cfg.block_sizes):
        raise ValueError(f"block_sizes has repeats: {cfg.block_sizes}")
    if not cfg.sigmas or any(not (s > 0 and math.isfinite(s)) for s in cfg.sigmas):
        raise ValueError(f"sigmas must be positive and finite, got {cfg.sigmas}")
    if cfg.distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {cfg.distribution!r}")
    if cfg.synthetic_rows <= 0 or cfg.eval_tokens <= 0:
        raise ValueError("synthetic_rows and eval_tokens must be positive")
    if cfg.lm_preset not in LM_PRESETS:
        raise ValueError(f"lm_preset must be one of {LM_PRESETS}, got {cfg.lm_preset!r}")
    if not 1 <= cfg.ue5m3_bias <= 30:
        raise ValueError(f"ue5m3_bias must lie in 1..30, got {cfg.ue5m3_bias}")
    if cfg.lm_narrow_std < 0:
        raise ValueError(f"lm_narrow_std must be >= 0 (0 skips the narrowed LM), got {cfg.lm_narrow_std}")
    if cfg.base_model:
        from components.basemodel import parse_tiny

        try:
            if parse_tiny(cfg.base_model) is None:
                raise ValueError("only the project's own 'tiny-local[:key=value,...]' is measured here; a hub LLM "
                                 "goes in hf_model")
        except ValueError as exc:
            raise ValueError(f"base_model={cfg.base_model!r}: {exc}") from None
    if cfg.hf_seq_len < 2:
        raise ValueError(f"hf_seq_len must be >= 2, got {cfg.hf_seq_len}")
    if cfg.hf_model:
        if cfg.lm_checkpoint:
            raise ValueError("hf_model and lm_checkpoint both name the model to quantize: set one")
    elif cfg.lm_checkpoint:
        try:
            lm.run_checkpoint(cfg.lm_checkpoint)  # run.json, a celerity_lm config, a checkpoint file
        except ValueError as exc:
            raise ValueError(f"lm_checkpoint: {exc}") from None
    else:
        try:
            lm_recipe(cfg).check()
        except ValueError as exc:
            raise ValueError(f"the LM pre-trained here (lm_preset={cfg.lm_preset!r}, lm_width={cfg.lm_width}, "
                             f"lm_tpp={cfg.lm_tpp:g}): {exc}") from None


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it. hf_model: the model is a folder or a cached hub id with
    its tokenizer, and text_path reads (every problem in one error). lm_checkpoint: the data of its
    run, whose held-out part the quantized LM's loss is measured on, reads here."""
    if cfg.lm_checkpoint and not cfg.hf_model:
        from components.lm.corpus import check_data

        try:
            recipe, _ = lm.run_checkpoint(cfg.lm_checkpoint)
            check_data(recipe.data)
        except ValueError as exc:
            raise ValueError(f"lm_checkpoint: {exc}") from None
    if not cfg.hf_model:
        return
    problems = []
    found = on_disk.model_config(cfg.hf_model)
    if not found:
        problems.append(f"hf_model={cfg.hf_model!r} is neither a folder with config.json nor in the local Hugging Face "
                        f"cache (nothing is downloaded at run time): expected {pretrained.MODEL_SOURCES}")
    elif not any((Path(found).parent / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        problems.append(f"hf_model={cfg.hf_model!r} has no tokenizer beside its config.json: save it there with save_pretrained")
    if cfg.text_path:
        try:
            on_disk.check_text(cfg.text_path, cfg.text_split, pretrained.TEXT_SOURCES)
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        raise ValueError("; ".join(problems))


def linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The hidden matrices quantized: the GPT's LINEARS per block, or a pretrained LLM's linears."""
    if isinstance(model, pretrained.CausalLM):
        return model.linears()
    return [getattr(block, name) for block in model.blocks for name in LINEARS]


def quant_options(cfg: Config, block_size: int) -> dict[str, Any]:
    scale = mx.ue5m3(bias=cfg.ue5m3_bias) if cfg.scale_format == "ue5m3" else cfg.scale_format
    return dict(block_size=block_size, scale_format=scale, elem_format=cfg.elem_format,
                global_scale=cfg.global_scale, underflow=cfg.underflow)


def sigma_key(sigma: float) -> str:
    return f"s{sigma:g}"


def rel_mse(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Quantization error power over signal power."""
    x, x_hat = x.double(), x_hat.double()
    return float(((x_hat - x) ** 2).sum() / (x**2).sum().clamp_min(1e-300))


def synthetic(cfg: Config, sigma: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + int(round(sigma * 1e6)))
    shape = (cfg.synthetic_rows, 1024)
    if cfg.distribution == "gaussian":
        return sigma * torch.randn(shape, generator=g)
    u = torch.rand(shape, generator=g) - 0.5  # Laplace by inverse CDF, std sigma
    return -sigma / math.sqrt(2) * torch.sign(u) * torch.log1p(-2 * u.abs())


# --- the language model ------------------------------------------------------------------------


def lm_recipe(cfg: Config) -> lm.LMRecipe:
    """The recipe of the LM pre-trained here: the preset's, with lm_width and lm_tpp when set."""
    changes: dict[str, Any] = {}
    if cfg.lm_width:
        changes["width"] = cfg.lm_width
    if cfg.lm_tpp:
        changes["tpp"] = cfg.lm_tpp
    return dataclasses.replace(lm.PRESETS[cfg.lm_preset], **changes)


def load_lm(folder: str, device: Any = "cpu") -> tuple[torch.nn.Module, lm.LMRecipe]:
    """The LM of a celerity_lm run folder's newest checkpoint, and the recipe of the run's config."""
    try:
        return lm.load_run(folder, device)
    except ValueError as exc:
        raise ValueError(f"lm_checkpoint: {exc}") from None


def trained_lm(cfg: Config, recipe: lm.LMRecipe, run, state: dict[str, Any] | None) -> tuple[torch.nn.Module, int, float]:
    """The LM pre-trained from cfg.seed, its last step and its held-out loss. With lm_cache it is the
    cached one: trained once, by whichever trial asks first (the others wait, then read it and report
    its loss once); without, this trial trains it, its checkpoints the trial's, so that a restarted
    trial continues it. While it trains here its train/loss is the trial's, its held-out loss
    eval/lm_loss, its progress PRETRAIN_SHARE of the trial's."""
    reported: list[int] = []

    def report(metrics: dict[str, float], step: int) -> None:
        reported.append(step)
        out = {"progress": PRETRAIN_SHARE * metrics["progress"]}
        if "train/loss" in metrics:
            out["train/loss"] = metrics["train/loss"]
        if "eval/loss" in metrics:
            out["eval/lm_loss"] = metrics["eval/loss"]
        run.report(out, step=step)

    if cfg.lm_cache:
        model, meta = lm.pretrained_lm(recipe, cfg.seed, device=run.device, report=report)
        if not reported:  # read from the cache
            run.report({"progress": PRETRAIN_SHARE, "eval/lm_loss": meta["eval_loss"]}, step=meta["step"])
    else:
        resumed = state["pretrain"] if state is not None and state.get("phase") == "pretrain" else None
        model, meta = lm.pretrain(recipe, cfg.seed, device=run.device, report=report, state=resumed,
                                  save=lambda s: run.save({"step": s["step"], "phase": "pretrain", "pretrain": s}))
    return model, int(meta["step"]), float(meta["eval_loss"])


class ActivationQuant:
    """Forward pre-hooks that fake-quantize every hidden linear layer's input and total the error."""

    def __init__(self, model: torch.nn.Module, opts: dict[str, Any]) -> None:
        self.err = self.power = 0.0
        self.handles = [layer.register_forward_pre_hook(self._hook) for layer in linears(model)]
        self.opts = opts

    def _hook(self, module, args):
        x = args[0]
        q = mx.fake_quant(x, **self.opts)
        self.err += float(((q.double() - x.double()) ** 2).sum())
        self.power += float((x.double() ** 2).sum())
        return (q,)

    def remove(self) -> float:
        for h in self.handles:
            h.remove()
        return self.err / max(self.power, 1e-300)


def narrowed(model: torch.nn.Module, std: float) -> torch.nn.Module:
    """A copy of `model` whose LayerNorm-fed matrices (qkv, fc) have weight std `std`: a LayerNorm's
    gain and shift are divided by the factor its following matrix is multiplied by, so the network
    computes the same function with the narrow weights of a large LLM."""
    import copy

    out = copy.deepcopy(model)
    with torch.no_grad():
        for block in out.blocks:
            for norm, lin in ((block.ln1, block.qkv), (block.ln2, block.fc)):
                c = std / float(lin.weight.std())
                lin.weight.mul_(c)
                norm.weight.div_(c)
                norm.bias.div_(c)
    return out


def base_lm(cfg: Config, device: Any) -> tuple[torch.nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    """tiny-local (components.basemodel, built once and cached) as the measurements see an LM, and its
    held-out batches: the held-out phrasing's sentences and the held-out sums, `<bos> text <eos>` packed."""
    from components.basemodel import base_world, load_base
    from components.lm.corpus import heldout_batches

    hf, tokenizer = load_base(cfg.base_model, seed=BASE_SEED, dtype=torch.float32)
    world = base_world(cfg.base_model, seed=BASE_SEED)
    examples = world.sentences("heldout") + world.arithmetic("heldout")
    ids = np.asarray([t for e in examples for t in tokenizer(e.text).input_ids + [tokenizer.eos_token_id]], dtype=np.int64)
    seq_len = 64  # tiny-local's training row length
    return pretrained.CausalLM(hf).to(device).eval(), heldout_batches(ids, seq_len, cfg.eval_tokens, batch=32)


def subnormal_share(w: torch.Tensor, block_size: int) -> float:
    """Share of a matrix's blocks (along its rows, a partial last block from the elements present, as
    `kernels.mx` does) whose UE4M3 scale amax/6 without a global scale is subnormal or underflows:
    the regime the paper blames for the anomaly."""
    x = w.detach().float().reshape(-1, w.shape[-1]).abs()
    nb = -(-x.shape[-1] // block_size)
    amax = F.pad(x, (0, nb * block_size - x.shape[-1])).view(x.shape[0], nb, block_size).amax(-1)  # [R, nb]
    return float((amax / FP4_MAX < UE4M3_MIN_NORMAL).double().mean())


def heldout_loss(model: torch.nn.Module, batches, device) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in batches:
            logits = model(x.to(device))
            total += F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten(), reduction="sum").item()
            count += y.numel()
    return total / count


def measure_block(cfg: Config, block_size: int, models: dict[str, Any], batches, device,
                  loss_fp: float, others: dict[str, tuple[Any, Any, float]] | None = None) -> dict[str, float]:
    """Every metric of one block size (this trial's scale format); `others` are LMs with held-out
    batches and a full-precision loss of their own, name -> (model, batches, loss_fp)."""
    opts = quant_options(cfg, block_size)
    b = f"b{block_size}"
    out: dict[str, float] = {}
    for sigma in cfg.sigmas:
        x = synthetic(cfg, sigma)
        out[f"eval/rel_mse/{sigma_key(sigma)}/{b}"] = rel_mse(x, mx.fake_quant(x, **opts))
    for name, model in models.items():
        out.update(measure_lm(cfg, opts, name, model, batches, device, loss_fp, b))
    for name, (model, own_batches, own_fp) in (others or {}).items():
        out.update(measure_lm(cfg, opts, name, model, own_batches, device, own_fp, b))
    return out


def measure_lm(cfg: Config, opts: dict[str, Any], name: str, model, batches, device, loss_fp: float,
               b: str) -> dict[str, float]:
    """Weight and activation error of one LM and its held-out loss increase, weights quantized in place
    and restored afterwards."""
    out: dict[str, float] = {}
    originals = []
    errors = []
    layers = linears(model)
    with torch.no_grad():
        for layer in layers:
            w = layer.weight
            originals.append(w.detach().to("cpu", copy=True))  # kept off the device: an LLM's weights twice may not fit
            w_hat = mx.fake_quant(w, **opts)
            errors.append(rel_mse(w, w_hat))
            w.copy_(w_hat)
    # Each matrix counts alike: pooled power would let the widest matrices hide the narrow ones.
    out[f"eval/rel_mse/{name}_weights/{b}"] = sum(errors) / len(errors)
    shares = [subnormal_share(w, opts["block_size"]) for w in originals]
    out[f"eval/ue4m3_subnormal/{name}_weights/{b}"] = sum(shares) / len(shares)
    try:
        out[f"eval/{name}_dloss_w4/{b}"] = heldout_loss(model, batches, device) - loss_fp
        if cfg.quantize_activations:
            hooks = ActivationQuant(model, opts)
            try:
                out[f"eval/{name}_dloss_w4a4/{b}"] = heldout_loss(model, batches, device) - loss_fp
            finally:
                out[f"eval/rel_mse/{name}_acts/{b}"] = hooks.remove()
    finally:
        with torch.no_grad():
            for layer, w in zip(layers, originals):
                layer.weight.copy_(w)
    return out


def weight_std(model) -> float:
    ws = torch.cat([layer.weight.detach().flatten().cpu() for layer in linears(model)])
    return float(ws.std())


def train(cfg: Config, run) -> dict[str, float]:
    from components.lm.corpus import heldout_batches, load_data

    validate(cfg, run.world_size)
    if cfg.hf_model:
        return _train_pretrained(cfg, run)
    state = run.restore()
    results: dict[str, float] = {}
    step = 0
    share = 0.0 if cfg.lm_checkpoint else PRETRAIN_SHARE
    model = None
    if cfg.lm_checkpoint:
        model, recipe = load_lm(cfg.lm_checkpoint, run.device)
    else:
        recipe = lm_recipe(cfg)
    if state is not None and state.get("phase") == "quant":  # the LM measured is in the checkpoint
        model = lm.build_model(recipe)
        model.load_state_dict(state["lm"])
        results, step = dict(state["results"]), int(state["step"])
    elif model is None:
        model, step, results["eval/lm_loss_trained"] = trained_lm(cfg, recipe, run, state)
    model = model.to(run.device).eval()
    _, held = load_data(recipe.data, heldout_frac=recipe.heldout_frac, max_bytes=recipe.max_bytes)
    batches = heldout_batches(held, recipe.seq_len, cfg.eval_tokens, batch=32)
    loss_fp = heldout_loss(model, batches, run.device)
    results.update({"eval/lm_loss_fp": loss_fp, "eval/lm_weight_std": weight_std(model)})
    models = {"lm": model}
    if cfg.lm_narrow_std > 0:
        models["lm_narrow"] = narrowed(model, cfg.lm_narrow_std)
        # The narrowing must not change the function; measured, not assumed.
        results["eval/lm_narrow_loss_change"] = heldout_loss(models["lm_narrow"], batches, run.device) - loss_fp
    others = {}
    if cfg.base_model:  # reloaded from the cache on a restart: its weights are not in the checkpoint
        base, base_batches = base_lm(cfg, run.device)
        base_fp = heldout_loss(base, base_batches, run.device)
        results.update({"eval/base_loss_fp": base_fp, "eval/base_weight_std": weight_std(base)})
        others["base"] = (base, base_batches, base_fp)

    return _measure_blocks(cfg, run, models, batches, loss_fp, results, step, share, "lm", others=others)


def _measure_blocks(cfg: Config, run, models: dict[str, Any], batches, loss_fp: float, results: dict[str, float],
                    step: int, share: float, name: str, extra_state: dict[str, Any] | None = None,
                    others: dict[str, tuple[Any, Any, float]] | None = None) -> dict[str, float]:
    """Every block size not yet measured (a restarted trial skips those in `results`), a report and
    a checkpoint after each."""
    model = models[name]
    extra_state = {"lm": model.state_dict()} if extra_state is None else extra_state
    done = {int(k.rsplit("/b", 1)[1]) for k in results if k.startswith(f"eval/rel_mse/{name}_weights/")}
    todo = [b for b in cfg.block_sizes if b not in done]
    for i, block_size in enumerate(cfg.block_sizes):
        if block_size not in todo:
            continue
        step += 1
        metrics = measure_block(cfg, block_size, models, batches, run.device, loss_fp, others)
        results.update(metrics)
        progress = share + (1 - share) * (i + 1) / len(cfg.block_sizes)
        loss_key = f"eval/{name}_dloss_w4a4/b{block_size}" if cfg.quantize_activations else f"eval/{name}_dloss_w4/b{block_size}"
        # train/loss here is the quantized model's held-out loss: what this trial optimizes for.
        run.report({**metrics, "train/loss": loss_fp + metrics[loss_key], "eval/block_size": float(block_size),
                    "progress": min(1.0, progress)}, step=step)
        run.save({"step": step, "phase": "quant", "results": results, **extra_state})
    return {k: float(v) for k, v in results.items()}


def _train_pretrained(cfg: Config, run) -> dict[str, float]:
    """The pretrained LLM's weights and activations: nothing is trained; a restarted trial reloads
    the model and skips the block sizes already measured."""
    from components.lm.corpus import heldout_batches

    state = run.restore()
    results = dict(state["results"]) if state is not None else {}
    device = torch.device(run.device)
    model, tokenizer = pretrained.load(cfg.hf_model, device)
    ids = pretrained.token_ids(tokenizer, pretrained.read_text(cfg.text_path, cfg.text_split),
                               2 * cfg.eval_tokens + cfg.hf_seq_len + 1)
    batches = heldout_batches(ids, cfg.hf_seq_len, cfg.eval_tokens, batch=8)
    loss_fp = heldout_loss(model, batches, device)
    results.update({"eval/llm_loss_fp": loss_fp, "eval/llm_weight_std": weight_std(model)})
    step = int(state["step"]) if state is not None else 0
    # A checkpoint holds the measurements only: the weights are hf_model's, reloaded on a restart.
    return _measure_blocks(cfg, run, {"llm": model}, batches, loss_fp, results, step, 0.0, "llm", extra_state={})
