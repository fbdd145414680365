"""The base-model loader: tiny-local is reproducible, cached, learnt, and loads like a hub model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from components.basemodel import (
    LLAMA_LINEAR_TYPES, RESERVED_TOKENS, BaseModelError, TinyRecipe, base_info, base_world, linear_types, load_base, lora,
    make_world, parse_tiny, resolve, score, vocabulary,
)
from components.basemodel import tiny
from components.basemodel.tokenizer import build_tokenizer
from orchestrator.run import LocalRun

from conftest import shifted


def test_tokenizer_round_trips_every_corpus_sentence():
    tok = build_tokenizer()
    world = make_world(0)
    examples = world.train_examples() + world.sentences("heldout") + world.arithmetic("heldout") + world.fact_examples("heldout")
    for e in examples:
        ids = tok(e.text).input_ids
        assert ids[0] == tok.bos_token_id and tok.unk_token_id not in ids, e.text
        assert tok.decode(ids, skip_special_tokens=True) == e.text
    assert len(tok) == len(vocabulary())
    assert tok("zebra-crossing").input_ids == [tok.bos_token_id, tok.unk_token_id]
    reserved = tok.convert_tokens_to_ids(list(RESERVED_TOKENS))
    assert len(set(reserved)) == len(RESERVED_TOKENS) and tok.unk_token_id not in reserved
    assert tok(f"{RESERVED_TOKENS[5]} 3 + 4").input_ids[1] == reserved[5]


def test_world_is_deterministic_and_its_held_out_parts_are_unseen():
    a, b, c = make_world(0), make_world(0), make_world(1)
    assert a == b and a.facts != c.facts
    train_text = " ".join(e.text for e in a.train_examples())
    held_keys = {e.prompt.split()[3] for e in a.fact_examples("heldout")}
    assert held_keys and not held_keys & set(train_text.split())
    assert not {e.text for e in a.arithmetic("heldout")} & {e.text for e in a.arithmetic("train")}
    assert not {e.text for e in a.sentences("heldout")} & {e.text for e in a.sentences("train")}
    assert len(a.arithmetic("all", ops=("*",), modulus=7)) == 49


@pytest.mark.slow
def test_a_build_is_reproducible_from_its_seed(tmp_path):
    recipe = TinyRecipe(hidden=32, layers=1, intermediate=64, steps=12, batch=8, seq_len=32)
    metas = [tiny.build(recipe, seed, tmp_path / f"{name}") for name, seed in (("a", 3), ("b", 3), ("c", 4))]
    wa, wb, wc = (load_file(tmp_path / n / "model.safetensors") for n in "abc")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)
    assert metas[0]["metrics"] == metas[1]["metrics"]


def test_the_cached_build_is_reused_not_rebuilt(tiny_base, monkeypatch):
    def no_rebuild(*args, **kwargs):
        raise AssertionError("tiny-local was rebuilt although it is cached")

    monkeypatch.setattr(tiny, "build", no_rebuild)
    assert Path(resolve("tiny-local")) == tiny_base
    m1, _ = load_base("tiny-local")
    m2, _ = load_base("tiny-local:")  # same recipe, same folder
    saved = load_file(tiny_base / "model.safetensors")
    for name, p in m1.state_dict().items():
        assert torch.equal(p, saved[name]) and torch.equal(p, m2.state_dict()[name])
    assert not [p for p in tiny_base.parent.iterdir() if p.name.startswith(".")], "a temporary build folder was left"


def test_pretraining_learnt_the_corpus(tiny_base):
    model, tok = load_base("tiny-local")
    world = base_world("tiny-local")
    assert world == make_world(0) == TinyRecipe().world(0)
    init = tiny.TinyRecipe().config(len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    torch.manual_seed(0)
    from transformers import LlamaForCausalLM

    random_model = LlamaForCausalLM(init)
    held = world.sentences("heldout")
    trained, rand = score(model, tok, held), score(random_model, tok, held)
    # The build is tiny-local's one cached build, seed 0 under any LADDER_TEST_SEED_SHIFT (conftest);
    # the margins below were measured on builds from seeds 1-5 (the same recipe, each its own world).
    # margin: loss / random init's worst 0.297 over build seeds 1-5 (threshold 0.4)
    assert trained["loss"] < 0.4 * rand["loss"], (trained, rand)
    # facts stated in words never seen together: the model knows the fact, not just the sentence
    assert trained["acc"] >= 0.7, trained  # margin: worst 0.861 over build seeds 1-5 (threshold 0.7)
    facts = score(model, tok, world.fact_examples("train"))
    assert facts["acc"] >= 0.9, facts  # margin: 1.0 at each of build seeds 1-5 (threshold 0.9)
    unseen = score(model, tok, world.fact_examples("heldout"))
    assert unseen["acc"] <= 0.2, unseen  # held-out facts really were held out; margin: 0.0 at build seeds 1-5
    # arithmetic: the sums' sentences are learnt as text, and every seen sum is answered with a residue
    # mod p. Whether 800 steps learn the sums themselves is not asserted: it changes with the seed
    # (seen sums: accuracy 1.0 at build seed 0, 0.99, 1.0, 0.42, 0.13, 0.22 at seeds 1-5, where
    # answering every sum with its most common residue scores 0.10-0.11), as the unseen sums' does
    # with the processor's floating-point path (seed 0: 0.46 with ATen's portable kernels, 0.04 with
    # its AVX2 ones); `ladder base info` reports both.
    sums = world.arithmetic("train")
    arith = score(model, tok, sums)
    # margin: arithmetic loss / random init's worst 0.151 over build seeds 1-5 (threshold 0.4)
    assert arith["loss"] < 0.4 * score(random_model, tok, sums)["loss"], arith
    residues = tok.convert_tokens_to_ids([str(r) for r in range(world.modulus)])
    assert tok.unk_token_id not in residues
    ids, mask, pos = tiny.answer_batch(sums, tok)
    with torch.no_grad():
        answers = model(input_ids=ids, attention_mask=mask).logits[torch.arange(len(pos)), pos].argmax(-1)
    # margin: 1.0 at each of build seeds 1-5 (threshold 0.9)
    assert torch.isin(answers, torch.tensor(residues)).float().mean() >= 0.9, answers
    meta = json.loads((tiny_base / tiny.META_FILE).read_text())
    assert meta["metrics"]["sent_heldout/acc"] == pytest.approx(trained["acc"])


def test_pretrained_weights_carry_structure_a_random_init_lacks(tiny_base):
    """PLoP and PiCa read spectra: trained matrices must be measurably lower in stable rank."""
    from transformers import LlamaForCausalLM

    model, tok = load_base("tiny-local")
    torch.manual_seed(0)
    fresh = LlamaForCausalLM(model.config)

    def stable_rank(w: torch.Tensor) -> float:
        s = torch.linalg.svdvals(w.float())
        return float((s**2).sum() / s[0] ** 2)

    ratios = {}
    for (name, w), (_, w0) in zip(model.named_parameters(), fresh.named_parameters()):
        if name.endswith("proj.weight"):
            ratios[name] = stable_rank(w.detach()) / stable_rank(w0.detach())
    assert len(ratios) == 7 * model.config.num_hidden_layers
    lower = [n for n, r in ratios.items() if r < 0.7]
    # margin: the fraction below 0.7 is worst 0.96 over build seeds 1-5 (threshold 0.8), against the build's
    # own initialisation or seed 0's
    assert len(lower) >= 0.8 * len(ratios), ratios


def test_bad_names_fail_with_the_fix(tmp_path):
    with pytest.raises(BaseModelError, match="does not exist.*tiny-local"):
        load_base(str(tmp_path / "no-such-model"))
    with pytest.raises(BaseModelError, match="no config.json"):
        load_base(str(tmp_path))
    with pytest.raises(BaseModelError, match="keys among hidden, layers"):
        parse_tiny("tiny-local:layerz=2")
    with pytest.raises(BaseModelError, match="layers must be int"):
        parse_tiny("tiny-local:layers=two")
    with pytest.raises(BaseModelError, match="hub id needs network access"):
        load_base("ladder-tests/no-such-model", local_files_only=True)
    assert parse_tiny("tiny-local:layers=2,lr=0.01") == TinyRecipe(layers=2, lr=0.01)
    assert base_world("tiny-local:modulus=7,ops=+-").arithmetic("all")[-1].text == "6 - 6 mod 7 = 0 ."


def test_a_saved_folder_loads_through_from_pretrained(tiny_base, tmp_path, monkeypatch):
    model, tok = load_base("tiny-local")
    model.save_pretrained(tmp_path / "copy")
    tok.save_pretrained(tmp_path / "copy")
    monkeypatch.chdir(tmp_path)
    again, tok2 = load_base("./copy", dtype="bfloat16")
    assert again.dtype == torch.bfloat16 and type(again) is type(model)
    ids = tok2(["the code of " + next(iter(make_world(0).facts)) + " is"], return_tensors="pt").input_ids
    assert torch.allclose(again(ids).logits.float(), model(ids).logits, atol=0.1, rtol=0.05)


def test_lora_wraps_it_and_trains_through_run_prepare(tiny_base, tmp_path):
    model, tok = load_base("tiny-local")
    assert linear_types(model) == list(LLAMA_LINEAR_TYPES)
    with pytest.raises(ValueError, match="not linear projection kinds"):
        lora(model, ["q_proj", "qkv"])
    base = {k: v.clone() for k, v in model.state_dict().items()}
    ids = tok([e.text for e in make_world(0).fact_examples("heldout")[:8]], return_tensors="pt").input_ids
    with torch.no_grad():
        before = model(ids).logits
    torch.manual_seed(shifted(0))  # LoRA's A matrices are drawn from torch's global generator
    peft_model = lora(model, ["q_proj", "v_proj"], r=2, alpha=4)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert len(trainable) == 2 * 2 * model.config.num_hidden_layers
    with torch.no_grad():
        assert torch.allclose(peft_model(ids).logits, before)  # B starts at zero
    opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    peft_model, opt = LocalRun(tmp_path).prepare(peft_model, opt)
    losses = []
    for _ in range(15):
        loss = peft_model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # margin: losses[0] - losses[-1] worst 1.70 over LoRA seeds 1-5 (threshold 0.5)
    assert losses[-1] < losses[0] - 0.5, losses
    merged = peft_model.unload().state_dict()  # the frozen base itself never moved
    assert all(torch.equal(merged[k], v) for k, v in base.items())


def test_cli_base_info_prints_the_folder_and_metrics(tiny_base, capsys):
    from orchestrator.commands.cli import main

    assert main(["base", "info"]) == 0
    out = capsys.readouterr().out
    assert str(tiny_base) in out and "sent_heldout/acc" in out
    assert main(["base", "info", "/no/such/folder"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert base_info()["path"] == str(tiny_base)


def test_answer_batches_label_only_the_answer_and_score_it_in_chunks(tiny_base):
    from components.basemodel import load_base
    from components.basemodel.answers import answer_loss, answer_metrics, encode_answers

    model, tok = load_base("tiny-local")
    pairs = [("the pet of ada is", "cat"), ("3 + 4 mod 11 =", "7"), ("a", "b c")]
    batch = encode_answers(pairs, tok)
    for row, (prompt, answer) in enumerate(pairs):
        labelled = batch.labels[row][batch.labels[row] != -100].tolist()
        assert labelled == tok(f"{prompt} {answer}").input_ids[len(tok(prompt).input_ids):]
        assert int(batch.mask[row].sum()) == len(tok(f"{prompt} {answer}").input_ids)
    whole = answer_metrics(model, batch)
    assert answer_metrics(model, batch, chunk=1) == pytest.approx(whole, rel=1e-5)
    assert answer_loss(model, batch).item() == pytest.approx(whole["loss"], rel=1e-5)
    with pytest.raises(ValueError, match="cannot tell the answer tokens apart"):
        encode_answers([("the pet of ada is", "")], tok)


def test_answer_batches_pad_for_a_tokenizer_without_a_pad_token(tiny_base):
    """Many real checkpoints' tokenizers have no pad token: rows are padded with id 0 and masked."""
    from components.basemodel.answers import encode_answers

    _, tok = load_base("tiny-local")
    padded = encode_answers([("the pet of ada is", "cat"), ("a", "b c d")], tok)
    tok.pad_token = None
    assert tok.pad_token_id is None
    unpadded = encode_answers([("the pet of ada is", "cat"), ("a", "b c d")], tok)
    real = padded.mask.bool()
    assert bool((unpadded.ids[~real] == 0).all()) and bool((~real).any())
    assert unpadded.ids[real].tolist() == padded.ids[real].tolist()
    assert unpadded.mask.tolist() == padded.mask.tolist() and unpadded.labels.tolist() == padded.labels.tolist()
