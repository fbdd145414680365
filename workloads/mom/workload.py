"""mom: Config, the training loop, recall and inference-state measurement (see the package docstring)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from orchestrator.run import devices, fraction_steps

from workloads.mom import data
from workloads.mom.memory import UPDATES
from workloads.mom.model import LM, MIXERS, param_count, state_bytes

TASKS = ("mqar", "lm")
IMPLS = ("chunked", "recurrent")
BYTE_VOCAB = 256
# Independent random streams of one seed: training batches, evaluation sets, the state probe.
TRAIN_STREAM, EVAL_STREAM, PROBE_STREAM = 0, 1, 2


MAX_WORKERS = 1
"""mom runs on one worker (the models are small): the runner refuses more."""


@dataclass(frozen=True)
class Config:
    task: str = "mqar"
    """'mqar' (multi-query associative recall, generated) or 'lm' (byte-level LM on the corpus)."""
    mixer: str = "mom"
    """Token mixer: 'mom' (mixture of memories), 'single' (one memory, no router), 'single_expanded'
    (one memory holding as many numbers as all of MoM's num_memories + shared memories: the paper's
    Table 4 control) or 'softmax'."""
    update: str = "gated_delta"
    """Memory update of the memory mixers: 'gated_delta' (the paper's backend), 'gated' (S <- alpha S
    + k v^T, a data-dependent decay gate: GLA / Mamba-2 with a scalar gate) or 'linear' (S += k v^T)."""
    num_memories: int = 4
    """Routed memories per MoM layer (the paper: 4)."""
    topk: int = 2
    """Memories each token is routed to (the paper: 2)."""
    shared_memory: bool = True
    """MoM adds a memory every token writes to and reads with weight 1 (the paper: yes)."""
    d_model: int = 256
    """Model width."""
    layers: int = 2
    """Blocks."""
    heads: int = 4
    """Heads per mixer."""
    head_dim: int = 32
    """Key dimension per head dk: one memory holds a dk x (dk * expand_v) matrix per head."""
    expand_v: int = 1
    """Value dimension per head as a multiple of head_dim (the paper: 1)."""
    conv_size: int = 4
    """Short causal convolution on q, k, v (the paper: 4). Applied over the whole token stream before
    routing [reconstructed: the paper's code convolves each memory's routed subsequence]."""
    mlp_hidden: int = 0
    """Hidden width of a GELU MLP after each mixer (0: none). The reproduction sizes it per mixer so
    that the baselines match MoM's parameter count."""
    aux_loss_coef: float = 0.01
    """Weight of the load-balancing loss (the paper: 0.01), the mean of each layer's loss
    [reconstructed: the Mixtral-style function the paper's code uses pools all layers' router logits]."""
    chunk: int = 64
    """Chunk length of the chunked form used in training and evaluation."""
    impl: str = "chunked"
    """'chunked' or 'recurrent' (the token-by-token reference: same numbers, much slower)."""
    vocab: int = 8192
    """MQAR vocabulary: keys from its lower half, values from its upper half (task 'lm': 256 bytes)."""
    seq_len: int = 1024
    """Training sequence length (MQAR and LM)."""
    mqar_order: str = "vk"
    """Order within an MQAR context pair: 'vk' (value, then key) or 'kv' (key, then value, as in
    Zoology). MoM's router sees one token: with 'vk' a pair is written at its key token (the value
    reaches it through the convolution) and its query is routed by that same token; with 'kv' the
    write sits on the value token, and routing it like the later query needs context from earlier
    layers. At the smoke size (seeds 0-2) MoM recalled 0.91, 0.82, 0.90 on 'kv' against 0.99,
    0.92, 1.00 on 'vk', and single memory 0.98, 0.47, 0.57 on 'kv': the claim is made on 'vk'."""
    train_pairs: tuple[int, ...] = (64, 256)
    """MQAR training: key-value pairs per sequence drawn uniformly from (low, high); 4 * high <= seq_len."""
    eval_lens: tuple[int, ...] = (128, 256, 512, 1024)
    """MQAR evaluation sequence lengths, each with eval_pair_frac * length pairs."""
    eval_pair_frac: float = 0.25
    """Key-value pairs per evaluation sequence as a fraction of its length (0.25: the most that fit)."""
    eval_examples: int = 2000
    """MQAR evaluation sequences per length (a fixed set per seed)."""
    data: str = "stdlib"
    """Task 'lm': 'stdlib' (the Python standard library's source), a folder of text files (bytes), or
    a tokenized dataset folder (`tokens.json` and token-id shards, celerity_lm's format; set vocab to
    its vocab_size)."""
    heldout_frac: float = 0.1
    """Task 'lm': fraction of files held out for evaluation."""
    max_bytes: int = 4_000_000
    """Task 'lm': cap on training bytes read from the corpus (0: all of it)."""
    eval_tokens: int = 65536
    """Task 'lm': size of the fixed held-out set in bytes."""
    state_lens: tuple[int, ...] = (64, 256, 1024, 4096)
    """Prefix lengths at which the inference state carried to the next token is measured."""
    steps: int = 20000
    """Optimizer steps."""
    batch_size: int = 64
    """Sequences per step."""
    lr: float = 1e-3
    """Peak learning rate (AdamW; linear warmup, cosine decay to zero)."""
    weight_decay: float = 0.01
    """AdamW weight decay on matrices (not on norms, convolutions or decay parameters)."""
    warmup_frac: float = 0.05
    """Fraction of steps in linear warmup."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 disables)."""
    log_every: int = 50
    """Report train/loss (averaged since the last report) every this many steps."""
    checkpoint_every_frac: float = 0.25
    """Save a checkpoint at every multiple of this training fraction (and at the end)."""
    threads: int = 1
    """Intra-op CPU threads of the trial, pinned by the runner around `train` (0 leaves torch's setting)."""
    seed: int = 0
    """Seed of the initialisation, the training data and the evaluation sets."""


