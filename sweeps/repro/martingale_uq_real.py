"""Martingale posteriors in the paper's text setting (its Exp B): GPT-2, frozen, as the generator;
the deployed metric is GPT-2's NLL per token of WikiText-2 raw test texts (64 tokens each, a truth
pool of 1,200), with theta(Q) from 200 of GPT-2's own generations, alpha from 150 held-out real
texts with c = 1.0, and a 120-step forward urn, as in the released code; n from 5 to 100. The
headline claim (`exact_covers_nll`, pooled over its priors) judges these trials as it judges the
smoke's tiny GPT-2; the rare-alert claims need the smoke's GMM trials and are not judged here.

ladder downloads nothing. Fetch once, where the internet is reachable (docs/datasets.md):

    python -c "import datasets; datasets.load_dataset('Salesforce/wikitext', 'wikitext-2-raw-v1').save_to_disk('$LADDER_DATA/wikitext-2-raw')"
    hf download gpt2      # into the Hugging Face cache (HF_HOME)

`$LADDER_DATA` defaults to `./data` of the folder the sweep starts in (`text_path` may also be
WikiText-2 raw's plain `wiki.test.raw`); `LADDER_GPT2` may name a folder written by
`save_pretrained` instead of the hub id. `ladder sweep sweeps/repro/martingale_uq_real.py --check`
says what is missing. Generation and scoring want a GPU; the coverage loop runs on the CPU.
"""

from __future__ import annotations

import os

from orchestrator.sweep import Sweep, data_root, seeds

# Absolute: trials run in folders of their own (on a cluster the folder must be shared storage).
DATA = data_root()
GPT2 = os.environ.get("LADDER_GPT2", "gpt2")

sweep = Sweep(
    name="martingale_uq_real",
    workload="martingale_uq",
    base="default",
    overrides={
        "generator": "causal_lm", "model": GPT2, "text_path": str(DATA / "wikitext-2-raw"), "text_split": "test",
        "text_len": 64, "real_texts": 1200, "prior_draws": 200, "alpha_holdout": 150, "alpha_c": 1.0,
        "horizon": 120, "ns": (5, 10, 20, 50, 100), "repetitions": 1000, "draws": 500, "lm_batch": 100,
    },
    points=({"metric": "nll"},),
    space={"seed": seeds(3)},
    scheduler="fifo",
    objective=("eval/coverage/exact/n20", "max"),
    cpus_per_worker=4,
    gpus_per_worker=1,
)
