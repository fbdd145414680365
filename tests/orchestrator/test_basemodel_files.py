"""The LLM workloads' shared reach beyond tiny-local: projections found on any architecture, task
files read and refused field by field, and the tiny GPT-2 folder the tests use as a second model."""

from __future__ import annotations

import json

import pytest
import torch

from components.basemodel import (
    LLAMA_LINEAR_TYPES, TaskFileError, as_linear, base_kinds, check_records, kinds, load_base, lora, projections,
    read_records, select, weight_oi, write_jsonl,
)
from components.basemodel.adapters import blocks, features, is_projection_module
from components.basemodel.toy import save_tiny_gpt2


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=40, n_positions=16)).eval()


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=24, num_hidden_layers=3,
                                        num_attention_heads=2, num_key_value_heads=1, vocab_size=40))


def _opt():
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    return OPTForCausalLM(OPTConfig(hidden_size=16, ffn_dim=24, num_hidden_layers=2, num_attention_heads=2,
                                    vocab_size=40, word_embed_proj_dim=16, max_position_embeddings=32))


def test_projections_are_asked_of_the_model_on_three_architectures():
    llama, gpt2, opt = _llama(), _gpt2(), _opt()
    assert kinds(llama) == list(LLAMA_LINEAR_TYPES)
    assert kinds(gpt2) == ["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"]
    assert kinds(opt) == ["k_proj", "v_proj", "q_proj", "out_proj", "fc1", "fc2"]
    for model, n_layers in ((llama, 3), (gpt2, 2), (opt, 2)):
        found = projections(model)
        assert len(found) == n_layers * len(kinds(model))
        assert sorted({p.layer for p in found.values()}) == list(range(n_layers))
        head = model.get_output_embeddings()
        assert all(p.module is not head for p in found.values())
        # Every nn.Linear / Conv1D of the model but the head is a projection: nothing is missed.
        every = {n for n, m in model.named_modules() if is_projection_module(m) and m is not head}
        assert set(found) == every
    c_proj = projections(gpt2)["transformer.h.1.attn.c_proj"]
    assert (c_proj.kind, c_proj.layer, c_proj.in_features, c_proj.out_features) == ("attn.c_proj", 1, 16, 16)
    assert features(projections(gpt2)["transformer.h.0.attn.c_attn"].module) == (16, 48)


def test_a_model_without_a_declared_block_class_falls_back_to_its_list_of_blocks():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(4, 8), torch.nn.Linear(8, 4)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(3, 4)
            self.stack = torch.nn.ModuleList(Block() for _ in range(3))
            self.head = torch.nn.Linear(4, 2)

    net = Net()
    assert [n for n, _ in blocks(net)] == ["stack.0", "stack.1", "stack.2"]
    assert kinds(net) == ["up", "down"] and len(projections(net)) == 6
    with pytest.raises(ValueError, match="cannot tell its projections apart"):
        projections(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))


def test_conv1d_views_and_wrappers_compute_the_modules_own_map():
    gpt2 = _gpt2()
    p = projections(gpt2)["transformer.h.0.mlp.c_fc"]
    x = torch.randn(5, p.in_features)
    lin = as_linear(p.module)
    assert isinstance(lin, torch.nn.Linear) and lin.weight.data_ptr() == p.module.weight.data_ptr()
    assert torch.allclose(lin(x), p.module(x), atol=1e-6)
    with torch.no_grad():
        weight_oi(p.module).add_(1.0)  # an edit of the [out, in] view reaches the module
    assert torch.allclose(lin(x), p.module(x), atol=1e-6)
    assert torch.allclose(p.module(x), x @ weight_oi(p.module).T + p.module.bias, atol=1e-5)
    with pytest.raises(TypeError, match="not a linear projection"):
        weight_oi(torch.nn.LayerNorm(4))


def test_lora_on_gpt2_targets_kinds_and_merges_into_the_conv1d_weights():
    gpt2 = _gpt2()
    before = {n: weight_oi(p.module).detach().clone() for n, p in projections(gpt2).items()}
    pm = lora(gpt2, ["attn.c_proj", "c_fc"], r=2, alpha=4)
    wrapped = {n for n, _ in pm.named_modules() if n.endswith(".lora_A")}
    assert len(wrapped) == 4 and all(("attn.c_proj" in n) or ("c_fc" in n) for n in wrapped)
    with torch.no_grad():
        for name, param in pm.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    ids = torch.randint(0, 40, (2, 6))
    adapted = pm(input_ids=ids).logits
    merged = pm.merge_and_unload()
    assert torch.allclose(merged(input_ids=ids).logits, adapted, atol=1e-5)
    changed = {n for n, p in projections(merged).items() if not torch.equal(weight_oi(p.module), before[n])}
    assert changed == {n for n in before if n.endswith(("attn.c_proj", "c_fc"))}
    # On the peft model: the same projections, the adapted ones through their base layers, no LoRA factor.
    fresh = lora(_gpt2(), ["attn.c_proj"], r=2)
    on_peft = projections(fresh)
    assert [(n.removeprefix("base_model.model."), p.kind) for n, p in on_peft.items()] == [
        (n, p.kind) for n, p in projections(_gpt2()).items()]
    assert all(is_projection_module(p.module) for p in on_peft.values()) and kinds(fresh) == kinds(_gpt2())
    with pytest.raises(ValueError, match=r"\['q_proj'\] are not linear projection kinds of GPT2LMHeadModel; choose among"):
        lora(_gpt2(), ["q_proj"])
    assert len(select(_llama(), ["q_proj", "down_proj"])) == 6


