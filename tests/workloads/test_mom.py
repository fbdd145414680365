"""mom: the chunked mixture-of-memories form against the token-by-token reference (values and
gradients), routing and the load-balancing loss, matched parameter counts, the inference state
over sequence length, MQAR data, bad configs, resumption, the claims and the smoke reproduction."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from orchestrator.run import LocalRun
from components.lm import corpus as lm_corpus
from orchestrator.claims import spec_of
from orchestrator.runners import registry
from workloads.mom import CHECKS, CLAIMS, Config, plot, smoke, train, validate
from workloads.mom import data
from workloads.mom.claims import (
    COMPARABLE_MARGIN,
    PARAM_TOLERANCE,
    RECALL_MARGIN,
    equal_state_memory_matched,
    mom_gap_grows_with_pairs,
    mom_recall_comparable_to_softmax,
    mom_recalls_more_than_every_equal_state_linear_model,
    mom_recalls_more_than_single_memory,
    parameter_counts_matched,
    state_constant_in_length,
)
from workloads.mom.memory import chunked, load_balancing_loss, recurrent_reference, route
from workloads.mom.model import LM, MemoryMixer, param_count, state_bytes
from workloads.mom.workload import build_model, count_params, matched_mlp_hidden, measure_state, memory_numbers
from conftest import judged_claim, DiesAtSave, assert_claims_hold, shifted, narrowed_reproduction
from orchestrator.runners.config import ConfigError

f64 = torch.float64


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def memory_inputs(B=2, T=37, M=4, k=2, shared=True, H=2, dk=4, dv=3, seed=0):
    """Random q, k, v, decays, write strengths and top-k routing of M memories (+ the shared one)."""
    g = gen(seed)
    E = M + int(shared)
    q = F.normalize(torch.randn(B, T, H, dk, generator=g, dtype=f64), dim=-1)
    keys = F.normalize(torch.randn(B, T, E, H, dk, generator=g, dtype=f64), dim=-1)
    v = torch.randn(B, T, E, H, dv, generator=g, dtype=f64)
    log_alpha = -torch.rand(B, T, E, H, generator=g, dtype=f64)
    beta = torch.rand(B, T, E, H, generator=g, dtype=f64)
    logits = torch.randn(B, T, M, generator=g, dtype=f64)
    leaves = [x.requires_grad_() for x in (q, keys, v, log_alpha, beta, logits)]
    return leaves, shared


def mixed(leaves, shared, k=2):
    q, keys, v, log_alpha, beta, logits = leaves
    weights, routed = route(logits, k)
    if shared:
        ones = torch.ones_like(weights[..., :1])
        weights, routed = torch.cat([weights, ones], -1), torch.cat([routed, ones.bool()], -1)
    return q, keys, v, log_alpha, beta, weights, routed


def tiny(**kw) -> Config:
    """A run small enough for a unit test: a few steps of a 2-layer width-32 model, at the test
    seed (`shifted`: LADDER_TEST_SEED_SHIFT moves it)."""
    base = dict(seed=shifted(kw.pop("seed", 0)), d_model=32, heads=2, head_dim=8, chunk=8, vocab=32, seq_len=32,
                train_pairs=(1, 8), eval_lens=(16, 32), eval_examples=32, state_lens=(4, 16), steps=6, batch_size=8,
                log_every=2, checkpoint_every_frac=0.5)
    return Config(**{**base, **kw})


# --- the recurrence ---------------------------------------------------------------------------


@pytest.mark.parametrize("update", ["linear", "gated", "gated_delta"])
def test_chunked_form_equals_the_recurrent_reference_with_gradients(update):
    leaves, shared = memory_inputs()
    ref_o, ref_s = recurrent_reference(*mixed(leaves, shared), update=update)
    ref_grads = torch.autograd.grad((ref_o.sin().sum() + ref_s.cos().sum()), leaves, allow_unused=True, materialize_grads=True)
    for chunk in (1, 5, 8, 64):  # 37 tokens: none of 5, 8, 64 divides the length
        o, s = chunked(*mixed(leaves, shared), update=update, chunk=chunk)
        torch.testing.assert_close(o, ref_o, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(s, ref_s, rtol=1e-10, atol=1e-10)
        grads = torch.autograd.grad((o.sin().sum() + s.cos().sum()), leaves, allow_unused=True, materialize_grads=True)
        for name, a, b in zip(("q", "k", "v", "log_alpha", "beta", "router"), grads, ref_grads):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=f"{update}, chunk {chunk}: d/d{name}")
    assert ref_grads[-1].abs().sum() > 0  # the router learns through the mixing weights


def test_chunked_form_continues_from_a_state():
    leaves, shared = memory_inputs(T=20)
    args = mixed(leaves, shared)
    whole, s_whole = chunked(*args, update="gated_delta", chunk=8)
    first = [a[:, :11] for a in args]
    rest = [a[:, 11:] for a in args]
    o1, s1 = chunked(*first, update="gated_delta", chunk=8)
    o2, s2 = chunked(*rest, update="gated_delta", chunk=8, state=s1)
    torch.testing.assert_close(torch.cat([o1, o2], 1), whole)
    torch.testing.assert_close(s2, s_whole)


def test_linear_rule_is_the_sum_of_routed_outer_products():
    leaves, shared = memory_inputs(T=6)
    q, k, v, la, b, w, r = (x.detach() for x in mixed(leaves, shared))
    _, state = recurrent_reference(q, k, v, la, b, w, r, update="linear")
    expect = torch.einsum("bte,btehk,btehv->behkv", r.to(f64), k, v)
    torch.testing.assert_close(state, expect)


def test_gated_rule_by_hand():
    """The decay-gated baseline (GLA / Mamba-2 with a scalar gate): S <- alpha S + k v^T, no delta
    correction and no write strength, so two tokens into one memory give alpha_2 k_1 v_1^T + k_2 v_2^T."""
    k = torch.tensor([[1.0, 0.0], [0.6, 0.8]], dtype=f64).reshape(1, 2, 1, 1, 2)
    v = torch.tensor([[2.0], [3.0]], dtype=f64).reshape(1, 2, 1, 1, 1)
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=f64).reshape(1, 2, 1, 2)
    log_alpha = torch.log(torch.tensor([0.5, 0.25], dtype=f64)).reshape(1, 2, 1, 1)
    beta = torch.full((1, 2, 1, 1), 0.3, dtype=f64)  # ignored by the gated rule
    w, r = torch.ones(1, 2, 1, dtype=f64), torch.ones(1, 2, 1, dtype=torch.bool)
    expect = torch.tensor([[0.25 * 2 + 0.6 * 3], [0.8 * 3]], dtype=f64)  # [dk, dv]
    for fn in (recurrent_reference, lambda *a, **kw: chunked(*a, chunk=2, **kw)):
        o, s = fn(q, k, v, log_alpha, beta, w, r, update="gated")
        torch.testing.assert_close(s[0, 0, 0], expect)
        # token 1 reads q_1 . (k_1 v_1^T) = 2; token 2 reads q_2 . S_2 = 2.4
        torch.testing.assert_close(o.flatten(), torch.tensor([2.0, 2.4], dtype=f64))
    # the decay is data-dependent: the gate's projection exists, the delta rule's beta does not
    layer = MemoryMixer(16, 2, 4, 1, num_memories=1, topk=1, shared_memory=False, update="gated",
                        conv_size=4, chunk=8, impl="chunked")
    assert hasattr(layer, "a_proj") and not hasattr(layer, "b_proj")


@pytest.mark.parametrize("update", ["linear", "gated", "gated_delta"])
def test_layer_chunked_equals_recurrent_including_conv_and_gates(update):
    torch.manual_seed(0)
    layer = MemoryMixer(16, 2, 4, 2, num_memories=4, topk=2, shared_memory=True, update=update,
                        conv_size=4, chunk=8, impl="chunked").double()
    x = torch.randn(2, 19, 16, dtype=f64, requires_grad=True)
    y, _, state = layer(x)
    gy = torch.autograd.grad(y.square().sum(), [x, *layer.parameters()])
    layer.impl = "recurrent"
    y_ref, _, state_ref = layer(x)
    gy_ref = torch.autograd.grad(y_ref.square().sum(), [x, *layer.parameters()])
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(state["memory"], state_ref["memory"])
    for a, b in zip(gy, gy_ref):
        torch.testing.assert_close(a, b)


# --- routing ----------------------------------------------------------------------------------


def test_router_sends_each_token_to_exactly_k_memories_plus_the_shared_one():
    torch.manual_seed(1)
    layer = MemoryMixer(16, 2, 4, 1, num_memories=5, topk=2, shared_memory=True, update="gated_delta",
                        conv_size=4, chunk=8, impl="chunked")
    x = torch.randn(3, 11, 16)
    weights, routed, logits = layer.routing(x)
    assert routed.shape == (3, 11, 6)
    assert (routed[..., :5].sum(-1) == 2).all() and routed[..., 5].all()
    top2 = torch.topk(logits, 2, dim=-1).indices
    assert torch.equal(routed[..., :5], torch.zeros_like(routed[..., :5]).scatter(-1, top2, True))
    assert (weights[..., :5][~routed[..., :5]] == 0).all()
    torch.testing.assert_close(weights[..., :5].sum(-1), torch.ones(3, 11))
    assert (weights[..., 5] == 1).all()
    probs = logits.softmax(-1)  # the kept weights are the softmax renormalised over the top 2
    kept = probs.gather(-1, top2)
    torch.testing.assert_close(weights[..., :5].gather(-1, top2), kept / kept.sum(-1, keepdim=True))


def test_generation_step_leaves_unrouted_memories_bit_identical():
    torch.manual_seed(2)
    layer = MemoryMixer(16, 2, 4, 1, num_memories=4, topk=2, shared_memory=True, update="gated_delta",
                        conv_size=4, chunk=8, impl="chunked")
    _, _, state = layer(torch.randn(1, 9, 16))
    x = torch.randn(1, 1, 16)
    _, routed, _ = layer.routing(x)
    _, _, after = layer(x, state)
    for e in range(5):
        same = torch.equal(after["memory"][0, e], state["memory"][0, e])
        assert same == (not bool(routed[0, 0, e])), e  # routed memories move, the others do not


def test_load_balancing_loss_by_hand():
    # Token 1: probs (1/4, 1/2, 1/4), top-1 memory 1. Token 2: probs (3/5, 1/5, 1/5), top-1 memory 0.
    # f = (1/2, 1/2, 0), P = (0.425, 0.35, 0.225): loss = 3 * (0.5 * 0.425 + 0.5 * 0.35) = 1.1625.
    logits = torch.tensor([[0.0, math.log(2), 0.0], [math.log(3), 0.0, 0.0]], dtype=f64)
    assert float(load_balancing_loss(logits, 1)) == pytest.approx(1.1625, abs=1e-12)
    # top-2: f = (1, 1, 0) + ... each token keeps two memories; token 1 keeps {1, 0 or 2}.
    assert float(load_balancing_loss(torch.zeros(8, 4), 2)) == pytest.approx(2.0)  # balanced: k
    collapsed = torch.tensor([[9.0, 0.0, 0.0, 0.0]]).expand(8, 4)
    assert float(load_balancing_loss(collapsed, 1)) == pytest.approx(4.0, rel=1e-3)  # one memory: M


# --- models -----------------------------------------------------------------------------------


def test_parameter_counts_match_and_memories_have_the_same_size():
    cfg = smoke()
    mom = count_params(dataclasses.replace(cfg, mixer="mom"))
    counts = {"mom": mom}
    for mixer in ("single", "softmax"):
        other = dataclasses.replace(cfg, mixer=mixer)
        h = matched_mlp_hidden(other, mom)
        counts[mixer] = count_params(dataclasses.replace(other, mlp_hidden=h))
        assert h > 0
        assert abs(counts[mixer] - mom) <= cfg.layers * cfg.d_model, counts  # one MLP unit per layer
    assert counts == {"mom": 18320, "single": 18448, "softmax": 18432}  # the exact counts, reported
    built = {m: param_count(build_model(dataclasses.replace(cfg, mixer=m))) for m in ("mom", "single")}
    assert built["mom"] == mom  # the meta-device count is the real one
    states = {m: measure_state(build_model(dataclasses.replace(cfg, mixer=m)), (4,), cfg.vocab, gen(), "cpu")
              for m in ("mom", "single")}
    # Bytes per layer (float32): each memory holds heads x dk x dv; the convolution keeps its last
    # conv_size - 1 inputs of q (shared) and of k and v (per memory).
    memory = cfg.heads * cfg.head_dim * cfg.head_dim * cfg.expand_v * 4
    window = (cfg.conv_size - 1) * cfg.heads * cfg.head_dim * 4
    for mixer, E in (("single", 1), ("mom", cfg.num_memories + 1)):
        assert states[mixer][4] == cfg.layers * (E * memory + (1 + 2 * E) * window), mixer


def test_the_smoke_sweep_matches_every_model_to_the_largest_parameter_count():
    """The reproduction's six models (MoM, single memory, the three equal-state memories, softmax)
    get the MLP width that brings each within PARAM_TOLERANCE of the largest, the equal-state
    gated-delta memory; none loses parameters to MoM."""
    from orchestrator.reproduction.reproduce import load_repro

    points = load_repro("mom", smoke=True).points
    labels = [(p["mixer"], p.get("update", "linear")) for p in points]
    assert labels == [("mom", "linear"), ("single", "linear"), ("single_expanded", "linear"),
                      ("single_expanded", "gated"), ("single_expanded", "gated_delta"), ("softmax", "linear")]
    counts = [count_params(dataclasses.replace(smoke(), **p)) for p in points]
    bare = [count_params(dataclasses.replace(smoke(), **{**p, "mlp_hidden": 0})) for p in points]
    assert max(bare) == bare[4] and all(abs(c - counts[0]) <= PARAM_TOLERANCE * counts[0] for c in counts), counts
    assert points[0]["mlp_hidden"] > 0 and all(c >= b for c, b in zip(counts, bare))


@pytest.mark.parametrize("mixer", ["mom", "single", "softmax"])
def test_generation_token_by_token_matches_the_full_forward(mixer):
    torch.manual_seed(3)
    model = LM(vocab=20, d_model=16, layers=2, mixer=mixer, heads=2, head_dim=4, chunk=4, mlp_hidden=8).double()
    tokens = torch.randint(0, 20, (2, 13))
    full, _, _ = model(tokens)
    logits, _, state = model(tokens[:, :6])
    steps = [logits]
    for t in range(6, 13):
        out, _, state = model(tokens[:, t : t + 1], state)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), full)


def test_inference_state_is_constant_for_memories_and_grows_for_softmax():
    lengths = (8, 32, 128)
    sizes = {}
    for mixer in ("mom", "single", "softmax"):
        model = build_model(dataclasses.replace(smoke(), mixer=mixer))
        sizes[mixer] = measure_state(model, lengths, 32, gen(), "cpu")
    assert len(set(sizes["mom"].values())) == 1 and len(set(sizes["single"].values())) == 1, sizes
    cfg = smoke()
    kv_per_token = cfg.layers * 2 * cfg.heads * cfg.head_dim * 4  # keys and values, float32
    soft = sizes["softmax"]
    assert soft[32] - soft[8] == 24 * kv_per_token and soft[128] - soft[32] == 96 * kv_per_token, sizes
    assert state_bytes({"a": [torch.zeros(3, dtype=torch.float64)], "b": (torch.zeros(2, dtype=torch.int8),)}) == 26


# --- data -------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["kv", "vk"])
def test_mqar_sequences_hold_each_pair_and_query_it_once(order):
    inputs, targets = data.mqar(64, 48, (2, 12), 40, gen(4), order)
    assert inputs.shape == targets.shape == (64, 48)
    for x, y in zip(inputs.tolist(), targets.tolist()):
        asked = [i for i, t in enumerate(y) if t != data.IGNORE]
        P = len(asked)
        assert 2 <= P <= 12
        ctx = x[: 2 * P]
        keys, values = (ctx[0::2], ctx[1::2]) if order == "kv" else (ctx[1::2], ctx[0::2])
        assert len(set(keys)) == P and all(1 <= k < 20 for k in keys) and all(20 <= v < 40 for v in values)
        pair = dict(zip(keys, values))
        assert sorted(x[i] for i in asked) == sorted(keys)  # every key queried exactly once
        assert all(y[i] == pair[x[i]] for i in asked) and all(i >= 2 * P and (i - 2 * P) % 2 == 0 for i in asked)
        assert all(x[i] == 0 for i in range(2 * P, 48) if i not in asked)
    again = data.mqar(64, 48, (2, 12), 40, gen(4), order)
    assert torch.equal(again[0], inputs) and not torch.equal(data.mqar(64, 48, (2, 12), 40, gen(5), order)[0], inputs)


def test_byte_corpus_is_celerity_lms_loader():
    assert data.load_corpus is lm_corpus.load_corpus and data.BatchSampler is lm_corpus.BatchSampler
    with pytest.raises(ValueError, match="4 \\* pairs"):
        data.mqar(2, 16, 5, 32, gen())


def test_lm_task_trains_on_the_byte_corpus(tmp_path):
    cfg = tiny(task="lm", vocab=256, max_bytes=200_000, eval_tokens=256, steps=4)
    out = train(cfg, LocalRun(tmp_path))
    # Four steps: the loss stays near uniform over bytes (ln 256 = 5.55), not diverging. margin:
    # ln 256 + 0.5 - eval/loss worst 0.221 over seeds 1-5 (0.285, 0.221, 0.311, 0.362, 0.475) (threshold
    # 6.045); 0 < loss and bits_per_byte = loss / ln 2 hold by construction
    assert 0 < out["eval/loss"] < math.log(256) + 0.5 and out["eval/bits_per_byte"] == pytest.approx(out["eval/loss"] / math.log(2))


def test_lm_task_trains_on_a_tokenized_dataset_folder(workdir):
    """The paper's LM setting reads a pre-tokenized corpus (celerity_lm's `tokens.json` + shards,
    what `python -m components.lm.tokens` writes from text with a real tokenizer): the
    same loader, a vocabulary from its header, a loss that goes down."""
    import numpy as np

    from orchestrator.runners import launch, registry
    from components.lm.tokens import write_dataset

    rng = np.random.default_rng(0)
    # A small "language": 600-token documents of a repeating 5-gram pattern over 1,000 ids, with noise.
    docs = [np.array([(i * 7 + j * 13) % 1000 if rng.random() > 0.1 else rng.integers(1000) for j in range(600)])
            for i in range(12)]
    write_dataset(workdir / "tok", docs[:10], docs[10:], vocab_size=1000)
    cfg = tiny(task="lm", data="tok", vocab=1000, eval_tokens=256, steps=30, lr=1e-2, log_every=5)
    w = registry.load("mom")
    w.validate(cfg)
    w.preflight(cfg)
    result = launch.run_local("mom", cfg, progress=False, track=False)
    losses = [m["train/loss"] for _, m in result.history if "train/loss" in m]
    # ln(1000) = 6.9 at the start; 5.8 after 30 steps here. margin: losses[0] - losses[-1] worst 1.107
    # over seeds 1-5 (1.107, 1.346, 1.265, 1.238, 1.188) (threshold 0.3)
    assert losses[-1] < losses[0] - 0.3, losses
    assert math.isfinite(result.metrics["eval/bits_per_token"]) and "eval/bits_per_byte" not in result.metrics
    with pytest.raises(ConfigError, match="vocab_size 1000: set vocab=1000, got 256"):
        w.preflight(dataclasses.replace(cfg, vocab=256))
    with pytest.raises(ConfigError, match="missing"):
        w.preflight(dataclasses.replace(cfg, data="missing"))


@pytest.mark.parametrize("update", ["linear", "gated", "gated_delta"])
def test_the_expanded_single_memory_holds_as_many_numbers_as_all_of_moms_memories(update):
    """Table 4's control: one memory whose value dimension is that of all num_memories + shared
    memories of MoM, so its memory holds as many numbers as they do together, whatever its rule;
    its state stays constant in length like MoM's."""
    cfg = dataclasses.replace(smoke(), num_memories=4, topk=2, shared_memory=True)
    mom_model = build_model(dataclasses.replace(cfg, mixer="mom"))
    mom = mom_model.blocks[0].mixer
    expanded_model = build_model(dataclasses.replace(cfg, mixer="single_expanded", update=update))
    expanded = expanded_model.blocks[0].mixer
    assert expanded.dk == mom.dk and expanded.dk * expanded.dv == (cfg.num_memories + 1) * mom.dk * mom.dv
    numbers = memory_numbers(mom_model, "cpu")
    assert numbers == cfg.layers * cfg.heads * (cfg.num_memories + 1) * cfg.head_dim ** 2 == 640
    assert memory_numbers(expanded_model, "cpu") == numbers
    assert memory_numbers(build_model(dataclasses.replace(cfg, mixer="single")), "cpu") * 5 == numbers
    assert memory_numbers(build_model(dataclasses.replace(cfg, mixer="softmax")), "cpu") == 0
    sizes = measure_state(expanded_model, (8, 32, 128), 32, gen(), "cpu")
    assert len(set(sizes.values())) == 1, sizes
    with pytest.raises(ValueError, match="mixer must be one of"):
        validate(dataclasses.replace(cfg, mixer="expanded"))


