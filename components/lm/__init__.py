"""Language-model parts that several workloads train with: not a method of their own.

- `corpus`: byte-level text corpora (the Python standard library's sources by default, or a folder
  of text files) and pre-tokenized datasets behind one `TokenStream`, the `BatchSampler` that
  draws training windows, and the fixed held-out batches.
- `tokens`: the pre-tokenized dataset format (`tokens.json` + memory-mapped id shards) and
  `python -m components.lm.tokens`, which writes it from a folder of text.
- `split`: the train/held-out rule by a hash of each file's path, shared by both.
- `gpt`: the Celerity-shaped GPT decoder (muP across width, CompleteP across depth).
- `schedule`: the learning-rate factor, linear warmup then linear decay to zero.
- `pretrain`: the GPT's recipe, builder and token budget, its pre-training loop (celerity_lm's,
  step for step), the pre-trained LM cached on disk, and the LM of a celerity_lm run folder.

celerity_lm trains the GPT on these; lowprec_attention, mom, martingale_uq and mx_anomaly read the
same corpora and sample batches the same way, so their comparisons see the same data; mx_anomaly
quantizes the LM `pretrain` trains. Nothing here imports Ray or MLflow: it runs wherever torch
does.
"""