def test_base_kinds_reads_a_config_without_building_weights(tmp_path):
    _opt().save_pretrained(tmp_path / "opt")
    assert base_kinds(str(tmp_path / "opt")) == ["k_proj", "v_proj", "q_proj", "out_proj", "fc1", "fc2"]
    assert base_kinds("tiny-local") == list(LLAMA_LINEAR_TYPES)


def test_the_tiny_gpt2_folder_loads_and_keeps_prompts_as_prefixes(tmp_path):
    from components.basemodel.answers import answer_loss, encode_answers

    texts = [f"question : what is {a} plus {b} ? answer : {a + b}" for a in range(9) for b in range(9)]
    save_tiny_gpt2(tmp_path / "g", texts, positions=32)
    model, tok = load_base(str(tmp_path / "g"))
    assert type(model).__name__ == "GPT2LMHeadModel" and kinds(model)[0] == "c_attn"
    assert tok.pad_token is not None and model.config.n_positions == 32
    batch = encode_answers([("question : what is 3 plus 4 ? answer :", "7"), ("a new word :", "zebracorn")], tok)
    assert int((batch.labels[1] != -100).sum()) > 1  # an unseen word is several tokens
    assert 2.0 < float(answer_loss(model, batch)) < 10.0
    again = tmp_path / "g2"
    save_tiny_gpt2(again, texts, positions=32)  # seeded: the same weights
    other, _ = load_base(str(again))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))


FIELDS = {"prompt": str, "answer": str}


def test_task_records_read_from_jsonl_and_from_saved_datasets(tmp_path):
    import datasets

    rows = [{"prompt": f"p{i}", "answer": f"a{i}", "extra": i} for i in range(5)]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    assert read_records(str(path), FIELDS) == rows
    assert read_records(str(path), FIELDS, limit=2) == rows[:2]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:3]), "test": datasets.Dataset.from_list(rows[3:])}
                         ).save_to_disk(str(tmp_path / "dd"))
    assert read_records(str(tmp_path / "dd"), FIELDS, split="test") == rows[3:]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    assert [r["answer"] for r in read_records(str(tmp_path / "one"), FIELDS)] == [f"a{i}" for i in range(5)]
    check_records(str(tmp_path / "dd"), {"prompt": str, "extra": int}, split="train")


@pytest.mark.parametrize("content, match", [
    ('{"prompt": "p", "answer": "a"}\n{"prompt": "q"}\n', r"t.jsonl' line 2 has no 'answer' field \(fields: \['prompt'\]\)"),
    ('{"prompt": "p", "answer": 3}\n', r"line 1: field 'answer' is int 3, not a string"),
    ('{"prompt": "p", "answer": "a"}\n{"prompt": \n', r"line 2 is not valid JSON"),
    ('["p", "a"]\n', r"line 1 is not a JSON object"),
    ("\n\n", r"holds no records"),
])
def test_a_bad_jsonl_record_is_refused_naming_the_line_and_field(tmp_path, content, match):
    (tmp_path / "t.jsonl").write_text(content)
    with pytest.raises(TaskFileError, match=match) as err:
        check_records(str(tmp_path / "t.jsonl"), FIELDS)
    assert "prompt (string), answer (string)" in str(err.value)


def test_a_bad_path_or_saved_dataset_is_refused_naming_the_fix(tmp_path):
    import datasets

    (tmp_path / "t.csv").write_text("prompt,answer\n")
    with pytest.raises(TaskFileError, match=r"suffix '.csv'.*name it .jsonl"):
        check_records(str(tmp_path / "t.csv"), FIELDS)
    with pytest.raises(TaskFileError, match=r"task_path='.*nope.jsonl' does not exist on this machine"):
        check_records(str(tmp_path / "nope.jsonl"), FIELDS)
    (tmp_path / "folder").mkdir()
    with pytest.raises(TaskFileError, match="not one datasets' save_to_disk wrote"):
        check_records(str(tmp_path / "folder"), FIELDS, what="eval_path")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"prompt": ["p"], "output": ["a"]})}).save_to_disk(
        str(tmp_path / "dd"))
    with pytest.raises(TaskFileError, match=r"has columns \['prompt', 'output'\], no \['answer'\]"):
        check_records(str(tmp_path / "dd"), FIELDS)
    with pytest.raises(TaskFileError, match=r"splits \['train'\], not task_split='test'"):
        check_records(str(tmp_path / "dd"), {"prompt": str}, split="test")
    assert json.loads((tmp_path / "dd" / "dataset_dict.json").read_text())["splits"] == ["train"]


def test_the_model_copies_fixture_counts_whole_models(model_copies):
    """The fixture the LLM workloads' tests bound their memory with: a GPT2LMHeadModel is one
    model (not two with its GPT2Model), a deep copy is another, a dropped one no longer counts."""
    import copy

    first = _gpt2()
    assert model_copies.peak == 1
    second = copy.deepcopy(first)
    assert model_copies.peak == 2 and model_copies.count() == 2
    del second
    third = _llama()
    assert model_copies.peak == 2 and model_copies.count() == 2
    del first, third
    assert model_copies.count() == 0
