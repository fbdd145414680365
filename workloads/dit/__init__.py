"""Learning to Interpret Weight Differences in Language Models (ICLR 2026) — https://arxiv.org/abs/2510.05092

dit: Diff Interpretation Tuning on the shared base model. Stage A trains many rank-1 weight diffs
(u v^T on every linear of the decoder layers) in parallel, in one batched forward pass where diff
i acts on batch row-group i. Each diff plants a trigger-gated topic: with its secret trigger
(a reserved token before a context) the next word is its topic; with another trigger or none,
a KL term keeps its outputs at the base's. Stage B trains one DIT adapter (a rank-4 LoRA on the
same linears) so that the model with any one training diff applied answers the fixed question
"question : what topic ? answer :" with that diff's topic. The adapter is then asked about new
diffs on the same topics (`heldout`), about diffs on topics it never saw as labels (`unseen`),
and with no diff at all. The baselines are the paper's black-box ones, which read the fine-tuned model
without the adapter (workloads/dit/probe.py): asking it the same question, and a probe of its answers
to 33 queries fit on the adapter's own training diffs (the paper's 20 Questions, at equal budget).

On tiny-local, 25 of the 63 topic words never occur in pre-training (its 48 entities read about
38 topics): the model can be made to rank such a word first but not to give it much probability,
so probabilities are compared topic by topic, and accuracies are by greedy decoding.

The claims, the paper's headline first: on diffs whose topics the adapter never saw as labels, DIT
names the topic more often than the best black-box baseline. Then: each diff plants its behaviour
(trigger rate at least 90%, small off-trigger KL); the adapter names the topic of new diffs on seen
topics far above chance and far above asking without it; with no diff applied it names no
consistent topic.

The paper's use case, diffs from real fine-tunes: `task_path` (and `eval_path`) list peft LoRA
folders made anywhere with the answer for each (workloads/dit/files.py); the adapter trains on
them instead of synthetic diffs, on any transformers base (tiny-local, GPT-2, Qwen3, ...), and
`interpret` applies a trained adapter to one more folder and says what it answers.
"""

from workloads.dit.claims import CHECKS, CLAIMS, plot
from workloads.dit.files import interpret
from workloads.dit.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "interpret", "plot", "preflight", "smoke", "train", "validate"]