# --- the loop ---------------------------------------------------------------------------------


def test_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path):
    cfg = tiny()
    whole = train(cfg, LocalRun(tmp_path / "whole"))

    with pytest.raises(KeyboardInterrupt):
        train(cfg, DiesAtSave(tmp_path / "cut"))
    resumed = LocalRun(tmp_path / "cut")
    again = train(cfg, resumed)
    assert resumed.restored_step == cfg.steps // 2
    assert resumed.history[0][0] > cfg.steps // 2
    for key in ("train/loss", "eval/recall_T16", "eval/recall_T32", "eval/state_bytes_T16"):
        assert again[key] == pytest.approx(whole[key], rel=1e-6), key


def test_train_reports_recall_and_state(tmp_path):
    run = LocalRun(tmp_path)
    out = train(tiny(steps=2, log_every=1, threads=1), run)
    assert [m["progress"] for _, m in run.history] == [0.5, 1.0, 1.0]
    assert run.history[-1][1]["eval/recall"] == out["eval/recall"]  # the final evaluation is reported too
    assert {"eval/recall_T16", "eval/recall_T32", "eval/recall", "eval/params",
            "eval/state_bytes_T4", "eval/state_bytes_T16"} <= set(out)
    assert out["eval/recall"] == pytest.approx((out["eval/recall_T16"] + out["eval/recall_T32"]) / 2)


