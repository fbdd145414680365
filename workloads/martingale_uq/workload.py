"""martingale_uq: Config, fitting the frozen generator, and the coverage loop (see the package docstring)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from components import pretrained

from orchestrator.run import devices
from workloads.martingale_uq import bytemodel, imagedata, pixelmodel, tabular, textlm, tinygpt2
from workloads.martingale_uq.coverage import evaluate_chunk, summarize

METRICS = {"gmm": ("alert_rate", "mean_score"), "bytes": ("nll", "alert_rate"), "causal_lm": ("nll", "alert_rate"),
           "tiny_gpt2": ("nll", "alert_rate"), "pixels": ("nll", "alert_rate")}


MAX_WORKERS = 1
"""martingale_uq runs on one worker: the runner refuses more."""


@dataclass(frozen=True)
class Config:
    generator: Literal["gmm", "bytes", "causal_lm", "tiny_gpt2", "pixels"] = "gmm"
    """Frozen generator Q: 'gmm' (a Gaussian mixture fitted on historical tabular records),
    'bytes' (a tiny autoregressive byte model trained on the standard-library corpus),
    'causal_lm' (the pretrained LM `model`, e.g. GPT-2, frozen as loaded, on the texts of `text_path`),
    'tiny_gpt2' (the paper's text setting at smoke size: a small GPT2LMHeadModel trained here on the
    standard-library corpus, cached per seed, scoring held-out files' texts and its own) or
    'pixels' (a small PixelCNN trained on the images of `generator_data`, or loaded from `generator_path`,
    on the images of `image_data`: CIFAR-10, SVHN)."""
    metric: Literal["alert_rate", "mean_score", "nll"] = "alert_rate"
    """Deployed metric theta = E[h(x)]: gmm: 'alert_rate' (h = 1{score > threshold}) or 'mean_score';
    bytes: 'nll' (NLL per byte of a text) or 'alert_rate' (h = 1{NLL per byte > nll_threshold});
    causal_lm and tiny_gpt2: the same per token; pixels: the same in bits per dim of an image."""
    ns: tuple[int, ...] = (5, 10, 20, 50, 100)
    """Real sample sizes n at which coverage is measured (the plot's x axis)."""
    repetitions: int = 1000
    """Repetitions per n: each draws n fresh deployed samples and builds every interval."""
    draws: int = 500
    """B: posterior (and bootstrap) draws per repetition."""
    level: float = 0.9
    """Nominal level of the equal-tailed intervals (0.9: the empirical 5% and 95% quantiles)."""
    alpha_rule: Literal["minimax", "fixed"] = "minimax"
    """'minimax': alpha = clip(sigma^2 / Delta^2, alpha_min, alpha_max) per repetition with
    Delta = |theta(Q) - zbar| + alpha_c sigma / sqrt(n), sigma from the real samples (the notes
    do not say whose sigma; reconstructed); 'fixed': alpha = `alpha`."""
    alpha: float = 10.0
    """The prior strength with alpha_rule='fixed' (must lie in [alpha_min, alpha_max])."""
    alpha_c: float = 1.64
    """c in Delta's pad c sigma / sqrt(n) (1.64 in the released tabular experiment, 1.0 in the text one)."""
    alpha_min: float = 5.0
    """Lower clip of alpha (the released code's 5)."""
    alpha_max: float = 200.0
    """Upper clip of alpha (the released code's 200)."""
    alpha_holdout: int = 0
    """0: alpha from each repetition's n samples; > 0: from this many other deployed samples drawn
    per repetition (the released text experiment's 150 held-out texts; extra real data)."""
    dp_tol: float = 1e-3
    """Exact draw: stick-breaking of G_0 ~ DP(alpha, Q) stops once the expected mass left is below
    this; the rest is one moment-matched term (truncation choice ours)."""
    horizon: int = 120
    """M: forward-urn steps for the horizon metric (the metric over the n samples and the next M
    deployed ones; 120 as in the released text experiment); 0 skips it."""
    prior_draws: int = 20_000
    """Generator draws whose metric values stand for Q (theta(Q) and every draw from Q)."""
    chunk: int = 25
    """Repetitions drawn together (vectorized, one RNG stream each); a report follows each."""
    checkpoint_every: int = 4
    """Save a checkpoint every this many chunks, at the end of every n and after the fit."""
    # --- tabular scenario (generator='gmm') ---
    dim: int = 2
    """Record dimension d; the deployed scorer is s(x) = w.x, w = (1, ..., 1) / sqrt(d)."""
    risky_share: float = 0.03
    """Share pi of the risky segment N(m w, r^2 I) in both the deployed and the historical records."""
    risky_offset: float = 2.0
    """m: the risky segment's mean score."""
    risky_sd: float = 0.5
    """r: the risky segment's score sd."""
    shift: float = 0.3
    """Historical bulk N(shift w, I) vs deployed N(0, I): the prior's misspecification in score sd
    units (+0.3: it over-states alerts and the mean score, as the notes' N(0.3, 1) prior)."""
    threshold: float = 2.0
    """Alert threshold on the score (deployed alert rate 3.7% with the defaults, historical 5.8%)."""
    history: int = 4000
    """Historical records the GMM is fitted on."""
    components: int = 3
    """GMM components (full covariances)."""
    em_iters: int = 60
    """EM iterations (each one a reported step with train/loss = NLL per record)."""
    # --- text scenario (generator='bytes') ---
    context: int = 8
    """Byte model: bytes of context per prediction."""
    embed: int = 16
    """Byte model: embedding width per context byte."""
    hidden: int = 128
    """Byte model: hidden units."""
    byte_steps: int = 600
    """Byte model: Adam steps."""
    byte_batch: int = 512
    """Byte model: predictions per step (random corpus positions)."""
    lr: float = 3e-3
    """Byte model and PixelCNN (generator='pixels'): Adam learning rate."""
    text_len: int = 64
    """Bytes per text (a text starts a line); tokens per text with generator='causal_lm'."""
    real_texts: int = 2000
    """Deployed texts in the population (held-out files); theta(F) is their mean metric."""
    temperature: float = 1.0
    """Sampling temperature of the generator's texts (or images)."""
    nll_threshold: float = 3.0
    """Alert threshold for metric='alert_rate': NLL per byte with the byte model, per token with
    causal_lm, bits per dim with pixels."""
    corpus_bytes: int = 1_000_000
    """Bytes read from the corpus (training part; the held-out part gets heldout_frac of it)."""
    heldout_frac: float = 0.25
    """Share of corpus files held out as the deployed distribution."""
    # --- tiny GPT-2 text scenario (generator='tiny_gpt2'; corpus_bytes, heldout_frac, lr, text_len too) ---
    gpt2_layers: int = 2
    """Tiny GPT-2: transformer blocks."""
    gpt2_hidden: int = 32
    """Tiny GPT-2: embedding width (a multiple of gpt2_heads)."""
    gpt2_heads: int = 2
    """Tiny GPT-2: attention heads."""
    gpt2_vocab: int = 512
    """Tiny GPT-2: byte-level BPE vocabulary (the 256 bytes, the end-of-text token, merges)."""
    gpt2_steps: int = 300
    """Tiny GPT-2: Adam steps on windows of text_len tokens after the start token."""
    gpt2_batch: int = 16
    """Tiny GPT-2: windows per step."""
    # --- pretrained-LM text scenario (generator='causal_lm') ---
    model: str = ""
    """generator='causal_lm': the frozen LM, loaded by transformers' AutoModelForCausalLM.from_pretrained
    with its tokenizer: a folder written by save_pretrained or a hub id already in the local Hugging
    Face cache ('gpt2', the paper's); nothing is downloaded. Its train/loss is its mean NLL per token
    of the deployed texts (nothing is fitted)."""
    text_path: str = ""
    """generator='causal_lm': the deployed texts: a UTF-8 text file (WikiText-2 raw's wiki.test.raw)
    or a datasets save_to_disk folder with a 'text' column, cut into windows of text_len tokens."""
    text_split: str = "test"
    """generator='causal_lm': the split of a saved DatasetDict at text_path (WikiText-2's 'test')."""
    lm_batch: int = 64
    """generator='causal_lm' or 'pixels': texts or images generated or scored per forward pass."""
    # --- image scenario (generator='pixels') ---
    image_data: str = ""
    """generator='pixels': the deployed images: a datasets save_to_disk folder (CIFAR-10 from
    uoft-cs/cifar10, SVHN from ufldl-stanford/svhn 'cropped_digits') or a folder datasets.load_dataset
    reads (an imagefolder); nothing is downloaded."""
    image_split: str = "test"
    """generator='pixels': the split of image_data's DatasetDict that holds the deployed images."""
    image_column: str = ""
    """generator='pixels': image_data's image column ('' finds it: the one column of the Image
    feature type, else 'img' (CIFAR-10) or 'image' (SVHN, an imagefolder))."""
    real_images: int = 1000
    """generator='pixels': deployed images in the population (drawn at random from image_split);
    theta(F) is their mean metric."""
    generator_data: str = ""
    """generator='pixels': the images the PixelCNN is trained on, in image_data's formats ('' reads
    image_data: its generator_split)."""
    generator_split: str = "train"
    """generator='pixels': the split of generator_data's DatasetDict the PixelCNN is trained on."""
    generator_column: str = ""
    """generator='pixels': generator_data's image column ('' finds it, as for image_column)."""
    image_size: int = 32
    """generator='pixels': images are centre-cropped to a square and resized to image_size x
    image_size (CIFAR-10 and SVHN are 32 x 32 already)."""
    image_levels: int = 256
    """generator='pixels': levels per colour value (256: the 8-bit values themselves; fewer
    quantize them, v * levels // 256)."""
    pixel_hidden: int = 96
    """PixelCNN: hidden channels (a multiple of 3: one group per colour)."""
    pixel_layers: int = 6
    """PixelCNN: residual blocks of masked 3x3 and 1x1 convolutions after the 7x7 first layer."""
    pixel_steps: int = 20_000
    """PixelCNN: Adam steps on its bits per dim of the training images (train/loss, every log_every steps)."""
    pixel_batch: int = 64
    """PixelCNN: training images per step (drawn at random)."""
    generator_path: str = ""
    """generator='pixels': a PixelCNN saved by an earlier trial's generator_save, loaded and frozen
    instead of training one (its train/loss is then its bits per dim of the deployed images); ''
    trains it on generator_data."""
    generator_save: str = ""
    """generator='pixels': write the trained PixelCNN to this file, for generator_path ('' does not; a
    relative path is the trial's own folder's)."""
    # --- run ---
    log_every: int = 10
    """Report every this many fitting steps (the coverage loop reports after every chunk)."""
    threads: int = 1
    """Intra-op CPU threads of the trial, pinned by the runner around `train` (0 leaves torch's setting)."""
    seed: int = 0
    """Seed of the historical records / training batches, the generator's draws, the deployed
    samples and every posterior and bootstrap draw."""


def smoke() -> Config:
    """A CPU-sized run: GMM prior, n in {5, 20}, 40 repetitions of 200 draws, well under a second."""
    return Config(ns=(5, 20), repetitions=40, draws=200, chunk=10, checkpoint_every=2, horizon=20,
                  prior_draws=5000, history=2000, em_iters=20, log_every=5)


def fit_steps(cfg: Config) -> int:
    if cfg.generator == "pixels":
        return 0 if cfg.generator_path else cfg.pixel_steps
    return {"gmm": cfg.em_iters, "bytes": cfg.byte_steps, "tiny_gpt2": cfg.gpt2_steps}.get(cfg.generator, 0)


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no data: raised before anything is launched."""
    if cfg.generator not in METRICS:
        raise ValueError(f"generator must be 'gmm', 'bytes', 'causal_lm', 'tiny_gpt2' or 'pixels', got {cfg.generator!r}")
    if cfg.metric not in METRICS[cfg.generator]:
        raise ValueError(f"metric {cfg.metric!r} is not defined for generator={cfg.generator!r}: use one of {', '.join(METRICS[cfg.generator])}")
    if not cfg.ns:
        raise ValueError("ns is empty: give at least one real sample size, e.g. ns=(20,)")
    if any(n < 1 for n in cfg.ns):
        raise ValueError(f"every sample size in ns must be >= 1 (n < 1 has no real data), got {cfg.ns}")
    if len(set(cfg.ns)) != len(cfg.ns):
        raise ValueError(f"ns repeats a sample size: {cfg.ns}")
    for name in ("repetitions", "chunk", "checkpoint_every", "log_every", "history", "components", "em_iters", "dim", "context",
                 "embed", "hidden", "byte_steps", "byte_batch", "text_len", "real_texts", "lm_batch", "real_images",
                 "pixel_hidden", "pixel_steps", "pixel_batch", "gpt2_layers", "gpt2_hidden", "gpt2_heads", "gpt2_steps",
                 "gpt2_batch"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.draws < 20:
        raise ValueError(f"draws={cfg.draws} is too few for the interval's quantiles: use draws >= 20")
    if cfg.prior_draws < 100:
        raise ValueError(f"prior_draws={cfg.prior_draws} is too few to stand for the generator: use >= 100")
    if not 0 < cfg.level < 1:
        raise ValueError(f"level must lie in (0, 1), got {cfg.level}")
    if cfg.alpha_rule not in ("minimax", "fixed"):
        raise ValueError(f"alpha_rule must be 'minimax' or 'fixed', got {cfg.alpha_rule!r}")
    if not 0 < cfg.alpha_min <= cfg.alpha_max or not math.isfinite(cfg.alpha_max):
        raise ValueError(f"alpha range [{cfg.alpha_min}, {cfg.alpha_max}] is invalid: need 0 < alpha_min <= alpha_max < inf")
    if cfg.alpha_rule == "fixed" and not cfg.alpha_min <= cfg.alpha <= cfg.alpha_max:
        raise ValueError(f"alpha={cfg.alpha} lies outside [alpha_min, alpha_max] = [{cfg.alpha_min}, {cfg.alpha_max}]: "
                         "choose alpha inside the range or widen it")
    if cfg.alpha_c < 0:
        raise ValueError(f"alpha_c must be >= 0, got {cfg.alpha_c}")
    if cfg.alpha_holdout < 0 or cfg.alpha_holdout == 1:
        raise ValueError(f"alpha_holdout must be 0 (use the trial's samples) or >= 2 (sigma needs two), got {cfg.alpha_holdout}")
    if not 0 < cfg.dp_tol < 0.5:
        raise ValueError(f"dp_tol must lie in (0, 0.5), got {cfg.dp_tol}")
    if cfg.horizon < 0:
        raise ValueError(f"horizon must be >= 0 (0 skips the forward urn), got {cfg.horizon}")
    if cfg.threads < 0:
        raise ValueError(f"threads must be >= 0 (0: torch's own setting), got {cfg.threads}")
    if cfg.generator == "gmm":
        if not 0 < cfg.risky_share < 1 or not cfg.risky_sd > 0:
            raise ValueError(f"risky_share must lie in (0, 1) and risky_sd be positive, got {cfg.risky_share}, {cfg.risky_sd}")
        if cfg.history < 10 * cfg.components:
            raise ValueError(f"history={cfg.history} records are too few for {cfg.components} components: use >= {10 * cfg.components}")
    else:
        need = max(cfg.ns) + cfg.horizon + cfg.alpha_holdout
        pool, what = ("real_images", "images") if cfg.generator == "pixels" else ("real_texts", "texts")
        if getattr(cfg, pool) < need:
            raise ValueError(f"{pool}={getattr(cfg, pool)} cannot supply max(ns) + horizon + alpha_holdout = {need} distinct "
                             f"{what} per repetition: raise {pool} or lower them")
        if not cfg.temperature > 0 or not cfg.lr > 0:
            raise ValueError(f"temperature and lr must be positive, got {cfg.temperature}, {cfg.lr}")
        if cfg.generator == "pixels":
            _validate_pixels(cfg)
            return
        if cfg.generator == "causal_lm":
            if not cfg.model or not cfg.text_path:
                raise ValueError(f"generator='causal_lm' needs model (e.g. 'gpt2') and text_path (WikiText-2 raw), got "
                                 f"model={cfg.model!r}, text_path={cfg.text_path!r}")
            return
        if cfg.generator == "tiny_gpt2" and (cfg.gpt2_hidden % cfg.gpt2_heads or cfg.gpt2_vocab < 258):
            raise ValueError(f"gpt2_hidden={cfg.gpt2_hidden} must be a multiple of gpt2_heads={cfg.gpt2_heads}, and "
                             f"gpt2_vocab={cfg.gpt2_vocab} >= 258 (the 256 bytes, the end-of-text token and a merge)")
        if not 0 < cfg.heldout_frac < 1 or cfg.corpus_bytes < 10_000:
            raise ValueError(f"heldout_frac must lie in (0, 1) and corpus_bytes be >= 10000, got {cfg.heldout_frac}, {cfg.corpus_bytes}")


def _validate_pixels(cfg: Config) -> None:
    if not cfg.image_data:
        raise ValueError("generator='pixels' needs image_data: the deployed images (a datasets save_to_disk folder of "
                         "CIFAR-10 or SVHN, or an imagefolder)")
    if cfg.image_size < 2:
        raise ValueError(f"image_size must be >= 2 pixels, got {cfg.image_size}")
    if not 2 <= cfg.image_levels <= 256:
        raise ValueError(f"image_levels must lie in [2, 256] (levels of an 8-bit value), got {cfg.image_levels}")
    if cfg.pixel_hidden % pixelmodel.COLOURS:
        raise ValueError(f"pixel_hidden={cfg.pixel_hidden} must be a multiple of 3 (one channel group per colour)")
    if cfg.pixel_layers < 0:
        raise ValueError(f"pixel_layers must be >= 0, got {cfg.pixel_layers}")
    if cfg.generator_path and cfg.generator_save:
        raise ValueError("generator_save is for a trained PixelCNN, but generator_path loads one: set one of them")


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it: generator='causal_lm': the model is a folder or a cached
    hub id with a tokenizer and room for a text, and text_path reads; generator='pixels': the image
    datasets read, with their splits and image columns, and generator_path is a saved PixelCNN of
    the config's sizes. Every problem in one error."""
    if cfg.generator == "pixels":
        problems = imagedata.problems(cfg)
        if problems:
            raise ValueError("; ".join(problems))
        return
    if cfg.generator != "causal_lm":
        return
    import json
    from pathlib import Path

    problems = []
    found = pretrained.model_config(cfg.model)
    if not found:
        problems.append(f"model={cfg.model!r} is neither a folder with config.json nor in the local Hugging Face cache "
                        f"(nothing is downloaded at run time): expected {textlm.MODEL_SOURCES}")
    else:
        config = json.loads(Path(found).read_text())
        room = config.get("n_positions") or config.get("max_position_embeddings")
        if room and cfg.text_len + 1 > int(room):
            problems.append(f"text_len={cfg.text_len} tokens (+1 start token) exceed model={cfg.model!r}'s {room} positions")
        folder = Path(found).parent
        if not any((folder / f).is_file() for f in ("tokenizer.json", "vocab.json", "tokenizer.model", "tokenizer_config.json")):
            problems.append(f"model={cfg.model!r} has no tokenizer files beside its config.json: save the tokenizer "
                            "with save_pretrained into the same folder")
    try:
        pretrained.check_text(cfg.text_path, cfg.text_split, textlm.TEXT_SOURCES)
    except ValueError as exc:
        problems.append(str(exc))
    if problems:
        raise ValueError("; ".join(problems))


def _fit_gmm(cfg: Config, run) -> dict[str, Any]:
    """EM on historical records, then the prior's metric values; the deployed truth in closed form."""
    world = tabular.World(cfg.dim, cfg.risky_share, cfg.risky_offset, cfg.risky_sd, cfg.shift)
    x = torch.from_numpy(world.sample(np.random.default_rng([cfg.seed, 101]), cfg.history, historical=True))
    gen = torch.Generator().manual_seed(cfg.seed)
    params = tabular.gmm_init(x, cfg.components, gen)
    for it in range(1, cfg.em_iters + 1):
        params, nll = tabular.em_step(params, x)
        if it % cfg.log_every == 0 or it == cfg.em_iters:
            run.report({"train/loss": nll, "progress": it / (cfg.em_iters + len(cfg.ns) * cfg.repetitions)}, step=it)
    prior_scores = world.score(tabular.gmm_sample(params, cfg.prior_draws, gen).numpy())
    return {"fit_loss": nll, "prior": torch.from_numpy(tabular.metric_values(prior_scores, cfg.metric, cfg.threshold)),
            "real": torch.empty(0), "theta_true": world.true_metric(cfg.metric, cfg.threshold)}


def _fit_bytes(cfg: Config, run) -> dict[str, Any]:
    """Adam on next-byte prediction, then the metric values of generated and of held-out texts."""
    data, held = bytemodel.corpus(cfg.heldout_frac, cfg.corpus_bytes)
    gen = torch.Generator().manual_seed(cfg.seed)
    real_windows = bytemodel.real_texts(held, cfg.context, cfg.text_len, cfg.real_texts, gen)
    if len(real_windows) < cfg.real_texts:  # known only once the corpus is read, but before any training
        raise ValueError(f"the held-out files hold only {len(real_windows)} disjoint texts of {cfg.text_len} bytes, "
                         f"fewer than real_texts={cfg.real_texts}: raise corpus_bytes or heldout_frac, or lower real_texts")
    torch.manual_seed(cfg.seed)  # the model's initial weights
    # A tiny model on one worker: it stays on the CPU with its data, and needs no run.prepare (DDP).
    model = bytemodel.ByteModel(cfg.context, cfg.embed, cfg.hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    total = cfg.byte_steps + len(cfg.ns) * cfg.repetitions
    for step in range(1, cfg.byte_steps + 1):
        ctx, target = bytemodel.training_batch(data, cfg.context, cfg.byte_batch, gen)
        loss = torch.nn.functional.cross_entropy(model(ctx), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % cfg.log_every == 0 or step == cfg.byte_steps:
            run.report({"train/loss": loss.item(), "progress": step / total}, step=step)
    model.eval()
    h = lambda nll: tabular.metric_values(nll.numpy().astype(float), cfg.metric, cfg.nll_threshold)  # noqa: E731
    real = h(bytemodel.nll_per_byte(model, real_windows))
    prior = h(bytemodel.nll_per_byte(model, bytemodel.generate(model, cfg.prior_draws, cfg.text_len, cfg.temperature, gen)))
    return {"fit_loss": loss.item(), "prior": torch.from_numpy(prior), "real": torch.from_numpy(real),
            "theta_true": float(real.mean())}


def _fit_causal_lm(cfg: Config, run) -> dict[str, Any]:
    """Nothing is trained: the frozen LM scores the deployed texts and its own generations."""
    return _score_lm(cfg, run, cfg.model, pretrained.read_text(cfg.text_path, cfg.text_split), f"text_path={cfg.text_path!r}",
                     fit_loss=None, step=0)


def _fit_tiny_gpt2(cfg: Config, run) -> dict[str, Any]:
    """Train the tiny GPT-2 (or load this seed's, cached by an earlier trial), freeze it, then as
    'causal_lm': score the held-out files' texts and its own generations."""
    recipe = tinygpt2.Recipe(layers=cfg.gpt2_layers, hidden=cfg.gpt2_hidden, heads=cfg.gpt2_heads, vocab=cfg.gpt2_vocab,
                             seq=cfg.text_len, batch=cfg.gpt2_batch, steps=cfg.gpt2_steps, lr=cfg.lr,
                             corpus_bytes=cfg.corpus_bytes, heldout_frac=cfg.heldout_frac)
    total = cfg.gpt2_steps + len(cfg.ns) * cfg.repetitions

    def report(step: int, loss: float) -> None:
        if step % cfg.log_every == 0 or step == cfg.gpt2_steps:
            run.report({"train/loss": loss, "progress": step / total}, step=step)

    folder, loss, _ = tinygpt2.ensure_built(recipe, cfg.seed, report)
    _, held = tinygpt2.texts(recipe)
    return _score_lm(cfg, run, str(folder), held, "the held-out files", fit_loss=loss, step=cfg.gpt2_steps)


def _score_lm(cfg: Config, run, model: str, text: str, source: str, *, fit_loss: float | None, step: int) -> dict[str, Any]:
    """The frozen LM `model` scores random disjoint windows of `text` (the deployed texts) and its own generations."""
    device = torch.device(run.device)
    lm, tokenizer, start = textlm.load(model, device)
    ids = textlm.tokenize(tokenizer, text)
    gen = torch.Generator().manual_seed(cfg.seed)
    windows = textlm.real_windows(ids, start, cfg.text_len, cfg.real_texts, gen)
    if len(windows) < cfg.real_texts:
        raise ValueError(f"{source}: {len(ids)} tokens, {len(windows)} disjoint texts of "
                         f"text_len={cfg.text_len}, fewer than real_texts={cfg.real_texts}: lower real_texts or text_len")
    h = lambda nll: tabular.metric_values(nll.numpy().astype(float), cfg.metric, cfg.nll_threshold)  # noqa: E731
    nll_real = textlm.nll_per_token(lm, windows, cfg.lm_batch, device)
    sampler = torch.Generator(device=device).manual_seed(cfg.seed + 1)
    texts = textlm.generate(lm, start, cfg.prior_draws, cfg.text_len, cfg.temperature, sampler, cfg.lm_batch, device)
    nll_generated = textlm.nll_per_token(lm, texts, cfg.lm_batch, device)
    prior, real = h(nll_generated), h(nll_real)
    if fit_loss is None:  # nothing fitted: the frozen LM's NLL per token of the deployed texts
        fit_loss = float(nll_real.mean())
    # The frozen LM's NLL per token of the deployed texts and of its own: the prior's misspecification.
    total = step + len(cfg.ns) * cfg.repetitions
    run.report({"train/loss": fit_loss, "eval/nll_real": float(nll_real.mean()),
                "eval/nll_generated": float(nll_generated.mean()), "progress": step / total}, step=step)
    return {"fit_loss": fit_loss, "prior": torch.from_numpy(prior), "real": torch.from_numpy(real),
            "theta_true": float(real.mean())}


def _fit_pixels(cfg: Config, run) -> dict[str, Any]:
    """Adam on the PixelCNN's bits per dim of generator_data's images (or a saved PixelCNN loaded),
    then the bits per dim of the deployed images and of the generator's own samples."""
    device = torch.device(run.device)
    gen = torch.Generator().manual_seed(cfg.seed)
    deployed = imagedata.open_split(cfg.image_data, cfg.image_split, "image_data", "image_split")
    if len(deployed) < cfg.real_images:
        raise ValueError(f"image_data={cfg.image_data!r} (split {cfg.image_split!r}) holds {len(deployed)} images, fewer "
                         f"than real_images={cfg.real_images}: lower real_images")
    column = imagedata.image_column(deployed, cfg.image_column, f"image_data={cfg.image_data!r}", "image_column")
    pick = torch.randperm(len(deployed), generator=gen)[: cfg.real_images].tolist()
    real_x = pixelmodel.quantize(imagedata.pixels(deployed, column, cfg.image_size, pick), cfg.image_levels)
    if cfg.generator_path:
        model, _ = pixelmodel.load(cfg.generator_path)  # its sizes are checked by preflight
        model.to(device)
        fit_loss, step = None, 0
    else:
        field, path = ("generator_data", cfg.generator_data) if cfg.generator_data else ("image_data", cfg.image_data)
        source = imagedata.open_split(path, cfg.generator_split, field, "generator_split")
        column = imagedata.image_column(source, cfg.generator_column, f"{field}={path!r}", "generator_column")
        data = imagedata.pixels(source, column, cfg.image_size)  # [N, 3, S, S] uint8: 8-bit, quantized per batch
        torch.manual_seed(cfg.seed)  # the model's initial weights
        # One worker: run.prepare (DDP) has nothing to wrap; the model follows the trial's device.
        model = pixelmodel.PixelCNN(cfg.image_levels, cfg.pixel_hidden, cfg.pixel_layers).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        total = cfg.pixel_steps + len(cfg.ns) * cfg.repetitions
        for step in range(1, cfg.pixel_steps + 1):
            x = pixelmodel.quantize(data[torch.randint(len(data), (cfg.pixel_batch,), generator=gen)], cfg.image_levels)
            loss = pixelmodel.bits_per_dim(model, x.to(device)).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % cfg.log_every == 0 or step == cfg.pixel_steps:
                run.report({"train/loss": loss.item(), "progress": step / total}, step=step)
        fit_loss = loss.item()
        model.eval().requires_grad_(False)
        if cfg.generator_save:
            pixelmodel.save(model, cfg.generator_save, cfg.image_size)
    h = lambda bpd: tabular.metric_values(bpd.numpy().astype(float), cfg.metric, cfg.nll_threshold)  # noqa: E731
    bpd_real = pixelmodel.score(model, real_x, cfg.lm_batch, device)
    sampler = torch.Generator(device=device).manual_seed(cfg.seed + 1)
    images = pixelmodel.generate(model, cfg.prior_draws, cfg.image_size, cfg.temperature, sampler, cfg.lm_batch, device)
    bpd_generated = pixelmodel.score(model, images, cfg.lm_batch, device)
    if fit_loss is None:  # nothing fitted: the loaded generator's bits per dim of the deployed images
        fit_loss = float(bpd_real.mean())
    # Bits per dim of the deployed images and of the generator's own: the prior's misspecification.
    run.report({"train/loss": fit_loss, "eval/bpd_real": float(bpd_real.mean()),
                "eval/bpd_generated": float(bpd_generated.mean()), "progress": step / (step + len(cfg.ns) * cfg.repetitions)},
               step=step)
    prior, real = h(bpd_generated), h(bpd_real)
    return {"fit_loss": fit_loss, "prior": torch.from_numpy(prior), "real": torch.from_numpy(real),
            "theta_true": float(real.mean())}


def _real_sampler(cfg: Config, fitted: dict[str, Any]):
    """(rng, reps, count) -> deployed metric values: fresh records from F, or texts drawn without
    replacement from the held-out population."""
    if cfg.generator == "gmm":
        world = tabular.World(cfg.dim, cfg.risky_share, cfg.risky_offset, cfg.risky_sd, cfg.shift)
        return lambda rng, reps, count: tabular.metric_values(
            world.score(world.sample(rng, (reps, count))), cfg.metric, cfg.threshold)
    population = fitted["real"].numpy()

    def sample(rng: np.random.Generator, reps: int, count: int) -> np.ndarray:
        order = np.argsort(rng.random((reps, len(population))), axis=1)[:, :count]
        return population[order]

    return sample


def train(cfg: Config, run) -> dict[str, float]:
    validate(cfg, run.world_size)
    fit = fit_steps(cfg)
    total = fit + len(cfg.ns) * cfg.repetitions
    state = run.restore()
    if state is None:
        fits = {"gmm": _fit_gmm, "bytes": _fit_bytes, "causal_lm": _fit_causal_lm, "tiny_gpt2": _fit_tiny_gpt2,
                "pixels": _fit_pixels}
        fitted = fits[cfg.generator](cfg, run)
        state = {"step": fit, **fitted, "records": {}}
        run.save(state)
    prior = state["prior"].numpy()
    theta_true = float(state["theta_true"])
    records = {key: value.numpy() for key, value in state["records"].items()}
    sample_real = _real_sampler(cfg, state)
    step, started, drawn = int(state["step"]), devices.clock(run.device), 0
    for i, n in enumerate(cfg.ns):
        rows = records.get(f"n{n}", np.empty((0, 0)))
        while len(rows) < cfg.repetitions:
            done = len(rows)
            # One stream per (seed, n, chunk): a resumed run draws exactly what an unbroken one would.
            rng = np.random.default_rng([cfg.seed, n, done // cfg.chunk])
            chunk = evaluate_chunk(cfg, rng, sample_real, prior, n, min(cfg.chunk, cfg.repetitions - done))
            rows = chunk if done == 0 else np.concatenate([rows, chunk])
            records[f"n{n}"] = rows
            drawn += len(chunk)
            step = fit + i * cfg.repetitions + len(rows)
            # Every n measured so far, so the last report holds every final coverage (a sweep's objective).
            metrics = {k: v for m, r in records.items() for k, v in summarize(r, int(m[1:]), theta_true).items()}
            metrics["perf/reps_per_s"] = drawn / max(devices.clock(run.device) - started, 1e-9)
            run.report({**metrics, "progress": step / total}, step=step)
            if len(rows) == cfg.repetitions or (len(rows) // cfg.chunk) % cfg.checkpoint_every == 0:
                run.save({**state, "step": step, "records": {k: torch.from_numpy(v) for k, v in records.items()}})
    final = {"train/loss": float(state["fit_loss"]), "eval/theta_true": theta_true,
             "eval/theta_prior": float(prior.mean()), "eval/prior_gap": float(prior.mean()) - theta_true,
             "eval/prior_sd": float(prior.std())}
    if len(state["real"]):  # a finite deployed population (texts, images): its spread, the gap's unit
        final["eval/real_sd"] = float(state["real"].numpy().std())
    for n in cfg.ns:
        final.update(summarize(records[f"n{n}"], n, theta_true))
    return final
