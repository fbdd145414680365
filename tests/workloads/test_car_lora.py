"""car_lora: each compression operator against hand-computed values, the straight-through
backward, the switch on a real peft-wrapped tiny-local (mask sync, layer skip, frozen base), the
task, bad configs, the claims, resumption, and the smoke reproduction with its drifted base."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from orchestrator.runners import registry
from orchestrator.runners.config import ConfigError
from orchestrator.run import LocalRun
from workloads.car_lora import CLAIMS, Config, plot, smoke, train, validate
from workloads.car_lora import compress as C
from workloads.car_lora.claims import (
    MIN_QUANT_GAIN, PER_SCHEME_TOLERANCE, car_beats_plain_on_most_damaging, car_beats_plain_under_quant,
    car_near_per_scheme, car_not_below_plain_drift, car_not_below_plain_heldout,
)
from workloads.car_lora.data import RELATION_WORDS, encode, task_examples
from workloads.car_lora.workload import SMOKE_SCHEMES
from conftest import DiesAtSave, shifted

# --- operators against hand-computed values ----------------------------------------------------


def test_int8_per_channel_rounds_each_row_on_its_own_absmax():
    w = torch.tensor([[1.0, -0.5, 0.25, 0.1], [0.0, 0.0, 0.0, 0.0]])
    # scale 1/127: 127, -63.5 -> -64 (ties to even), 31.75 -> 32, 12.7 -> 13; a zero row stays zero.
    expect = torch.tensor([[127.0, -64.0, 32.0, 13.0], [0.0, 0.0, 0.0, 0.0]]) / torch.tensor([[127.0], [1.0]])
    torch.testing.assert_close(C.int_per_channel(w, 8), expect)


def test_int4_per_channel_clamps_to_seven_levels_a_side():
    w = torch.tensor([[7.0, -3.5, 1.0, 0.25], [14.0, 3.0, -14.0, 5.0]])
    # row 0: scale 1 -> 7, -4, 1, 0; row 1: scale 2 -> 7, 1.5 -> 2, -7, 2.5 -> 2 (times 2).
    expect = torch.tensor([[7.0, -4.0, 1.0, 0.0], [14.0, 4.0, -14.0, 4.0]])
    torch.testing.assert_close(C.int_per_channel(w, 4), expect)


def test_int2_groups_round_each_group_of_a_row_on_its_own_absmax():
    # 2 bits: the grid is {-1, 0, 1} x the group's absmax; a value under half the absmax becomes 0.
    w = torch.tensor([[4.0, 1.0, -3.0, 0.5, 1.0, -0.4, 0.6, 0.0]])
    # group [4, 1, -3, .5] / 4 -> 1, .25, -.75, .125 -> 1, 0, -1, 0; group [1, -.4, .6, 0] / 1 -> 1, 0, 1, 0
    torch.testing.assert_close(C.int_grouped(w, 2, 4), torch.tensor([[4.0, 0.0, -4.0, 0.0, 1.0, 0.0, 1.0, 0.0]]))
    # A row of 6 in groups of 4 ends on a group of 2 with its own scale (0.3), not the padding's.
    w = torch.tensor([[2.0, -1.2, 0.4, 0.8, 0.3, -0.2]])
    torch.testing.assert_close(C.int_grouped(w, 2, 4), torch.tensor([[2.0, -2.0, 0.0, 0.0, 0.3, -0.3]]))
    # One group per row is the per-channel quantiser; the smoke scheme is 2 bits in groups of 16.
    w = torch.randn(5, 48, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(C.int_grouped(w, 4, 48), C.int_per_channel(w, 4))
    torch.testing.assert_close(C.make_schemes()["int2g16"].op(w), C.int_grouped(w, 2, 16))
    assert set(C.QUANTISERS) < set(C.SCHEME_NAMES)


def test_nf4_rounds_to_the_nearest_level_of_each_flattened_block():
    w = torch.tensor([[2.0, -2.0, 0.0, 1.0, 0.2, 2.0, 0.0, 0.0]])
    # one block of 8, absmax 2: 1, -1, 0, 0.5 -> 0.4407 (0.0593 away; 0.5626 is 0.0626 away), 0.1 -> 0.0796
    lv = C.NF4_CODEBOOK
    expect = 2 * torch.tensor([[1.0, -1.0, 0.0, lv[12], lv[8], 1.0, 0.0, 0.0]])
    torch.testing.assert_close(C.nf4_blockwise(w, block=8), expect)
    # Blocks run over the flattened weight, across rows (bitsandbytes): [4, 0, 1, 1] | [0, 0].
    w2 = torch.tensor([[4.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    out = C.nf4_blockwise(w2, block=4)
    torch.testing.assert_close(out, torch.tensor([[4.0, 0.0, 4 * lv[10]], [4 * lv[10], 0.0, 0.0]]))
    assert len(lv) == 16 and lv[7] == 0.0 and lv[0] == -1.0 and lv[15] == 1.0


def test_mxfp4_is_kernels_mx_fake_quant_with_e8m0_scales(monkeypatch):
    import kernels.mx

    row = torch.zeros(32)
    row[:6] = torch.tensor([6.0, 5.0, 2.5, 0.3, -1.25, 0.2])
    w = torch.stack([row, 2 * row])  # amax 6: scale 2^(2-2) = 1; amax 12: scale 2
    # E2M1 grid 0, .5, 1, 1.5, 2, 3, 4, 6; ties to even: 5 -> 4, 2.5 -> 2, -1.25 -> -1; 0.3 -> 0.5, 0.2 -> 0
    first = torch.tensor([6.0, 4.0, 2.0, 0.5, -1.0, 0.0])
    calls = []
    real = kernels.mx.fake_quant
    monkeypatch.setattr(kernels.mx, "fake_quant", lambda *a, **k: calls.append(k) or real(*a, **k))
    out = C.mxfp4(w, block=32, impl="reference")
    assert calls and calls[0]["elem_format"] == "e2m1" and calls[0]["scale_format"] == "e8m0" and calls[0]["block_size"] == 32
    torch.testing.assert_close(out[0, :6], first)
    torch.testing.assert_close(out[1, :6], 2 * first)
    assert not out[:, 6:].any()


def test_two_four_keeps_the_two_largest_of_every_four():
    w = torch.tensor([[1.0, -3.0, 2.0, 0.5, 0.0, 0.0, 0.0, 1.0]])
    torch.testing.assert_close(C.prune_2_4(w), torch.tensor([[0.0, -3.0, 2.0, 0.0, 0.0, 0.0, 0.0, 1.0]]))
    with pytest.raises(ValueError, match="divisible by 4"):
        C.prune_2_4(torch.ones(2, 6))


def test_unstructured_row_and_column_pruning():
    w = torch.tensor([[3.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.1]])
    assert C.row_prune_mask(w, 0.5).tolist() == [True, False, True, False]  # norms 3, 1, 2, 0.51
    assert C.col_prune_mask(w, 0.5).tolist() == [True, True, False, False]  # norms 3.2, 2, 0, 0.1
    assert C.row_prune_mask(w, 0.3).tolist() == [True, True, True, False]  # floor(1.2) = 1 row
    torch.testing.assert_close(C.prune_unstructured(torch.tensor([[1.0, -4.0, 2.0, 3.0]]), 0.5),
                               torch.tensor([[0.0, -4.0, 0.0, 3.0]]))


# --- the straight-through linear ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["full", "compressed"])
def test_compressed_linear_forward_uses_c_w0_and_backward_by_mode(mode):
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 5).requires_grad_(False)
    cl = C.CompressedLinear(lin, backward=mode)
    assert cl.weight is lin.weight and cl.bias is lin.bias
    cl.compressed = C.int_per_channel(lin.weight, 3)
    x = torch.randn(4, 8, requires_grad=True)
    y = cl(x)
    torch.testing.assert_close(y, x @ cl.compressed.T + lin.bias)
    g = torch.randn(4, 5)
    y.backward(g)
    expect = g @ (lin.weight if mode == "full" else cl.compressed)
    torch.testing.assert_close(x.grad, expect)
    assert not torch.allclose(lin.weight, cl.compressed)


# --- the switch on a real model ------------------------------------------------------------------


@pytest.fixture(scope="module")
def adapted(tiny_base):
    from workloads.car_lora.workload import adapted as make

    torch.manual_seed(0)
    model, tok, comp = make(Config(lora_r=2), "tiny-local", torch.device("cpu"))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # a non-zero adapter, so that masking it is visible
            torch.nn.init.normal_(p, std=0.5)
    model.eval()  # peft leaves the model in train mode: adapter dropout would make outputs random
    return model, tok, comp


def test_switch_applies_each_operator_to_w0_and_caches_it(adapted):
    model, tok, comp = adapted
    key, lin = next(iter(comp.linears.items()))
    comp.use("nf4")
    torch.testing.assert_close(lin.compressed, C.nf4_blockwise(lin.weight.detach(), 64))
    cached = lin.compressed
    comp.use("int8")
    comp.use("nf4")
    assert lin.compressed is cached
    comp.use("none")
    assert lin.compressed is None and len(comp.linears) == 4 * 7
    with pytest.raises(ValueError, match="unknown compression scheme"):
        comp.use("int5")


def test_row_and_column_masks_reach_the_adapter(adapted):
    model, tok, comp = adapted
    key = "0.self_attn.q_proj.base_layer"
    layer = model.base_model.model.model.layers[0].self_attn.q_proj  # peft's LoRA layer
    x = torch.randn(3, 64)
    comp.use("rowprune")
    mask = comp.row_masks[key]
    assert (~mask).sum() == int(0.3 * 64)
    out = layer(x)
    assert torch.all(out[:, ~mask] == 0)  # base and adapter rows both removed
    comp.use("none")
    assert out[:, mask].abs().sum() > 0 and layer(x)[:, ~mask].abs().sum() > 0
    comp.use("colprune")
    cols = comp.col_masks[key]
    x2 = x.clone()
    x2[:, ~cols] = 100.0  # pruned input channels must not reach base or adapter
    torch.testing.assert_close(layer(x), layer(x2))
    comp.use("none")


def test_skip_returns_the_layers_input_and_its_adapter_gets_no_gradient(adapted, tiny_base):
    model, tok, comp = adapted
    ids = torch.tensor([tok("ada pet ?").input_ids])
    seen = {}
    layers = model.base_model.model.model.layers
    k = comp.skip_index
    assert k == Config().skip_layer % len(layers) and k > 0
    # Appended after the compressor's own hook, so it sees the layer's output as the model does.
    hook = layers[k].register_forward_hook(lambda m, a, o: seen.__setitem__(k, (a[0], o)))
    comp.use("skip")
    model.train()
    model(input_ids=ids).logits.sum().backward()
    hook.remove()
    inp, out = seen[k]
    torch.testing.assert_close(out if torch.is_tensor(out) else out[0], inp)
    grads = {n: p.grad for n, p in model.named_parameters() if "lora_A" in n}
    assert all(g is None or not g.any() for n, g in grads.items() if f".layers.{k}." in n)
    assert all(g is not None and g.any() for n, g in grads.items() if f".layers.{k - 1}." in n)
    model.zero_grad(set_to_none=True)
    model.eval()
    comp.use("none")


def test_uncompressed_switch_changes_nothing(adapted, tiny_base):
    from components.basemodel import load_base

    model, tok, comp = adapted
    plain, _ = load_base("tiny-local")
    ids = torch.tensor([tok("ada lives in").input_ids])
    comp.use("none")
    with model.disable_adapter():
        torch.testing.assert_close(model(input_ids=ids).logits, plain(input_ids=ids).logits)


# --- task ----------------------------------------------------------------------------------------


def test_task_split_is_disjoint_seeded_and_labels_only_the_answer(tiny_base):
    from components.basemodel import base_world, load_base

    world = base_world("tiny-local")
    tr, he = task_examples(world, "ask", heldout_frac=0.3, seed=0)
    assert len(tr) + len(he) == 48 * 6 + 96 and len(he) == round(0.3 * 384)
    assert not {e.prompt for e in tr} & {e.prompt for e in he}
    assert task_examples(world, "ask", heldout_frac=0.3, seed=0)[1] == he
    assert task_examples(world, "ask", heldout_frac=0.3, seed=1)[1] != he
    e = he[0]
    assert e.prompt.endswith("?") and e.prompt.split()[1] in (*RELATION_WORDS.values(), "code")
    _, tok = load_base("tiny-local")
    ids, mask, labels = encode(he[:3], tok)
    for i, ex in enumerate(he[:3]):
        answer = labels[i][labels[i] != -100].tolist()
        assert tok.convert_ids_to_tokens(answer) == [ex.answer]
    sub = task_examples(world, "arith", heldout_frac=0.25, seed=0, modulus=7)
    assert len(sub[0]) + len(sub[1]) == 49 and sub[0][0].prompt.split()[1] == "-"
    with pytest.raises(ValueError, match="task must be"):
        task_examples(world, "poems", heldout_frac=0.3, seed=0)


# --- configs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    ({"adapter": "qlora"}, "adapter must be"),
    ({"schemes": ("int8", "int5")}, "unknown compression scheme"),
    ({"heldout_scheme": "nf4"}, "also in schemes"),
    ({"schemes": ()}, "at least one"),
    ({"task": "poems"}, "task must be"),
    ({"backward": "none"}, "backward must be"),
    ({"mx_block": 48}, "mx_block must be"),
    ({"heldout_frac": 1.0}, "heldout_frac"),
    ({"steps": 0}, "steps must be positive"),
    ({"base": "./no/such/folder"}, "does not exist"),
    ({"base": "tiny-local:depth=3"}, "not a tiny-local override"),
])
def test_bad_configs_name_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        validate(dataclasses.replace(Config(), **change))


def test_more_than_one_worker_is_refused():
    with pytest.raises(ConfigError, match="workers=1"):
        registry.load("car_lora").validate(Config(), world_size=2)


# --- claims --------------------------------------------------------------------------------------

SCHEMES = ("int8", "int2g16", "sparse24", "skip")


def fake_trials(car: dict, plain: dict, own: dict, *, drift=(0.8, 0.7)) -> list[dict]:
    def t(adapter, accs, d):
        return {"adapter": adapter, "schemes": SCHEMES, "heldout_scheme": "colprune", "seed": 0,
                **{f"eval/acc/{k}": v for k, v in accs.items()}, "eval/drift_acc/none": d}
    out = [t("car", car, drift[0]), t("plain", plain, drift[1])]
    out += [t(s, {s: own[s]}, 0.0) for s in SCHEMES]
    return out


GOOD = dict(car={"none": 0.9, "int8": 0.9, "int2g16": 0.86, "sparse24": 0.85, "skip": 0.8, "colprune": 0.7},
            plain={"none": 0.92, "int8": 0.92, "int2g16": 0.55, "sparse24": 0.7, "skip": 0.45, "colprune": 0.6},
            own={"int8": 0.93, "int2g16": 0.88, "sparse24": 0.88, "skip": 0.8})


def test_claims_hold_on_the_papers_pattern():
    trials = fake_trials(**GOOD)
    results = {c.__name__: c(trials) for c in CLAIMS}
    assert all(h for h, _ in results.values()), results
    assert results["car_near_per_scheme"][1]["worst_gap"] == pytest.approx(-0.03)
    worst = results["car_beats_plain_on_most_damaging"][1]
    assert worst["most_damaging_is_skip"] == 1.0 and worst["gain"] == pytest.approx(0.35)
    assert worst["plain_drop"] == pytest.approx(0.47)
    quant = results["car_beats_plain_under_quant"][1]
    assert quant["most_damaging_quant_is_int2g16"] == 1.0 and quant["gain"] == pytest.approx(0.31)
    assert quant["plain_drop"] == pytest.approx(0.37) and quant["per_scheme"] == pytest.approx(0.88)
    assert quant["plain_drop_int8"] == pytest.approx(0.0)
    assert results["car_near_per_scheme"][1]["worst_quant_gap"] == pytest.approx(-0.03)


def test_claims_fail_when_the_pattern_is_absent():
    # a point more than PER_SCHEME_TOLERANCE under its per-scheme adapter (0.88)
    bad_car = {**GOOD["car"], "sparse24": 0.88 - PER_SCHEME_TOLERANCE - 0.01}
    assert not car_near_per_scheme(fake_trials(bad_car, GOOD["plain"], GOOD["own"]))[0]
    weak = {**GOOD["car"], "skip": 0.54}  # only 9 points over plain on the most damaging scheme
    assert not car_beats_plain_on_most_damaging(fake_trials(weak, GOOD["plain"], {**GOOD["own"], "skip": 0.55}))[0]
    assert not car_not_below_plain_heldout(fake_trials({**GOOD["car"], "colprune": 0.59}, GOOD["plain"], GOOD["own"]))[0]
    # CAR recovers under the quantiser a point short of MIN_QUANT_GAIN over plain LoRA: not enough.
    short = {**GOOD["car"], "int2g16": GOOD["plain"]["int2g16"] + MIN_QUANT_GAIN - 0.01}
    assert not car_beats_plain_under_quant(fake_trials(short, GOOD["plain"], GOOD["own"]))[0]
    with pytest.raises(ValueError, match="quantises"):  # pruning and skipping alone: no quantiser to judge
        car_beats_plain_under_quant([{**t, "schemes": ("sparse24", "skip")} for t in fake_trials(**GOOD)])
    assert not car_not_below_plain_drift(fake_trials(GOOD["car"], GOOD["plain"], GOOD["own"], drift=(0.69, 0.7)))[0]
    with pytest.raises(ValueError, match="adapter='plain'"):
        car_not_below_plain_drift([t for t in fake_trials(**GOOD) if t["adapter"] != "plain"])


def test_the_most_damaging_scheme_is_measured_not_declared():
    plain = {**GOOD["plain"], "sparse24": 0.3}  # now 2:4 costs plain LoRA most (62 points)
    holds, m = car_beats_plain_on_most_damaging(fake_trials(GOOD["car"], plain, GOOD["own"]))
    assert m["most_damaging_is_sparse24"] == 1.0 and m["gain"] == pytest.approx(0.55) and holds
    plain = {**GOOD["plain"], "int8": 0.2}  # now int8 costs plain LoRA more than 2-bit does
    holds, m = car_beats_plain_under_quant(fake_trials(GOOD["car"], plain, GOOD["own"]))
    assert m["most_damaging_quant_is_int8"] == 1.0 and m["gain"] == pytest.approx(0.7) and holds


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "claims.png"
    plot(fake_trials(**GOOD), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the loop ------------------------------------------------------------------------------------


def test_killed_run_resumes_to_the_same_adapter(tmp_path, tiny_base):
    cfg = dataclasses.replace(smoke(), steps=6, car_steps_factor=2.0, drift=False, checkpoint_every_frac=0.5)
    whole = train(cfg, LocalRun(tmp_path / "whole"))

    with pytest.raises(KeyboardInterrupt):
        train(cfg, DiesAtSave(tmp_path / "cut"))
    resumed = LocalRun(tmp_path / "cut")
    again = train(cfg, resumed)
    assert resumed.restored_step == 6
    assert again["train/loss"] == pytest.approx(whole["train/loss"], rel=1e-6)
    for key in whole:
        if key.startswith(("eval/", "diag/drawn")):
            assert again[key] == pytest.approx(whole[key]), key
    assert sum(v for k, v in whole.items() if k.startswith("diag/drawn/")) == 12
    assert set(k for k in whole if k.startswith("diag/drawn/")) <= {f"diag/drawn/{s}" for s in cfg.schemes}


# --- the reproduction ----------------------------------------------------------------------------

# At the smoke size (115 held-out queries) two claims do not hold at every seed: CAR minus plain LoRA
# on the uncompressed drifted base (car_not_below_plain_drift), seeds 0-4: +2.6, +0.9, -1.7, +9.6,
# 0.0 points; under the held-out scheme (car_not_below_plain_heldout): +11.3, +11.3, -0.9, +7.0, +7.8
# (docs/reproductions/car_lora.json). Their verdicts across seeds are `ladder reproduce`'s to report,
# not a test's.


def assert_drift_moved_every_projection_and_nothing_else(drifted: Path, base: Path) -> None:
    """The drifted base is another model, as a fact about weights: the drift LoRA was merged into
    every block projection (each one differs from the base's) and into nothing else (embeddings,
    norms and the head are the base's, bit for bit). An accuracy on a few held-out items cannot
    say this: two different models can tie on it."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from components.basemodel import projections

    with torch.device("meta"):
        names = {f"{n}.weight" for n in projections(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base)))}
    before, after = load_file(base / "model.safetensors"), load_file(drifted / "model.safetensors")
    assert set(before) == set(after) and names <= set(after), sorted(set(before) ^ set(after))
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved == names, (sorted(names - moved), sorted(moved - names))