# --- configs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    ({"task": "qa"}, "task must be one of"),
    ({"mixer": "moe"}, "mixer must be one of"),
    ({"update": "delta"}, "update must be one of"),
    ({"mqar_order": "kk"}, "mqar_order must be one of"),
    ({"impl": "fused"}, "impl must be one of"),
    ({"num_memories": 1}, "use mixer='single'"),
    ({"topk": 5}, "topk must lie in 1..num_memories=4"),
    ({"topk": 0}, "topk must lie in"),
    ({"head_dim": 0}, "head_dim must be positive"),
    ({"chunk": 0}, "chunk must be positive"),
    ({"mlp_hidden": -1}, "mlp_hidden"),
    ({"lr": 0.0}, "need lr > 0"),
    ({"warmup_frac": 1.0}, "warmup_frac in"),
    ({"checkpoint_every_frac": 0.0}, "checkpoint_every_frac"),
    ({"train_pairs": (8,)}, "train_pairs must be \\(low, high\\)"),
    ({"train_pairs": (4, 257)}, "4 \\* pairs <= seq_len=1024"),
    ({"vocab": 64}, "31 distinct keys"),
    ({"eval_pair_frac": 0.5}, "eval_pair_frac in"),
    ({"eval_lens": (2,)}, "eval length 2"),
    ({"state_lens": ()}, "state_lens"),
    ({"task": "lm"}, "set vocab=256"),
    ({"task": "lm", "heldout_frac": 0.0}, "heldout_frac"),
])
def test_bad_configs_name_the_problem(change, message):
    cfg = dataclasses.replace(Config(), **change)
    if change.get("task") == "lm" and "heldout_frac" in change:
        cfg = dataclasses.replace(cfg, vocab=256)
    with pytest.raises(ValueError, match=message):
        validate(cfg)


