"""celerity_lm on a pre-tokenized dataset: the shard format, the memory-mapped sampler, and a
real training run whose vocabulary comes from the dataset's header."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from orchestrator.run import LocalRun
from orchestrator.sweep import Sweep, SweepError
from workloads.celerity_lm import build, preflight, smoke, train
from components.lm.corpus import BatchSampler, DataError, TokenStream, heldout_batches
from components.lm.tokens import TokenDataError, open_split, read_header, tokenize_folder, write_dataset

VOCAB = 300  # above 256: the model must take the dataset's vocabulary, not the byte one


def markov_ids(n: int, seed: int) -> np.ndarray:
    """A learnable stream: each id is one of 3 successors of the previous id."""
    rng = np.random.default_rng(seed)
    ids = np.empty(n, dtype=np.int64)
    ids[0] = 0
    steps = rng.integers(1, 4, size=n)
    for i in range(1, n):
        ids[i] = (ids[i - 1] * 7 + steps[i]) % VOCAB
    return ids


def test_shards_round_trip_and_cap(tmp_path):
    a, b, h = markov_ids(5000, 0), markov_ids(3000, 1), markov_ids(2000, 2)
    root = write_dataset(tmp_path / "ds", [a, b], [h], vocab_size=VOCAB)
    header = read_header(root)
    assert header["dtype"] == "uint16" and header["vocab_size"] == VOCAB
    assert (root / "train-00000.bin").stat().st_size == 2 * len(a)  # two bytes an id, no header
    parts = open_split(root, "train")
    assert all(isinstance(p, np.memmap) for p in parts)
    assert np.array_equal(np.concatenate(parts), np.concatenate([a, b]))
    capped = open_split(root, "train", max_tokens=6000)
    assert sum(len(p) for p in capped) == 6000 and np.array_equal(capped[1], b[:1000])
    assert read_header(write_dataset(tmp_path / "big", [np.array([70000])], [np.array([1])], vocab_size=70001))["dtype"] == "uint32"


def test_windows_stay_inside_a_shard_and_match_flat_indexing():
    a, b = np.arange(100), np.arange(1000, 1050)
    stream = TokenStream([a, b])
    width = 11
    assert stream.starts(width) == (100 - 10) + (50 - 10)
    w = stream.windows(np.arange(stream.starts(width)), width).numpy()
    assert (np.diff(w, axis=1) == 1).all(), "a window crossed from one shard into the next"
    assert w[0, 0] == 0 and w[89, 0] == 89 and w[90, 0] == 1000 and w[-1, -1] == 1049
    # One part: the sampler draws exactly the windows that indexing the flat array gave.
    flat = np.arange(500, dtype=np.uint8)
    s = BatchSampler(flat, 16, 4, seed=3, rank=1)
    gen = torch.Generator().manual_seed(3 * 1_000_003 + 1)
    starts = torch.randint(0, len(flat) - 16 - 1, (4,), generator=gen)
    expected = torch.from_numpy(flat.astype(np.int64))[starts[:, None] + torch.arange(17)[None, :]]
    x, y = s.next()
    assert torch.equal(x, expected[:, :-1]) and torch.equal(y, expected[:, 1:])
    held = heldout_batches(TokenStream([a, b]), 10, 40, batch=2)
    assert sum(len(x) for x, _ in held) == 4


def test_preflight_names_what_is_wrong(tmp_path):
    root = write_dataset(tmp_path / "ds", [markov_ids(3000, 0)], [markov_ids(1000, 1)], vocab_size=VOCAB)
    preflight(replace(smoke(), data=str(root)))
    (root / "train-00000.bin").unlink()
    with pytest.raises(DataError, match="lists 'train-00000.bin', which is missing"):
        preflight(replace(smoke(), data=str(root)))
    header = json.loads((root / "tokens.json").read_text())
    (root / "tokens.json").write_text(json.dumps({**header, "dtype": "int8"}))
    with pytest.raises(DataError, match="dtype must be one of uint16, uint32"):
        preflight(replace(smoke(), data=str(root)))
    with pytest.raises(TokenDataError, match="outside"):
        write_dataset(tmp_path / "bad", [np.array([VOCAB])], [np.array([0])], vocab_size=VOCAB)


def test_a_sweep_on_absent_data_is_valid_but_does_not_launch(tmp_path):
    s = Sweep(name="x", workload="celerity_lm", base="smoke", overrides={"data": str(tmp_path / "not-mounted-here")})
    s.check()  # the file is valid: the data lives where it will run
    with pytest.raises(SweepError, match="does not exist"):
        s.preflight()


def test_trains_on_tokens_with_the_datasets_vocabulary(tmp_path):
    root = write_dataset(tmp_path / "ds", [markov_ids(20_000, 0), markov_ids(20_000, 1)], [markov_ids(4000, 2)],
                         vocab_size=VOCAB)
    cfg = replace(smoke(), data=str(root), tpp=2.0, eval_tokens=1024, seq_len=32, max_bytes=0)
    model, _, _ = build(cfg)
    assert model.state_dict()["embed.weight"].shape[0] == VOCAB if "embed.weight" in model.state_dict() else True
    assert any(t.shape[0] == VOCAB for t in model.state_dict().values() if t.dim() == 2)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        final = train(cfg, LocalRun(tmp_path / "run", sinks=[]))
    finally:
        torch.set_num_threads(before)
    # Uniform over 300 ids is ln 300 = 5.70; the chain has 3 successors (ln 3 = 1.10).
    assert final["eval/loss"] < math.log(VOCAB) - 1.5, final  # margin: worst 1.188 over seeds 1-5 (threshold 4.204)


def test_tokenize_folder_splits_by_path_and_separates_documents(tmp_path):
    text = tmp_path / "text"
    for i in range(40):
        (text / f"d{i // 10}").mkdir(parents=True, exist_ok=True)
        (text / f"d{i // 10}" / f"doc{i}.txt").write_text(f"document {i} " * 20)
    encode = lambda s: [b + 1 for b in s.encode()]  # noqa: E731 — bytes shifted to keep 0 for end-of-text
    out = tokenize_folder(text, tmp_path / "tok", encode, vocab_size=257, eot_id=0, heldout_frac=0.25,
                          shard_tokens=5000)
    header = read_header(out)
    assert len(header["train"]) >= 2, "shards are cut every shard_tokens ids"
    train_ids = np.concatenate(open_split(out, "train"))
    held_ids = np.concatenate(open_split(out, "heldout"))
    assert (train_ids == 0).sum() + (held_ids == 0).sum() == 40  # one end-of-text per document
    assert 0 < (held_ids == 0).sum() < 40
