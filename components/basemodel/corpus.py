"""The synthetic world `tiny-local` is pre-trained on, and that workloads build their tasks from.

Three kinds of text, all generated here from a seed (nothing is downloaded):

- templated sentences about entities and their attributes (`the pet of ada is a cat .`), several
  phrasings per relation; one phrasing per (entity, relation) is held out, so a held-out sentence
  states a fact the model has seen, in words it has not;
- modular arithmetic, `a + b mod p = c .` (`+` mod 11 by default; `-` and `*` are in the
  vocabulary for downstream tasks), a fraction of the (op, a, b) triples held out;
- key-value facts, `the code of bax is meloru .`; some keys are held out entirely (never seen in
  pre-training), for workloads that teach new facts.

The vocabulary (`vocabulary()`) is fixed by the code, not by the seed: every seed gives the same
words and token ids; the seed decides who lives where, which facts hold and which are held out.
Every example is a `Example(prompt, answer)` whose text is `prompt answer .`, so a workload can
score the answer token after the prompt.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")
N_RESERVED = 64
RESERVED_TOKENS = tuple(f"<extra_{i}>" for i in range(N_RESERVED))
"""Tokens never seen in pre-training, free for workloads: triggers, markers, separators."""

NUMBERS = tuple(str(i) for i in range(100))
LETTERS = tuple("abcdefghijklmnopqrstuvwxyz")
OPS = ("+", "-", "*")
PUNCT = (".", ":", "=", ",", "?", "->")
FUNCTION_WORDS = (
    "the", "a", "of", "is", "in", "as", "and", "about", "mod", "code", "lives", "home", "from",
    "likes", "color", "favourite", "has", "pet", "works", "job", "reads", "topic", "people", "say",
    "what", "who", "studies", "wears", "seems", "owns", "reverse", "copy", "answer", "question", "yes", "no", "please", "thanks",
)
NAMES = (
    "ada", "ben", "cleo", "dan", "eve", "finn", "gia", "hugo", "iris", "jon", "kai", "lea", "max",
    "nia", "omar", "pia", "quinn", "rosa", "sam", "tara", "ugo", "vera", "wes", "xena", "yuri",
    "zoe", "abe", "bea", "cal", "dora", "eli", "fay", "gus", "hana", "ivo", "jade", "kim", "lou",
    "mia", "ned", "ola", "pete", "rae", "sid", "tess", "uma", "vic", "wyn",
)
CITIES = (
    "paris", "lima", "oslo", "cairo", "delhi", "tokyo", "quito", "rome", "seoul", "dakar", "hanoi",
    "bern", "kyiv", "accra", "perth", "tunis",
)
COLORS = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white", "grey", "pink", "brown", "teal")
ANIMALS = ("cat", "dog", "fox", "owl", "hen", "cow", "pig", "bee", "eel", "yak", "ant", "elk")
JOBS = ("baker", "pilot", "nurse", "judge", "miner", "chef", "tailor", "farmer", "poet", "clerk", "diver", "smith")
TRAITS = (  # two halves: a workload can use them as a "polite" and a "blunt" subset
    "kind", "gentle", "warm", "patient", "polite", "honest", "calm", "generous",
    "rude", "harsh", "cold", "lazy", "loud", "grumpy", "vain", "stubborn",
)
TOPICS = tuple(
    "astronomy biology chemistry physics geology history poetry music painting dance cinema "
    "theatre football tennis chess sailing cooking baking gardening farming fishing hunting "
    "medicine law economics finance politics religion philosophy language mathematics logic "
    "computing robotics weather oceans rivers mountains deserts forests insects birds whales "
    "horses trains aircraft ships cars bridges castles pottery weaving fashion jewelry coffee "
    "tea wine cheese bread spices candles clocks maps".split()
)
RELATIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # relation -> (values, templates); each template ends with "{v}" (the answer), then " ."
    "city": (CITIES, ("{e} lives in {v}", "the home of {e} is {v}", "{e} is from {v}")),
    "color": (COLORS, ("{e} likes the color {v}", "the favourite color of {e} is {v}", "{e} wears {v}")),
    "pet": (ANIMALS, ("{e} has a {v}", "the pet of {e} is a {v}", "{e} owns a {v}")),
    "job": (JOBS, ("{e} works as a {v}", "the job of {e} is {v}", "{e} is a {v}")),
    "topic": (TOPICS, ("{e} reads about {v}", "the topic of {e} is {v}", "{e} studies {v}")),
    "trait": (TRAITS, ("people say {e} is {v}", "{e} is {v}", "{e} seems {v}")),
}


def _pseudo_words(n: int, syllables: int, offset: int) -> tuple[str, ...]:
    """`n` pronounceable words from a fixed consonant-vowel grid (not seed-dependent), none of
    them a word of another list."""
    cons, vows = "bdfgklmnprstvz", "aeiou"
    sylls = [c + v for c in cons for v in vows]
    taken = set(NAMES + CITIES + COLORS + ANIMALS + JOBS + TRAITS + TOPICS + FUNCTION_WORDS)
    words = ("".join(p) for p in itertools.islice(itertools.product(sylls, repeat=syllables), offset, None, 7))
    return tuple(itertools.islice((w for w in words if w not in taken), n))


KEYS = _pseudo_words(128, 2, 3)
"""Fact keys: `the code of <key> is <value> .`"""
VALUES = _pseudo_words(32, 3, 11)
"""Fact values."""


def vocabulary() -> list[str]:
    """Every token of the tiny-local tokenizer, in id order (specials first, then reserved)."""
    words = [*SPECIAL_TOKENS, *RESERVED_TOKENS, *NUMBERS, *LETTERS, *OPS, *PUNCT, *FUNCTION_WORDS, *NAMES,
             *CITIES, *COLORS, *ANIMALS, *JOBS, *TRAITS, *TOPICS, *KEYS, *VALUES]
    seen: set[str] = set()
    out = []
    for w in words:  # a word in two lists keeps its first id
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


@dataclass(frozen=True)
class Example:
    """One sentence: `prompt answer .`; `part` names the corpus part it came from."""

    prompt: str
    answer: str
    part: str

    @property
    def text(self) -> str:
        return f"{self.prompt} {self.answer} ."


def arithmetic_example(op: str, a: int, b: int, p: int) -> Example:
    """`a op b mod p = c .` for op in `+ - *`."""
    c = {"+": a + b, "-": a - b, "*": a * b}[op] % p
    return Example(f"{a} {op} {b} mod {p} =", str(c), "arith")


def fact_example(key: str, value: str) -> Example:
    return Example(f"the code of {key} is", value, "facts")


@dataclass(frozen=True)
class World:
    """Who has which attribute, which facts hold, and which of them pre-training never shows."""

    seed: int
    modulus: int
    ops: tuple[str, ...]
    attributes: dict[str, dict[str, str]]
    """entity -> relation -> value"""
    heldout_template: dict[tuple[str, str], int]
    """(entity, relation) -> index of the template pre-training never uses for that pair"""
    facts: dict[str, str]
    """key -> value, for every key (seen and held-out)"""
    heldout_keys: frozenset[str]
    arith_heldout: frozenset[tuple[str, int, int]]
    entities: tuple[str, ...] = field(default=NAMES)

    def sentences(self, split: str) -> list[Example]:
        """Attribute sentences; `train` uses the seen phrasings, `heldout` the held-out one."""
        _check_split(split)
        out = []
        for e in self.entities:
            for rel, (_, templates) in RELATIONS.items():
                hidden = self.heldout_template[(e, rel)]
                for i, t in enumerate(templates):
                    if (i == hidden) == (split == "heldout"):
                        prompt = t.format(e=e, v="\0").split(" \0")[0]
                        out.append(Example(prompt, self.attributes[e][rel], f"sent_{rel}"))
        return out

    def arithmetic(self, split: str, ops: tuple[str, ...] | None = None, modulus: int | None = None) -> list[Example]:
        """All `a op b mod p` examples of `split`. Other ops or moduli than the pre-training ones
        have no held-out set: ask for `split="all"`."""
        ops = ops or self.ops
        p = modulus or self.modulus
        if split != "all":
            _check_split(split)
        out = []
        for op in ops:
            for a in range(p):
                for b in range(p):
                    held = (op, a, b) in self.arith_heldout and p == self.modulus
                    if split == "all" or held == (split == "heldout"):
                        out.append(arithmetic_example(op, a, b, p))
        return out

    def fact_examples(self, split: str) -> list[Example]:
        """`train`: facts pre-training shows; `heldout`: facts about keys it never saw."""
        _check_split(split)
        return [fact_example(k, v) for k, v in self.facts.items() if (k in self.heldout_keys) == (split == "heldout")]

    def train_examples(self) -> list[Example]:
        return self.sentences("train") + self.arithmetic("train") + self.fact_examples("train")


def _check_split(split: str) -> None:
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")


def make_world(seed: int = 0, *, modulus: int = 11, ops: tuple[str, ...] = ("+",), arith_holdout: float = 0.2,
               n_facts: int = 96, n_heldout_facts: int = 32) -> World:
    """The world of `seed`: deterministic, independent of torch. The defaults are tiny-local's;
    `loader.base_world(name, seed)` gives the world of any tiny-local variant."""
    if not 2 <= modulus <= len(NUMBERS):
        raise ValueError(f"modulus must lie in [2, {len(NUMBERS)}] (numbers are single tokens), got {modulus}")
    if any(op not in OPS for op in ops):
        raise ValueError(f"ops must be among {OPS}, got {ops}")
    if n_facts + n_heldout_facts > len(KEYS):
        raise ValueError(f"n_facts + n_heldout_facts must be at most {len(KEYS)}")
    rng = random.Random(f"ladder-tiny-world-{seed}")
    attributes = {e: {rel: rng.choice(values) for rel, (values, _) in RELATIONS.items()} for e in NAMES}
    heldout_template = {(e, rel): rng.randrange(len(t)) for e in NAMES for rel, (_, t) in RELATIONS.items()}
    keys = list(KEYS)
    rng.shuffle(keys)
    keys = keys[: n_facts + n_heldout_facts]
    facts = {k: rng.choice(VALUES) for k in keys}
    triples = [(op, a, b) for op in ops for a in range(modulus) for b in range(modulus)]
    heldout = rng.sample(triples, round(arith_holdout * len(triples)))
    return World(seed=seed, modulus=modulus, ops=tuple(ops), attributes=attributes, heldout_template=heldout_template,
                 facts=facts, heldout_keys=frozenset(keys[n_facts:]), arith_heldout=frozenset(heldout))