def test_more_than_one_worker_is_refused():
    with pytest.raises(ConfigError, match="workers=1"):
        registry.load("mom").validate(Config(), world_size=2)


def test_smoke_and_default_configs_are_valid():
    validate(smoke())
    validate(Config())


# --- claims -----------------------------------------------------------------------------------


def trial(mixer, seed, recall, state, params, **kw):
    out = {"task": "mqar", "mixer": mixer, "seed": seed, "update": "gated_delta", "mqar_order": "vk",
           "heads": 2, "head_dim": 8, "expand_v": 1, "d_model": 64, "layers": 2, "vocab": 32, "seq_len": 32,
           "eval/params": float(params)}
    out.update({f"eval/recall_T{n}": r for n, r in recall.items()})
    out.update({f"eval/state_bytes_T{n}": float(b) for n, b in state.items()})
    return {**out, **kw}


def trials_for(mom=(0.9, 0.7), single=(0.7, 0.3), params=(1000, 1005), soft_state=(100, 400),
               expanded=(0.8, 0.5), gated=(0.85, 0.6), gdn=(0.7, 0.4), softmax=(0.95, 0.75), memory=500):
    const = {16: 50, 64: 50}
    rows = [
        trial("mom", 0, dict(zip((16, 32), mom)), const, params[0], update="linear", num_memories=4,
              shared_memory=True, **{"eval/memory_numbers": 500.0}),
        trial("single", 0, dict(zip((16, 32), single)), const, params[1], update="linear",
              **{"eval/memory_numbers": 100.0}),
        trial("softmax", 0, dict(zip((16, 32), softmax)), dict(zip((16, 64), soft_state)), params[1],
              **{"eval/memory_numbers": 0.0}),
    ]
    for rule, recall in (("linear", expanded), ("gated", gated), ("gated_delta", gdn)):
        rows.append(trial("single_expanded", 0, dict(zip((16, 32), recall)), const, params[1], update=rule,
                          expand_v=5, **{"eval/memory_numbers": float(memory)}))
    return rows