def smoke() -> Config:
    """A CPU-sized MQAR run: 2 layers of width 64, one head whose memories are 8 x 8, the linear rule,
    sequences of 32 tokens holding 8 pairs over a 32-token vocabulary; 40 steps, a couple of
    seconds. The reproduction trains the same models for 500 steps and evaluates up to 15 pairs.

    The linear rule, not the paper's gated delta rule: at this size and a few hundred steps the
    gated-delta comparison is decided by when each model's loss starts to fall (300 steps, 2 heads:
    MoM's mean recall led by 0.66, 0.65, 0.44, 0.25 and 0.02 on seeds 0-4; given 1000 steps single
    memory reached 0.975 against MoM's 1.0 on seed 0). With the linear rule MoM led on each of
    seeds 0-9, by 0.14 to 0.64, and its margin grew with the number of pairs on every one.
    """
    return Config(
        update="linear", d_model=64, heads=1, head_dim=8, chunk=32, vocab=32, seq_len=32, train_pairs=(8, 8),
        eval_lens=(16, 32, 48, 60), eval_examples=64, state_lens=(16, 64, 256), steps=40, batch_size=32,
        lr=1e-2, warmup_frac=0.1, log_every=10, checkpoint_every_frac=0.5,
    )


def eval_pairs(cfg: Config, length: int) -> int:
    return max(1, int(length * cfg.eval_pair_frac))


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it: task 'lm' reads its data here (a text folder, or a
    tokenized dataset whose vocab_size the model's vocab must equal). Kept out of `validate` so
    that a sweep of data on a cluster's storage checks as valid anywhere."""
    if cfg.task != "lm":
        return
    data.check_data(cfg.data)
    need = data.data_vocab(cfg.data)
    if cfg.vocab != need:
        what = "a tokenized dataset of vocab_size" if need != BYTE_VOCAB else "bytes: vocab"
        raise ValueError(f"data={cfg.data!r} is {what} {need}: set vocab={need}, got {cfg.vocab}")


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no training: raised before anything is launched."""
    for name, options in (("task", TASKS), ("mixer", MIXERS), ("update", UPDATES), ("impl", IMPLS),
                          ("mqar_order", data.ORDERS)):
        if getattr(cfg, name) not in options:
            raise ValueError(f"{name} must be one of {options}, got {getattr(cfg, name)!r}")
    for name in ("d_model", "layers", "heads", "head_dim", "expand_v", "conv_size", "chunk", "seq_len",
                 "steps", "batch_size", "log_every", "vocab"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.mixer == "mom":
        if cfg.num_memories < 2:
            raise ValueError(f"mixer='mom' needs num_memories >= 2, got {cfg.num_memories}: use mixer='single' for one memory")
        if not 1 <= cfg.topk <= cfg.num_memories:
            raise ValueError(f"topk must lie in 1..num_memories={cfg.num_memories}, got {cfg.topk}")
    if cfg.mlp_hidden < 0 or cfg.aux_loss_coef < 0 or cfg.threads < 0:
        raise ValueError("mlp_hidden, aux_loss_coef and threads must be >= 0 "
                         f"(got {cfg.mlp_hidden}, {cfg.aux_loss_coef}, {cfg.threads})")
    if not cfg.lr > 0 or cfg.weight_decay < 0 or cfg.grad_clip < 0 or not 0 <= cfg.warmup_frac < 1:
        raise ValueError(f"need lr > 0, weight_decay >= 0, grad_clip >= 0 and warmup_frac in [0, 1); got lr={cfg.lr}, "
                         f"weight_decay={cfg.weight_decay}, grad_clip={cfg.grad_clip}, warmup_frac={cfg.warmup_frac}")
    if not 0 < cfg.checkpoint_every_frac <= 1:
        raise ValueError(f"checkpoint_every_frac must lie in (0, 1], got {cfg.checkpoint_every_frac}")
    if not cfg.state_lens or min(cfg.state_lens) < 1:
        raise ValueError(f"state_lens must be non-empty positive lengths, got {cfg.state_lens}")
    if cfg.task == "lm":
        if cfg.data == "stdlib" and cfg.vocab != BYTE_VOCAB:  # other data: checked by `preflight`
            raise ValueError(f"task='lm' on data='stdlib' reads bytes: set vocab={BYTE_VOCAB}, got {cfg.vocab}")
        if not 0 < cfg.heldout_frac < 1 or cfg.eval_tokens < cfg.seq_len:
            raise ValueError(f"task='lm' needs heldout_frac in (0, 1) and eval_tokens >= seq_len; got "
                             f"{cfg.heldout_frac}, {cfg.eval_tokens}")
        return
    keys = data.key_count(cfg.vocab)
    if len(cfg.train_pairs) != 2 or not 1 <= cfg.train_pairs[0] <= cfg.train_pairs[1]:
        raise ValueError(f"train_pairs must be (low, high) with 1 <= low <= high, got {cfg.train_pairs}")
    if 4 * cfg.train_pairs[1] > cfg.seq_len or cfg.train_pairs[1] > keys:
        raise ValueError(f"train_pairs high={cfg.train_pairs[1]} needs 4 * pairs <= seq_len={cfg.seq_len} and pairs <= "
                         f"{keys} distinct keys of vocab={cfg.vocab}: lower it or raise seq_len / vocab")
    if not cfg.eval_lens or cfg.eval_examples < 1 or not 0 < cfg.eval_pair_frac <= 0.25:
        raise ValueError(f"MQAR evaluation needs eval_lens, eval_examples >= 1 and eval_pair_frac in (0, 0.25]; got "
                         f"{cfg.eval_lens}, {cfg.eval_examples}, {cfg.eval_pair_frac}")
    for length in cfg.eval_lens:
        p = eval_pairs(cfg, length)
        if length < 4 or p > keys:
            raise ValueError(f"eval length {length} needs 4 <= length and {p} pairs <= {keys} keys of vocab={cfg.vocab}")


def build_model(cfg: Config, device: torch.device | str = "cpu") -> LM:
    return LM(
        vocab=cfg.vocab, d_model=cfg.d_model, layers=cfg.layers, mixer=cfg.mixer, heads=cfg.heads,
        head_dim=cfg.head_dim, expand_v=cfg.expand_v, num_memories=cfg.num_memories, topk=cfg.topk,
        shared_memory=cfg.shared_memory, update=cfg.update, conv_size=cfg.conv_size, mlp_hidden=cfg.mlp_hidden,
        chunk=cfg.chunk, impl=cfg.impl,
    ).to(device)


def count_params(cfg: Config) -> int:
    """Parameters of cfg's model, counted without allocating them."""
    with torch.device("meta"):
        return param_count(build_model(cfg, "meta"))


def matched_mlp_hidden(cfg: Config, target: int) -> int:
    """The MLP width that brings cfg's model closest to `target` parameters (0 if it is already above).

    An MLP of width h adds layers * (2 d h + d) parameters (two matrices and a norm).
    """
    base = count_params(dataclasses.replace(cfg, mlp_hidden=0))
    per_unit = 2 * cfg.d_model * cfg.layers
    h = round((target - base - cfg.layers * cfg.d_model) / per_unit)
    return max(0, h)


@torch.no_grad()
def recall(model: LM, inputs: torch.Tensor, targets: torch.Tensor, batch: int) -> float:
    """Fraction of query positions whose most likely token is the queried key's value."""
    hits = total = 0
    for i in range(0, len(inputs), batch):
        x, y = inputs[i : i + batch], targets[i : i + batch]
        logits, _, _ = model(x)
        asked = y != data.IGNORE
        hits += int((logits.argmax(-1)[asked] == y[asked]).sum())
        total += int(asked.sum())
    return hits / max(total, 1)


@torch.no_grad()
def measure_state(model: LM, lengths: tuple[int, ...], vocab: int, gen: torch.Generator, device) -> dict[int, int]:
    """Bytes of the inference state carried from token T to token T+1 in generation, for each T: the
    first T-1 tokens are prefilled, token T goes through a one-token step, and the tensors that step
    hands on (memories and convolution windows, or the key/value cache) are added up."""
    out = {}
    for length in lengths:
        tokens = torch.randint(0, vocab, (1, length), generator=gen).to(device)
        state = model(tokens[:, :-1])[2] if length > 1 else None
        _, _, state = model(tokens[:, -1:], state)
        out[length] = state_bytes(state)
    return out


@torch.no_grad()
def memory_numbers(model: LM, device) -> int:
    """Numbers held in the memory matrices of every layer after one token (0 for softmax attention):
    the state the equal-state baselines must match, without the convolution windows."""
    state = model(torch.zeros(1, 1, dtype=torch.long, device=device))[2]
    return sum(s["memory"].numel() for s in state if "memory" in s)


def make_optimizer(model: LM, cfg: Config) -> torch.optim.AdamW:
    """AdamW with weight decay on the projection and embedding matrices only."""
    decay, rest = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "conv" not in name else rest).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98))