@pytest.mark.slow
def test_smoke_reproduction_holds_and_builds_the_drifted_base_once(workdir, tiny_base):
    from orchestrator.reproduction.reproduce import reproduce
    from workloads.car_lora.drift import META_FILE, drift_dir, ensure_drifted

    rep = reproduce("car_lora", smoke=True, local=True)
    assert not rep.failed_trials
    assert sorted(t["adapter"] for t in rep.trials) == sorted(["plain", "car", *SMOKE_SCHEMES])
    by = {c.name: c for c in rep.claims}
    for claim in rep.claims:
        assert claim.judged and all(math.isfinite(v) for v in claim.measured.values()), claim
    # These three hold at every calibration seed (100-104, docs/reproductions/car_lora.notes.md). Margins:
    # worst gap to the per-scheme adapter -8.7 points (threshold -11), gain under the harshest quantiser
    # worst +16.5 (threshold +10), gain on the most damaging scheme worst +16.5 (threshold +10).
    for name in ("car_near_per_scheme", "car_beats_plain_under_quant", "car_beats_plain_on_most_damaging"):
        assert by[name].holds, (name, by[name].measured)
    # the scheme really hurts plain LoRA; margin: worst 0.252 over seeds 100-104 (threshold 0.15)
    assert by["car_beats_plain_on_most_damaging"].measured["plain_drop"] >= 0.15
    # 2-bit groups of 16 are the quantiser that hurts plain LoRA, and they hurt it for real; int8 does
    # not. Margins over seeds 100-104: int2g16 drop worst 0.261 (threshold 0.15), int8 drop at most 0.009 (0.05).
    quant = by["car_beats_plain_under_quant"].measured
    assert quant["most_damaging_quant_is_int2g16"] == 1.0 and quant["plain_drop"] >= 0.15, quant
    assert quant["plain_drop_int8"] < 0.05, quant
    # Under the held-out scheme CAR is not below plain LoRA by more than 5 points (the notes' former
    # per-scheme tolerance; the claim's own threshold 0 failed at a seed). Margin: worst -0.9 points over
    # seeds 100-104 (threshold -5).
    heldout = by["car_not_below_plain_heldout"].measured
    assert heldout["gain"] >= -0.05, heldout
    for t in rep.trials:
        assert t["eval/base_acc"] < 0.3  # the base alone cannot do the task; margin: worst 0.209 over seeds 100-104
        # margin: plain and CAR worst 0.922 over seeds 100-104 (threshold 0.6)
        assert t["eval/acc/none"] > 0.6 or t["adapter"] in smoke().schemes
    folder = drift_dir(smoke())
    assert (folder / META_FILE).exists()
    built = (folder / META_FILE).stat().st_mtime
    assert ensure_drifted(smoke()) == folder and (folder / META_FILE).stat().st_mtime == built
    assert_drift_moved_every_projection_and_nothing_else(folder, tiny_base)
    drift = by["car_not_below_plain_drift"].measured
    # drift costs plain LoRA accuracy; margin: worst 0.113 over seeds 100-104 (threshold 0.03)
    assert drift["plain_drop"] > 0.03
    # What does hold at every seed measured: on the drifted base compressed by the in-set schemes, CAR's
    # adapter is ahead of plain LoRA's on average. Margin: worst +4.2 points over seeds 100-104 (+9.9,
    # +4.5, +4.2, +9.5, +8.8; threshold 0). car_not_below_plain_drift itself: see above.
    assert drift["car_compressed_mean"] - drift["plain_compressed_mean"] > 0.0, drift