def test_claims_hold_on_the_papers_pattern():
    results = {c.__name__: c(trials_for()) for c in CLAIMS + CHECKS}
    assert all(holds for holds, _ in results.values()), results
    assert all(judged_claim(c, trials_for()) for c in CLAIMS)
    assert all(spec_of(c) is None for c in CHECKS)
    assert CLAIMS[0] is mom_recalls_more_than_every_equal_state_linear_model  # the headline first
    head = results["mom_recalls_more_than_every_equal_state_linear_model"][1]
    # MoM 0.8; expanded linear 0.65, gated 0.725, gated delta 0.55: the smallest lead is the gated one's
    assert head["min_gap_equal_state"] == pytest.approx(0.075) and head["gap_expanded_gated_delta"] == pytest.approx(0.25)
    assert results["mom_recall_comparable_to_softmax"][1]["softmax_lead"] == pytest.approx(0.05)
    assert results["equal_state_memory_matched"][1]["memory_expanded_gated"] == 500.0
    recall = results["mom_recalls_more_than_single_memory"][1]
    assert recall["mean_gap"] == pytest.approx(0.3)
    assert (recall["gap_shortest"], recall["gap_longest"]) == pytest.approx((0.2, 0.4))
    assert results["mom_gap_grows_with_pairs"][1]["gap_growth"] == pytest.approx(0.2)
    assert results["parameter_counts_matched"][1]["param_gap"] == pytest.approx(0.005)
    state = results["state_constant_in_length"][1]
    assert state["mom_growth"] == 1.0 and state["softmax_growth"] == 4.0 and state["softmax_bytes_per_token"] == 6.25


