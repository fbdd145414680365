"""PALC: Preference Alignment via Logit Calibration (ICLR 2026) — https://openreview.net/forum?id=0cmuYj3WeG

palc: steer a frozen causal LM at decoding time with a small bottleneck network on its last
hidden state. For each position, m_t = W_up ReLU(W_down h_t) is added to the vocabulary logits,
scaled by a runtime factor gamma: l'_t = l_t + gamma m_t. Only W_down (B x H) and W_up (V x B) are
trained, on preference pairs, with the reference-free loss -log sigmoid(mean log pi(y_w|x) -
mean log pi(y_l|x)) over response tokens; the base's parameters are never touched, and gamma = 0
gives back the base's logits exactly.

Data (generated from the base model's world, nothing downloaded): a prompt about an entity
(`people say ada is`), a preferred response with gentle trait words and a dispreferred one with
blunt trait words in the same slots of the same template. One trial trains the calibrator and
reports, on held-out entities, the preference accuracy at every gamma of a grid (gamma 0: the
base), the share of gentle words in greedy and sampled generations at each gamma, the largest
difference between the gamma-0 logits and the base's, the per-token decoding latency of PALC over
the base (median over interleaved repetitions in the same run), and a hash check that the base's
parameters are unchanged.

Data from a file (`task_path`, docs/datasets.md): a JSONL file or a datasets save_to_disk folder
of preference pairs (prompt, chosen, rejected; HH-RLHF's whole dialogues with the prompt split off;
UltraFeedback-binarized's message lists), on any causal LM (`base`: a folder or a hub id). There
the generations are not counted (no gentle words to count); the held-out preference metrics and
the latency are measured as above.

The DPO baseline (`method="dpo"`, Rafailov et al. 2023, implemented here): a LoRA adapter on the
same base trained with the DPO loss, its reference the base itself (the adapter disabled, so one
copy of the model is held). Both methods report the same held-out metrics: preference accuracy and
mean margin of the aligned model and of the base, and the implicit reward's accuracy and margin.

The test-time alignment baselines (`workloads.palc.baselines`, implemented here; PALC trials on
the synthetic world, `baselines=True`): a Bradley-Terry reward head on the frozen base's last
hidden state fitted on PALC's training pairs, best-of-N sampling of the base scored by it, and
ARGS reward-guided decoding (Khanov et al. 2024: the base's top-k next tokens re-scored by
logit + w x reward). Each writes one response per held-out prompt; their gentle-word shares and
per-token latencies over the base's are measured beside PALC's.

The claims: the headline, PALC's gentle-word share of greedy generations above the best
test-time baseline's; PALC decodes faster per token than either baseline; held-out preference accuracy rises from about 50% (the base) to at least 90%; the
gentle-word share of generations rises monotonically in gamma; per-token latency is at most 1.3x
the base's. The checks (invariants of the construction): gamma 0 reproduces the base's logits,
the base's parameters are untouched and only B(H + V) parameters train.
"""

from workloads.palc.claims import CHECKS, CLAIMS, plot
from workloads.palc.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