def lr_at(cfg: Config, step: int) -> float:
    """Linear warmup over warmup_frac of the steps, then cosine decay to zero (step counts from 1)."""
    warm = max(1, round(cfg.warmup_frac * cfg.steps))
    if step <= warm:
        return cfg.lr * step / warm
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, cfg.steps - warm)))


def checkpoint_steps(cfg: Config) -> set[int]:
    return fraction_steps(cfg.steps, cfg.checkpoint_every_frac)


def train(cfg: Config, run) -> dict[str, float]:
    validate(cfg, run.world_size)
    device = run.device
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, device)
    optimizer = make_optimizer(model, cfg)
    model, optimizer = run.prepare(model, optimizer)

    if cfg.task == "mqar":
        gen = data.generator(cfg.seed, TRAIN_STREAM)
        next_batch = lambda: data.mqar(cfg.batch_size, cfg.seq_len, tuple(cfg.train_pairs), cfg.vocab, gen, cfg.mqar_order)  # noqa: E731
        get_data_state, set_data_state = gen.get_state, gen.set_state
    else:
        train_bytes, held_bytes = data.load_data(cfg.data, heldout_frac=cfg.heldout_frac, max_bytes=cfg.max_bytes)
        sampler = data.BatchSampler(train_bytes, cfg.seq_len, cfg.batch_size, seed=cfg.seed, rank=0)
        next_batch, get_data_state, set_data_state = sampler.next, sampler.state, sampler.load_state

    start, state = 0, run.restore()
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        set_data_state(state["data"])
        start = int(state["step"])
    save_at = checkpoint_steps(cfg)

    model.train()
    loss_sum = balance_sum = 0.0
    seen, window_start, tokens_per_s, train_loss = 0, devices.clock(device), math.nan, math.nan
    for step in range(start + 1, cfg.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(cfg, step)
        inputs, targets = (t.to(device) for t in next_batch())
        logits, balance, _ = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=data.IGNORE)
        optimizer.zero_grad(set_to_none=True)
        (loss + cfg.aux_loss_coef * balance).backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        loss_sum, balance_sum, seen = loss_sum + loss.item(), balance_sum + balance.item(), seen + 1
        if step % cfg.log_every == 0 or step == cfg.steps:
            now = devices.clock(device)
            tokens_per_s = seen * inputs.numel() / max(now - window_start, 1e-9)
            train_loss = loss_sum / seen
            run.report({"train/loss": train_loss, "train/balance_loss": balance_sum / seen,
                        "perf/tokens_per_s": tokens_per_s, "progress": step / cfg.steps}, step=step)
            loss_sum = balance_sum = 0.0
            seen, window_start = 0, now
        if step in save_at:
            run.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                      "data": get_data_state()})

    model.eval()
    final = {"train/loss": train_loss, "perf/tokens_per_s": tokens_per_s, "eval/params": float(param_count(model)),
             "eval/memory_numbers": float(memory_numbers(model, device))}
    if cfg.task == "mqar":
        accs = []
        for length in cfg.eval_lens:
            inputs, targets = data.mqar(cfg.eval_examples, length, eval_pairs(cfg, length), cfg.vocab,
                                        data.generator(cfg.seed, EVAL_STREAM, length), cfg.mqar_order)
            accs.append(recall(model, inputs.to(device), targets.to(device), batch=max(1, 65536 // length)))
            final[f"eval/recall_T{length}"] = accs[-1]
        final["eval/recall"] = sum(accs) / len(accs)
    else:
        with torch.no_grad():
            losses = [float(F.cross_entropy(model(x.to(device))[0].flatten(0, 1), y.to(device).flatten(), reduction="sum"))
                      for x, y in data.heldout_batches(held_bytes, cfg.seq_len, cfg.eval_tokens, cfg.batch_size)]
        n = (cfg.eval_tokens // cfg.seq_len) * cfg.seq_len
        final["eval/loss"] = sum(losses) / n
        # Bits per byte on a byte corpus; on a tokenized dataset a token is not a byte.
        final["eval/bits_per_byte" if cfg.vocab == BYTE_VOCAB else "eval/bits_per_token"] = final["eval/loss"] / math.log(2)
    probe = data.generator(cfg.seed, PROBE_STREAM)
    for length, size in measure_state(model, tuple(cfg.state_lens), cfg.vocab, probe, device).items():
        final[f"eval/state_bytes_T{length}"] = float(size)
    run.report({k: v for k, v in final.items() if k.startswith("eval/")} | {"progress": 1.0}, step=cfg.steps)
    return final