def test_equal_state_and_softmax_claims_fail_when_the_pattern_is_absent():
    # one equal-state baseline (the gated one) recalls a little more than MoM: the headline fails
    assert not judged_claim(mom_recalls_more_than_every_equal_state_linear_model, trials_for(gated=(0.9, 0.71)))
    assert judged_claim(mom_recalls_more_than_every_equal_state_linear_model, trials_for(gated=(0.9, 0.69)))
    # softmax ahead by just more, or just less, than the comparability margin (MoM's recall is 0.8)
    behind = 0.8 + COMPARABLE_MARGIN
    assert not judged_claim(mom_recall_comparable_to_softmax, trials_for(softmax=(behind + 0.01, behind + 0.01)))
    assert judged_claim(mom_recall_comparable_to_softmax, trials_for(softmax=(behind - 0.01, behind - 0.01)))
    assert judged_claim(mom_recall_comparable_to_softmax, trials_for(softmax=(0.8, 0.8)))  # MoM ahead: comparable
    # an "equal-state" baseline that holds more (or less) memory is refused, and the check fails
    unequal = trials_for(memory=640)
    with pytest.raises(ValueError, match="eval/memory_numbers"):
        mom_recalls_more_than_every_equal_state_linear_model(unequal)
    assert not equal_state_memory_matched(unequal)[0]
    with pytest.raises(ValueError, match="single_expanded"):
        mom_recalls_more_than_every_equal_state_linear_model([t for t in trials_for() if t["mixer"] != "single_expanded"])
    unmatched = trials_for()
    unmatched[4]["eval/params"] = 1500.0  # one equal-state baseline with half again MoM's parameters
    assert not parameter_counts_matched(unmatched)[0]