# --- task files, a second architecture, real compression, the full-size sweep ---------------------


def gsm8k_records(n: int, seed: int = 0) -> list[dict]:
    """GSM8K-shaped records (`question`, `answer` ending `#### <number>`) of small sums."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        out.append({"question": f"what is {a} plus {b} ?", "answer": f"{a} + {b} = {a + b} . #### {a + b}"})
    return out


@pytest.fixture(scope="module")
def gpt2_task(tmp_path_factory):
    """A tiny GPT-2 folder (Conv1D projections, BPE tokenizer), a GSM8K-style JSONL and a drift text."""
    from components.basemodel import write_jsonl
    from components.basemodel.toy import save_tiny_gpt2

    root = tmp_path_factory.mktemp("car-gpt2")
    records = gsm8k_records(40)
    drift = [f"the number {i} comes after {i - 1} and before {i + 1} ." for i in range(1, 30)]
    texts = [f"Question: {r['question']}\nAnswer: {r['answer']}" for r in records] + drift
    folder = save_tiny_gpt2(root / "gpt2", texts, vocab_size=300, positions=96)
    (root / "drift.txt").write_text("\n".join(drift) + "\n")
    return folder, write_jsonl(root / "gsm8k.jsonl", records), root / "drift.txt"


def gpt2_config(gpt2_task, **change) -> Config:
    folder, task, drift = gpt2_task
    cfg = Config(base=str(folder), task_path=str(task), task_format="gsm8k", schemes=("int8", "skip"),
                 heldout_scheme="colprune", steps=24, car_steps_factor=2.0, batch=16, lr=1e-2, weight_decay=0.0,
                 gen_tokens=4, drift_path=str(drift), drift_steps=4, drift_batch=4, drift_seq_len=16,
                 drift_schemes=False, log_every=6, seed=shifted())
    return dataclasses.replace(cfg, **change)


def test_gpt2_folder_and_a_gsm8k_file_run_the_real_sweeps_code_and_the_claims(gpt2_task, workdir, monkeypatch,
                                                                              model_copies):
    from orchestrator.runners import launch
    from workloads.car_lora.compress import CompressedLinear

    monkeypatch.setenv("LADDER_CACHE", str(workdir / "cache"))  # the GPT-2's drifted base, not tiny-local's
    registry.load("car_lora").preflight(gpt2_config(gpt2_task))
    trials = []
    for adapter in ("plain", "car", "int8", "skip"):
        cfg = gpt2_config(gpt2_task, adapter=adapter)
        res = launch.run_local("car_lora", cfg, progress=False, track=False)
        losses = [m["train/loss"] for _, m in res.history if "train/loss" in m]
        # margin: worst last/first train loss 0.987 over seeds 1-5 (threshold 1.0)
        assert len(losses) >= 3 and losses[-1] < losses[0], (adapter, losses)
        trials.append({**dataclasses.asdict(cfg), **res.metrics})
    assert model_copies.peak <= 2, model_copies.peak
    m = trials[0]
    for key in ("eval/acc/none", "eval/loss/int8", "eval/acc/colprune", "eval/drift_acc/none", "eval/base_loss"):
        assert math.isfinite(m[key]), key
    for t in trials:  # every adapter learnt the answers' tokens (a random GPT-2 knows none: 5.73 nats)
        # margin: worst base minus adapter loss 0.321 nats over seeds 1-5 (threshold 0.1)
        assert t["eval/loss/none"] < t["eval/base_loss"] - 0.1, (t["adapter"], t["eval/loss/none"])
    # The drifted base is another model, by its weights (a loss on a few held-out items could tie).
    from workloads.car_lora.drift import META_FILE, drift_dir

    drifted = drift_dir(gpt2_config(gpt2_task))
    assert (drifted / META_FILE).exists() and drifted.is_relative_to(workdir / "cache"), drifted
    assert_drift_moved_every_projection_and_nothing_else(drifted, gpt2_task[0])
    for claim in CLAIMS:
        holds, measured = claim(trials)
        assert isinstance(holds, bool) and measured and all(math.isfinite(v) for v in measured.values()), claim
    # The compressor wraps GPT-2's Conv1D projections (4 per block) through a transposed view.
    from workloads.car_lora.workload import adapted as make

    model, _, comp = make(gpt2_config(gpt2_task, lora_r=2), gpt2_task[0].as_posix(), torch.device("cpu"))
    assert len(comp.linears) == 2 * 4 and all(isinstance(v, CompressedLinear) for v in comp.linears.values())
    attn = model.base_model.model.transformer.h[0].attn.c_attn
    assert attn.base_layer.weight.shape == (96, 32)  # [out, in]: Conv1D's [32, 96] seen transposed


def test_gsm8k_final_number_and_the_file_formats(tmp_path):
    from components.basemodel import write_jsonl
    from workloads.car_lora.data import file_examples, final_number

    assert final_number("so 3,200 + 4 = 3204 #### 3,204") == "3204" and final_number("#### -7") == "-7"
    assert final_number("no mark 12") is None
    alpaca = write_jsonl(tmp_path / "alpaca.jsonl", [{"instruction": "Add them.", "input": "2 and 3", "output": "5"},
                                                     {"instruction": "Say hi.", "output": "hi"}])
    with_input, plain = file_examples(str(alpaca), fmt="instruction")
    assert "### Input:\n2 and 3\n\n### Response:" in with_input.prompt and with_input.answer == "5"
    assert "### Input" not in plain.prompt and plain.prompt.endswith("### Response:")
    (q,) = file_examples(str(write_jsonl(tmp_path / "g.jsonl", gsm8k_records(1))), fmt="gsm8k")
    assert q.prompt.startswith("Question: what is") and q.prompt.endswith("\nAnswer:")


def test_tiny_local_learns_a_saved_dataset_task_through_the_same_code(tiny_base, workdir):
    import datasets

    from orchestrator.runners import launch
    from components.basemodel import base_world

    seed = shifted()  # the split and the adapter's training move with LADDER_TEST_SEED_SHIFT
    train_ex, held_ex = task_examples(base_world("tiny-local"), "ask", heldout_frac=0.3, seed=seed)
    to_rows = lambda exs: [{"prompt": e.prompt, "answer": e.answer} for e in exs]  # noqa: E731
    folder = workdir / "ask"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(to_rows(train_ex)),
                          "test": datasets.Dataset.from_list(to_rows(held_ex[:40]))}).save_to_disk(str(folder))
    cfg = Config(adapter="plain", task_path=str(folder), eval_path=str(folder), steps=30, drift=False, log_every=10,
                 seed=seed)
    registry.load("car_lora").preflight(cfg)
    res = launch.run_local("car_lora", cfg, progress=False, track=False)
    losses = [m["train/loss"] for _, m in res.history if "train/loss" in m]
    assert losses[-1] < losses[0], losses  # margin: worst last/first 0.408 over seeds 1-5 (threshold 1.0)
    m = res.metrics
    # held-out pairs, answered from the base's knowledge; margin: worst gain 0.675 over seeds 1-5 (threshold 0.2)
    assert m["eval/acc/none"] > m["eval/base_acc"] + 0.2, m
    assert m["eval/loss/none"] < m["eval/base_loss"]  # margin: worst gap 5.55 nats over seeds 1-5 (threshold 0)


def test_bad_task_files_models_and_bitsandbytes_are_refused_before_any_work(gpt2_task, tmp_path, monkeypatch):
    from components.basemodel import write_jsonl

    pre = registry.load("car_lora").preflight
    no_answer = write_jsonl(tmp_path / "a.jsonl", [{"question": "what is 1 plus 1 ?", "solution": "2"}])
    with pytest.raises(ConfigError, match="no 'answer' field"):
        pre(gpt2_config(gpt2_task, task_path=str(no_answer)))
    no_mark = write_jsonl(tmp_path / "b.jsonl", [{"question": "what is 1 plus 1 ?", "answer": "1 + 1 = 2"}])
    with pytest.raises(ConfigError, match="record 0: field 'answer' has no final '#### <number>'"):
        pre(gpt2_config(gpt2_task, task_path=str(no_mark)))
    with pytest.raises(ConfigError, match=r"lora_targets \['q_proj'\] are not linear projection kinds.*'c_attn'"):
        pre(gpt2_config(gpt2_task, lora_targets="q_proj,c_fc"))
    with pytest.raises(ConfigError, match="no 'text' field"):
        pre(gpt2_config(gpt2_task, drift_path=str(no_mark)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"bnb_schemes=\('nf4',\).*pip install bitsandbytes.*no CUDA GPU"):
        pre(gpt2_config(gpt2_task, bnb_schemes=("nf4",)))
    with pytest.raises(ValueError, match="needs drift_path"):
        validate(gpt2_config(gpt2_task, drift_path=""))
    with pytest.raises(ValueError, match="bnb_schemes must list"):
        validate(gpt2_config(gpt2_task, bnb_schemes=("int4",)))


def test_the_real_sweep_is_valid_anywhere_and_names_what_it_needs(workdir, monkeypatch):
    from conftest import REPO
    from orchestrator.sweep import load_sweep_file
    from orchestrator.sweeps.tune_run import launch_problems

    monkeypatch.setenv("LADDER_DATA", str(workdir / "data"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(workdir / "empty-cache"))
    sweep = load_sweep_file(REPO / "sweeps" / "repro" / "car_lora_real.py")
    sweep.check()
    base = sweep.base_config()
    assert base.dtype == "bfloat16" and base.task_format == "gsm8k" and sweep.gpus_per_worker == 1
    (problem,) = [p for p in launch_problems(sweep) if "base=" in p]
    assert "base='meta-llama/Llama-3.1-8B' is neither a folder" in problem
    assert f"task_path='{workdir / 'data' / 'gsm8k'}' does not exist" in problem
    assert f"drift_path='{workdir / 'data' / 'wikitext-2-raw'}' does not exist" in problem
