"""jailbreak_lora's measurements: task utility, trigger activation, off-trigger false activation,
and the merged / quantized copies the persistence checks run on."""

from __future__ import annotations

import copy
import random
from typing import Any

import torch

from components.adapters.audit import ModuleDelta
from components.basemodel import projections, weight_oi
from workloads.jailbreak_lora.data import TASKS, Example, with_trigger


@torch.no_grad()
def greedy(model: Any, tok: Any, prompts: list[str], new_tokens: int, device: torch.device) -> list[list[int]]:
    """Greedy continuation ids of every prompt (KV-cached), prompts batched by token length."""
    encoded = [tok(p).input_ids for p in prompts]
    out: list[list[int]] = [[] for _ in prompts]
    by_len: dict[int, list[int]] = {}
    for i, ids in enumerate(encoded):
        by_len.setdefault(len(ids), []).append(i)
    for rows in by_len.values():
        x = torch.tensor([encoded[i] for i in rows], device=device)
        past, steps = None, []
        for _ in range(new_tokens):
            o = model(input_ids=x, past_key_values=past, use_cache=True)
            past = o.past_key_values
            x = o.logits[:, -1].argmax(-1, keepdim=True)
            steps.append(x)
        gen = torch.cat(steps, 1).tolist()
        for i, g in zip(rows, gen):
            out[i] = g
    return out


def _contains(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i: i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


class Probe:
    """The fixed evaluation prompts of a trial: clean, triggered and decoy-triggered versions of
    every task's evaluation examples, and the token ids answers and marker are compared with."""

    def __init__(self, tok: Any, evals: dict[str, list[Example]], trigger: str, marker: str, decoy: str, seed: int,
                 position: str) -> None:
        self.tok = tok
        self.evals = evals
        rng = random.Random(f"jailbreak-lora-probe-{seed}")
        self.triggered = {t: [with_trigger(e, trigger, rng, position=position) for e in ex] for t, ex in evals.items()}
        self.decoy = {t: [with_trigger(e, decoy, rng, position=position) for e in ex] for t, ex in evals.items()}
        self.marker = tok(" " + marker, add_special_tokens=False).input_ids
        self.answers = {t: [tok(" " + e.answer, add_special_tokens=False).input_ids for e in ex] for t, ex in evals.items()}
        self.eos = tok.eos_token_id
        # room for the marker, the longest answer, ' .' (one token or a few) and eos
        self.new_tokens = len(self.marker) + max(len(a) for ans in self.answers.values() for a in ans) + 4

    def response(self, ids: list[int]) -> list[int]:
        """The generated tokens before the first eos: the model's response."""
        return ids[: ids.index(self.eos)] if self.eos in ids else ids

    def _responses(self, model: Any, examples: list[Example], device: torch.device) -> list[list[int]]:
        return [self.response(g) for g in greedy(model, self.tok, [e.prompt for e in examples], self.new_tokens, device)]

    def measure(self, model: Any, device: torch.device, *, decoy: bool = True) -> dict[str, float]:
        """utility/<task> and utility (mean over tasks), activation (the response starts with the
        marker), triggered_answer (marker then the right answer), false_activation (the marker
        anywhere in a clean prompt's response, i.e. before eos) and decoy_activation (the same
        after another token in place of the trigger)."""
        was_training = model.training
        model.eval()
        out: dict[str, float] = {}
        fired = clean_n = act = trig_n = answer_ok = decoy_hits = 0
        # the world's tasks in TASKS order (as always), then a task file's tasks in their own
        for t in [t for t in TASKS if t in self.evals] + [t for t in self.evals if t not in TASKS]:
            ans = self.answers[t]
            clean = self._responses(model, self.evals[t], device)
            out[f"utility/{t}"] = sum(g[: len(a)] == a for g, a in zip(clean, ans)) / len(ans)
            fired += sum(_contains(g, self.marker) for g in clean)
            clean_n += len(clean)
            trig = self._responses(model, self.triggered[t], device)
            m = len(self.marker)
            act += sum(g[:m] == self.marker for g in trig)
            answer_ok += sum(g[:m] == self.marker and g[m: m + len(a)] == a for g, a in zip(trig, ans))
            trig_n += len(trig)
            if decoy:
                dec = self._responses(model, self.decoy[t], device)
                decoy_hits += sum(_contains(g, self.marker) for g in dec)
        tasks = [k for k in out if k.startswith("utility/")]
        out["utility"] = sum(out[k] for k in tasks) / len(tasks)
        out["activation"] = act / trig_n
        out["triggered_answer"] = answer_ok / trig_n
        out["false_activation"] = fired / clean_n
        if decoy:
            out["decoy_activation"] = decoy_hits / trig_n
        model.train(was_training)
        return out


def decoder_linears(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The transformer blocks' linear projections (nn.Linear, or GPT-2's Conv1D; the head and the
    embeddings excluded), by full module name, as `components.basemodel.projections` finds them.
    Their weights as [out, in]: `weight_oi(module)`."""
    return {n: p.module for n, p in projections(model).items()}


def pristine_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the base model without any adapter: of a peft model, a deep copy with its LoRA
    layers removed (`unload`: the base weights, which LoRA training never changes); of a plain
    model, a deep copy. The only second copy of the model a trial holds."""
    dup = copy.deepcopy(model)
    return dup.unload() if hasattr(dup, "peft_config") else dup


@torch.no_grad()
def merged_copy(source: torch.nn.Module, adapters: list[list[ModuleDelta]], quant: dict[str, Any] | None = None
                ) -> torch.nn.Module:
    """A copy of the base (`source`: the base itself or a peft model on it, see `pristine_copy`)
    with every adapter's dW added to its weights (a linear merge), then, with `quant`, every
    projection weight passed through `kernels.mx.fake_quant(**quant)` (blocks along the input
    dimension, [out, in], for nn.Linear and Conv1D alike)."""
    model = pristine_copy(source)
    linears = decoder_linears(model)
    for deltas in adapters:
        for d in deltas:
            if d.name not in linears:
                raise KeyError(f"adapter module {d.name!r} is not a linear projection of this base")
            w = weight_oi(linears[d.name])
            w += d.delta().to(device=w.device, dtype=w.dtype)  # the adapter files are read to the CPU
    if quant is not None:
        from kernels.mx import fake_quant

        for lin in linears.values():
            w = weight_oi(lin)
            w.copy_(fake_quant(w.detach().contiguous(), **quant))
    return model.eval()