def test_claims_fail_when_the_pattern_is_absent():
    small_gap = trials_for(mom=(0.75, 0.38))  # gap below the margin (0.065), growing
    assert not judged_claim(mom_recalls_more_than_single_memory, small_gap)
    assert judged_claim(mom_gap_grows_with_pairs, small_gap)
    shrinking = trials_for(mom=(1.0, 0.8), single=(0.5, 0.45))  # gap 0.425 above the margin, shrinking
    assert judged_claim(mom_recalls_more_than_single_memory, shrinking)
    assert not judged_claim(mom_gap_grows_with_pairs, shrinking)
    assert not parameter_counts_matched(trials_for(params=(1000, 1500)))[0]  # unmatched parameters
    assert not state_constant_in_length(trials_for(soft_state=(100, 120)))[0]  # softmax cache does not grow
    growing = trials_for()
    growing[0]["eval/state_bytes_T64"] = 51.0
    assert not state_constant_in_length(growing)[0]


def test_claims_average_seeds_and_refuse_unlike_memories():
    a = trials_for()
    b = [{**t, "seed": 1, "eval/recall_T32": 0.2 if t["mixer"] == "mom" else t["eval/recall_T32"]} for t in a]
    holds, measured = mom_recalls_more_than_single_memory(a + b)
    assert measured["mom_T32"] == pytest.approx(0.45) and measured["mean_gap"] == pytest.approx(0.175)
    assert holds == (0.175 >= RECALL_MARGIN)
    # averaged over seeds the gap at 32 (0.15) falls below the one at 16 (0.2)
    assert not judged_claim(mom_gap_grows_with_pairs, a + b)
    unlike = [{**t, "head_dim": 16} if t["mixer"] == "single" else t for t in a]
    for fn in (mom_recalls_more_than_single_memory, mom_gap_grows_with_pairs, parameter_counts_matched):
        with pytest.raises(ValueError, match="differ in head_dim"):
            fn(unlike)


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "claims.png"
    plot(trials_for(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the reproduction -------------------------------------------------------------------------


CI_TRAINING = {"steps": 20, "eval_examples": 32, "log_every": 10}
"""The smoke reproduction as CI runs it: its six trials trained 20 steps and evaluated on 32
examples a length, not the reproduction's 500 and 256. Nothing asserted below depends on how far
the models trained: the checks hold by construction (state sizes, parameter counts, memory
numbers) and no claim's effect is asserted (see below), only that each is measured, finite;
`ladder reproduce mom --smoke` and the report train the full 500 steps."""


@pytest.mark.slow
def test_smoke_reproduction_holds(workdir, monkeypatch):
    from orchestrator.reproduction import reproduce as reproduction

    full = narrowed_reproduction(monkeypatch, "mom", CI_TRAINING)
    assert full.overrides["steps"] > CI_TRAINING["steps"] and full.trial_count() == 6
    rep = reproduction.reproduce("mom", smoke=True, local=True)
    assert not rep.failed_trials
    assert {t["steps"] for t in rep.trials} == {CI_TRAINING["steps"]}  # the narrowed sweep is the one that ran
    assert sorted((t["mixer"], t["update"]) for t in rep.trials) == [
        ("mom", "linear"), ("single", "linear"), ("single_expanded", "gated"), ("single_expanded", "gated_delta"),
        ("single_expanded", "linear"), ("softmax", "linear")]
    assert {c.name for c in rep.claims} == {c.__name__ for c in CLAIMS}
    assert {c.name for c in rep.checks} == {c.__name__ for c in CHECKS}
    assert_claims_hold(rep, ["state_constant_in_length", "parameter_counts_matched", "equal_state_memory_matched"])
    # No claim's effect is asserted here: each is judged over seeds by `ladder reproduce`. At one
    # seed none has room: seed 0 of the judged report (docs/reproductions/mom.json) has MoM below
    # single memory (mean_gap -0.024), its lead shrinking (gap_growth -0.12) and 0.28 behind softmax,
    # though every calibration seed 100-104 had mean_gap >= 0.146 and gap_growth >= 0.234.
    assert not any(c.error for c in rep.claims), [c.error for c in rep.claims]
    assert rep.checks and all(c.holds for c in rep.checks)
    params = next(c for c in rep.checks if c.name == "parameter_counts_matched").measured
    assert params["param_gap"] <= PARAM_TOLERANCE, params  # fixed by construction (matched_mlp_hidden), no training
    for claim in rep.claims + rep.checks:
        assert all(math.isfinite(v) for v in claim.measured.values()), claim
