"""diffgda: Config and the trial loop (see the package docstring)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

from workloads.diffgda import networks
from workloads.diffgda.data import Domains, Graphs, Unlabelled, edge_homophily, make_domains
from workloads.diffgda.model import GCN, DomainDiscriminator, DomainNet, ScoreNet
from workloads.diffgda.networks import Network
from workloads.diffgda.pipeline import (
    classifier_distance, classifier_step, domain_bandwidths, evolve, f1_on, gcn_epoch, gcn_sets, intermediate_graphs,
    mmd_distance, predict, ratio_step, score_step,
)
from workloads.diffgda.sde import make_sde


MAX_WORKERS = 1
"""diffgda trains small dense graphs on one worker: the runner refuses more."""


@dataclass(frozen=True)
class Config:
    mode: Literal["evolve", "source_only", "dann", "mmd", "gradual"] = "evolve"
    """'evolve': train the GCN on the source plus source graphs evolved by the SDE; 'source_only':
    the baseline, the same GCN on the source alone; 'dann': the GCN on the source alone with a
    domain classifier on its node embeddings behind a gradient reversal layer (DANN, the
    adversarial baseline of the GDA tables; UDAGCN's domain loss), weighted by dann_weight; 'mmd':
    the GCN on the source alone plus mmd_weight * MMD^2 between source and target node embeddings
    (DAN's alignment); 'gradual': the GCN trained through gradual_steps discrete intermediate
    graph domains between source and target (GIFT-style, the discrete path the paper's continuous
    trajectory replaces; generated CSBM domains only)."""
    data_dir: str = ""
    """A folder of the papers' graph-transfer datasets, DATA_DIR/<domain>.mat (ACDNE's release:
    acmv9, citationv1, dblpv7, Blog1, Blog2; docs/datasets.md): the GCN trains on the whole source
    graph and is scored on the whole target graph. Empty: the generated CSBM domains below."""
    source: str = ""
    """With data_dir: the labelled source domain, a file stem of data_dir (e.g. 'acmv9')."""
    target: str = ""
    """With data_dir: the unlabelled target domain, a file stem of data_dir (e.g. 'dblpv7')."""
    source_val_frac: float = 0.1
    """With data_dir: fraction of the source graph's nodes held out of the GCN's loss and of the
    diffusion's subgraphs, to select the GCN's epoch with select_by='source'."""
    guidance_scale: float = 1.0
    """Weight of the density-ratio guidance gradient in the reverse SDE (0: unguided evolution,
    and no guidance network is trained). The label-free MMD picks 1 at this size and 2 at the
    smoke size, whose less-trained score model needs a stronger pull."""
    adj_guidance: float = 1.0
    """Scale of the guidance on A relative to that on X (the released code has separate X and A
    guidance networks; one network with a relative weight here, a reconstruction)."""
    guidance: Literal["classifier", "ratio"] = "classifier"
    """Guidance estimate (the paper's loss is not public): 'classifier', grad of the logit of a
    time-dependent source-vs-target node classifier on noisy graphs (the log ratio of the noisy
    marginals); 'ratio', TGDP-style grad log h_t with h_t(G_t, y) regressed onto the clean
    classifier's ratio r(G_0) over source graphs."""
    classes: int = 3
    """Node classes C (with data_dir: read from the files' label columns instead)."""
    nodes: int = 30
    """Nodes per graph m (dense adjacency); with data_dir, nodes per subgraph the diffusion runs on,
    cut from the whole graph by breadth-first search."""
    dim: int = 8
    """Node feature dimension d; with data_dir, the principal components the attributes of both
    domains are projected onto together (all of them, centred, when the files have <= dim)."""
    feature_sep: float = 2.5
    """Distance between every two class means (features have unit noise std scaled by feature_std)."""
    feature_std: float = 1.0
    """Std of the isotropic feature noise around the class mean."""
    source_graphs: int = 128
    """Labelled source graphs used for training (with data_dir: subgraphs of the source graph)."""
    source_val_graphs: int = 32
    """Labelled source graphs held out (model selection with select_by='source'; with data_dir,
    source_val_frac holds out nodes instead)."""
    target_graphs: int = 64
    """Unlabelled target graphs (adaptation sees their x and A; their labels score the result); with
    data_dir, subgraphs of the target graph the guidance learns from (the whole graph is scored)."""
    source_p_in: float = 0.3
    """Source edge probability within a class."""
    source_p_out: float = 0.02
    """Source edge probability across classes."""
    target_p_in: float = 0.15
    """Target edge probability within a class (lower homophily than the source by default)."""
    target_p_out: float = 0.06
    """Target edge probability across classes."""
    shift: float = 1.5
    """Target class means move by this along mu_1 - mu_0 (the feature shift)."""
    rotation_deg: float = 0.0
    """Target class means also rotate by this angle in the (mu_0, mu_1) plane."""
    sde_x: Literal["vp", "ve"] = "vp"
    """Forward SDE of the node features (VP as in GDSS)."""
    x_low: float = 0.1
    """beta_min (VP) or sigma_min (VE) of the feature SDE."""
    x_high: float = 10.0
    """beta_max (VP) or sigma_max (VE) of the feature SDE."""
    sde_adj: Literal["vp", "ve"] = "ve"
    """Forward SDE of the adjacency (VE as in GDSS's molecule settings)."""
    adj_low: float = 0.2
    """beta_min (VP) or sigma_min (VE) of the adjacency SDE."""
    adj_high: float = 1.0
    """beta_max (VP) or sigma_max (VE) of the adjacency SDE."""
    score_hidden: int = 64
    """Width of the joint score network."""
    score_layers: int = 3
    """Graph blocks in the score network's trunk."""
    score_steps: int = 2000
    """Denoising-score-matching steps."""
    score_batch: int = 32
    """Source graphs per score step."""
    score_lr: float = 2e-3
    """Adam learning rate of the score network."""
    guide_hidden: int = 32
    """Width of the domain (guidance) networks."""
    guide_layers: int = 2
    """Graph blocks in the domain networks."""
    guide_steps: int = 600
    """Steps of the domain classifier (and as many of the ratio network with guidance='ratio')."""
    guide_lr: float = 2e-3
    """Adam learning rate of the domain networks."""
    ratio_clip: float = 20.0
    """guidance='ratio': the clean density ratio r(G_0) is clipped at this before regression."""
    sample_steps: int = 50
    """Euler-Maruyama steps of the reverse SDE."""
    evolve_from: float = 1.0
    """Diffusion time the evolution starts at: 1.0 samples from the prior conditioned on a source
    graph's labels (the released code's sampler); t < 1 starts from that source graph itself
    perturbed to t, a shorter source-to-target trajectory. A reconstruction choice."""
    evolved_copies: int = 1
    """Evolved graphs per source training graph."""
    train_on: Literal["source+evolved", "evolved"] = "source+evolved"
    """Labelled graphs of the GCN in mode 'evolve' (the released code mixes the evolved subgraph
    into the source graph)."""
    gcn_hidden: int = 32
    """GCN width."""
    gcn_layers: int = 2
    """GCN layers (the released code uses 3)."""
    gcn_dropout: float = 0.2
    """Dropout after each hidden GCN layer."""
    gcn_epochs: int = 150
    """Full-batch GCN epochs."""
    gcn_lr: float = 1e-2
    """Adam learning rate of the GCN."""
    mmd_weight: float = 0.0
    """Weight of MMD^2 between source and target GCN embeddings in the GCN loss (the released code
    uses 0.05 on top of the evolution; 0 isolates the evolution's effect)."""
    dann_weight: float = 1.0
    """mode='dann': weight of the domain classifier's cross-entropy in the GCN loss; its gradient
    reaches the GCN reversed, scaled by DANN's schedule 2 / (1 + exp(-10 p)) - 1 over the epochs."""
    dann_hidden: int = 32
    """mode='dann': hidden width of the domain classifier (an MLP on the GCN's last hidden layer)."""
    gradual_steps: int = 3
    """mode='gradual': intermediate domains K at the fixed ratios k / (K + 1); the GCN's epochs run
    in K + 1 equal phases, the source alone, then the source plus intermediate domain k in phase k
    (each built when its phase starts, its target nodes matched by the GCN's pseudo-labels then)."""
    select_by: Literal["evolved", "source", "last"] = "evolved"
    """GCN epoch selection without target labels: 'evolved', Macro-F1 on held-out evolved graphs
    (labelled samples of the estimated target domain); 'source', on the held-out source graphs;
    'last', no selection. Target labels are never read."""
    evolved_val_frac: float = 0.2
    """Fraction of the evolved graphs held out for select_by='evolved'."""
    log_every: int = 50
    """Report metrics every this many steps."""
    checkpoint_every: int = 500
    """Checkpoint every this many steps, and at the end of every stage."""
    threads: int = 1
    """Intra-op CPU threads of the trial, pinned by the runner around `train` (0 leaves torch's setting)."""
    seed: int = 0
    """Seed of the data (domains depend on it alone) and of every network and sampler."""


def smoke() -> Config:
    """CPU-sized: 48 source graphs of 24 nodes, 300 score steps, 20 reverse steps, a few seconds."""
    return Config(
        guidance_scale=2.0, nodes=24, source_graphs=48, source_val_graphs=16, target_graphs=32, score_hidden=32,
        score_layers=2, score_steps=300, guide_hidden=24, guide_steps=150, sample_steps=20, gcn_epochs=60,
        log_every=25, checkpoint_every=100,
    )


STAGES = ("score", "guide", "ratio", "evolve", "gcn")
BASELINES = ("source_only", "dann", "mmd", "gradual")
"""Modes with no evolution: the GCN alone, with or without a GDA baseline's alignment."""


def stage_lengths(cfg: Config) -> dict[str, int]:
    """Steps of each stage of this trial (0: skipped); the global step runs through them in order."""
    evolving = cfg.mode == "evolve"
    guided = evolving and cfg.guidance_scale != 0.0
    return {
        "score": cfg.score_steps if evolving else 0,
        "guide": cfg.guide_steps if guided else 0,
        "ratio": cfg.guide_steps if guided and cfg.guidance == "ratio" else 0,
        "evolve": 1 if evolving else 0,
        "gcn": cfg.gcn_epochs,
    }


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no training: raised before anything is launched."""
    choices = {"mode": ("evolve", "source_only", "dann", "mmd", "gradual"), "guidance": ("classifier", "ratio"), "sde_x": ("vp", "ve"),
               "sde_adj": ("vp", "ve"), "train_on": ("source+evolved", "evolved"), "select_by": ("evolved", "source", "last")}
    for name, allowed in choices.items():
        if getattr(cfg, name) not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {getattr(cfg, name)!r}")
    for name in ("classes", "nodes", "dim", "source_graphs", "source_val_graphs", "target_graphs", "score_hidden",
                 "score_layers", "score_batch", "guide_hidden", "guide_layers", "sample_steps", "evolved_copies",
                 "gcn_hidden", "gcn_layers", "gcn_epochs", "log_every", "checkpoint_every", "dann_hidden",
                 "gradual_steps"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    for name in ("score_steps", "guide_steps"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    if cfg.data_dir:
        validate_data(cfg)
    elif cfg.source or cfg.target:
        raise ValueError(f"source={cfg.source!r} and target={cfg.target!r} name domains of data_dir, which is not set: "
                         "set data_dir to a folder of the papers' .mat files (docs/datasets.md), or leave both empty")
    if cfg.classes < 2 or cfg.nodes < cfg.classes:
        raise ValueError(f"need classes >= 2 and nodes >= classes, got classes={cfg.classes}, nodes={cfg.nodes}")
    if cfg.dim < cfg.classes and not cfg.data_dir:
        raise ValueError(f"dim={cfg.dim} < classes={cfg.classes}: the class means need orthogonal directions, use dim >= classes")
    for name in ("source_p_in", "source_p_out", "target_p_in", "target_p_out"):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ValueError(f"{name} is an edge probability and must lie in [0, 1], got {getattr(cfg, name)}")
    if not cfg.feature_sep > 0 or not cfg.feature_std > 0:
        raise ValueError(f"feature_sep and feature_std must be positive, got {cfg.feature_sep}, {cfg.feature_std}")
    for kind, low, high, what in ((cfg.sde_x, cfg.x_low, cfg.x_high, "x"), (cfg.sde_adj, cfg.adj_low, cfg.adj_high, "adj")):
        if not 0 < low < high:
            raise ValueError(f"{what}_low and {what}_high must satisfy 0 < low < high, got {low}, {high}")
    if cfg.adj_guidance < 0:
        raise ValueError(f"adj_guidance must be >= 0 (0: guide the features only), got {cfg.adj_guidance}")
    if cfg.guidance_scale < 0:
        raise ValueError(f"guidance_scale must be >= 0 (0: unguided), got {cfg.guidance_scale}")
    if cfg.mode == "evolve" and cfg.score_steps == 0:
        raise ValueError("mode='evolve' needs a trained score model: set score_steps > 0")
    if cfg.mode == "evolve" and cfg.guidance_scale and cfg.guide_steps == 0:
        raise ValueError("guidance_scale > 0 needs a trained domain network: set guide_steps > 0 (or guidance_scale=0)")
    if not 0.0 < cfg.evolve_from <= 1.0:
        raise ValueError(f"evolve_from is a diffusion time in (0, 1], got {cfg.evolve_from}")
    if cfg.mode in BASELINES and (cfg.select_by == "evolved" or cfg.train_on == "evolved"):
        raise ValueError(f"mode={cfg.mode!r} has no evolved graphs: use select_by='source' or 'last' and "
                         "train_on='source+evolved'")
    if cfg.mode == "dann" and not cfg.dann_weight > 0:
        raise ValueError(f"mode='dann' needs dann_weight > 0 (0 is mode='source_only'), got {cfg.dann_weight}")
    if cfg.mode == "mmd" and not cfg.mmd_weight > 0:
        raise ValueError(f"mode='mmd' needs mmd_weight > 0 (0 is mode='source_only'), got {cfg.mmd_weight}")
    if cfg.mode == "gradual" and cfg.data_dir:
        raise ValueError("mode='gradual' builds intermediate graphs from node-matched pairs of small graphs: it runs on "
                         "the generated CSBM domains only, leave data_dir empty")
    if cfg.mode == "gradual" and cfg.gcn_epochs < cfg.gradual_steps + 1:
        raise ValueError(f"mode='gradual' needs gcn_epochs >= gradual_steps + 1 (one phase per domain), got "
                         f"{cfg.gcn_epochs} < {cfg.gradual_steps + 1}")
    if cfg.select_by == "evolved" and not 0.0 < cfg.evolved_val_frac < 1.0:
        raise ValueError(f"select_by='evolved' needs evolved_val_frac in (0, 1), got {cfg.evolved_val_frac}")
    if cfg.select_by == "evolved" and round(cfg.evolved_val_frac * cfg.source_graphs * cfg.evolved_copies) < 1:
        raise ValueError("select_by='evolved' holds out no evolved graph at this size: raise evolved_val_frac or source_graphs")
    if not 0.0 <= cfg.gcn_dropout < 1.0:
        raise ValueError(f"gcn_dropout must lie in [0, 1), got {cfg.gcn_dropout}")
    for name in ("score_lr", "guide_lr", "gcn_lr", "ratio_clip"):
        if not getattr(cfg, name) > 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.mmd_weight < 0:
        raise ValueError(f"mmd_weight must be >= 0, got {cfg.mmd_weight}")
    if cfg.threads < 0:
        raise ValueError(f"threads must be >= 0 (0: torch's own setting), got {cfg.threads}")


def validate_data(cfg: Config) -> None:
    """The dataset fields judged alone (the files are the preflight's)."""
    for name in ("source", "target"):
        if not getattr(cfg, name):
            raise ValueError(f"data_dir is set but {name} is empty: name the {name} domain by its file stem in data_dir, "
                             f"e.g. source='acmv9', target='dblpv7' ({networks.LAYOUT})")
    if cfg.source == cfg.target:
        raise ValueError(f"source and target are both {cfg.source!r}: a transfer task needs two domains")
    if not 0.0 <= cfg.source_val_frac < 1.0:
        raise ValueError(f"source_val_frac must lie in [0, 1), got {cfg.source_val_frac}")
    if cfg.select_by == "source" and cfg.source_val_frac == 0.0:
        raise ValueError("select_by='source' with data_dir needs held-out source nodes: set source_val_frac > 0")


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it: with data_dir, the folder holds <source>.mat and
    <target>.mat in the published layout, of one family (same attributes and classes), each graph
    at least one subgraph large (from the files' headers). Kept out of `validate` so that a sweep
    of data on a cluster's storage checks as valid anywhere."""
    if cfg.data_dir:
        networks.check_files(cfg.data_dir, cfg.source, cfg.target, cfg.nodes)


def domains(cfg: Config) -> Domains:
    return make_domains(
        seed=cfg.seed, classes=cfg.classes, nodes=cfg.nodes, dim=cfg.dim, feature_sep=cfg.feature_sep,
        feature_std=cfg.feature_std, source_graphs=cfg.source_graphs, source_val_graphs=cfg.source_val_graphs,
        target_graphs=cfg.target_graphs, source_p_in=cfg.source_p_in, source_p_out=cfg.source_p_out,
        target_p_in=cfg.target_p_in, target_p_out=cfg.target_p_out, shift=cfg.shift, rotation_deg=cfg.rotation_deg,
    )


def train(cfg: Config, run) -> dict[str, float]:
    validate(cfg, run.world_size)
    if cfg.data_dir:
        return train_networks(cfg, run)
    doms = domains(cfg)
    result = adapt(cfg, doms.source, doms.source_val, doms.target.unlabelled(), run)
    return {**result["metrics"], **evaluate(cfg, result, doms)}


def train_networks(cfg: Config, run) -> dict[str, float]:
    """A transfer task between two whole graphs of data_dir: the diffusion on subgraphs cut from
    them, the GCN on the whole source graph (less its held-out nodes), scored on the whole target."""
    source, target, classes = networks.load_pair(cfg.data_dir, cfg.source, cfg.target, cfg.dim)
    gen = torch.Generator().manual_seed(10_000 + cfg.seed)
    train_mask, val_mask = networks.split_nodes(len(source.y), cfg.source_val_frac, gen)
    source_sub = networks.subgraphs(source, source.y, cfg.source_graphs, cfg.nodes, gen, mask=train_mask)
    target_sub = networks.subgraphs(target.unlabelled(), None, cfg.target_graphs, cfg.nodes, gen)
    result = adapt(cfg, source_sub, source.only(val_mask), target_sub, run, classes=classes,
                   whole=(source.only(train_mask), target.unlabelled()))
    return {**result["metrics"], **evaluate_networks(result, source, target, classes)}


def evaluate_networks(result: dict[str, Any], source: Network, target: Network, classes: int) -> dict[str, float]:
    """The only place the target graph's labels are read: Macro- and Micro-F1 over all its nodes."""
    pred = predict(result["gcn"], target)
    acc = float((pred == target.y).float().mean())
    out = {
        "eval/target_macro_f1": f1_on(result["gcn"], target, classes),
        "eval/target_micro_f1": acc,  # single-label: micro-F1 is the accuracy
        "eval/target_acc": acc,
        "eval/target_homophily": networks.homophily(target.adj, target.y),
        "eval/source_homophily": networks.homophily(source.adj, source.y),
    }
    if result["evolved"] is not None:
        out["eval/evolved_homophily"] = edge_homophily(result["evolved"].a, result["evolved"].y)
    return out


def evaluate(cfg: Config, result: dict[str, Any], doms: Domains) -> dict[str, float]:
    """The only place target labels are read: scores of the selected GCN and evolved-graph statistics."""
    gcn, target = result["gcn"], doms.target
    pred = predict(gcn, target)
    out = {
        "eval/target_macro_f1": f1_on(gcn, target, cfg.classes),
        "eval/target_acc": float((pred == target.y).float().mean()),
        "eval/target_micro_f1": float((pred == target.y).float().mean()),  # single-label: the accuracy
        "eval/target_homophily": edge_homophily(target.a, target.y),
        "eval/source_homophily": edge_homophily(doms.source.a, doms.source.y),
    }
    evolved: Graphs | None = result["evolved"]
    if evolved is not None:
        out["eval/evolved_homophily"] = edge_homophily(evolved.a, evolved.y)
        # per-class mean error against the target's true class means (a known generator parameter)
        err = [float((evolved.x[evolved.y == c].mean(0) - doms.means_target[c]).norm()) for c in range(cfg.classes)]
        out["eval/evolved_mean_err"] = sum(err) / len(err)
    err = [float((doms.source.x[doms.source.y == c].mean(0) - doms.means_target[c]).norm()) for c in range(cfg.classes)]
    out["eval/source_mean_err"] = sum(err) / len(err)
    return out


def _init(seed: int, build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def adapt(cfg: Config, source: Graphs, source_val: Graphs | Network, target: Unlabelled, run, *,
          classes: int | None = None, whole: tuple[Network, Network] | None = None) -> dict[str, Any]:
    """Everything that trains or selects: the score model, the guidance, the evolution, the GCN and
    its epoch selection. It receives the target as `Unlabelled` graphs: no label to read.
    `whole` = (source graph, unlabelled target graph) when the domains are two whole graphs
    (data_dir): the diffusion still runs on the subgraph batches, the GCN on the whole graphs.
    Returns the selected GCN, the evolved graphs (or None) and the label-free metrics."""
    if not isinstance(target, Unlabelled):
        raise TypeError(f"adapt takes the target as Unlabelled graphs, got {type(target).__name__}")
    if whole is not None and whole[1].y is not None:
        raise TypeError("adapt takes the whole target graph unlabelled (Network.unlabelled())")
    classes = cfg.classes if classes is None else classes
    dim = source.x.shape[-1]
    lengths = stage_lengths(cfg)
    total = sum(lengths.values())
    offset = {s: sum(lengths[p] for p in STAGES[:i]) for i, s in enumerate(STAGES)}
    sde_x, sde_a = make_sde(cfg.sde_x, cfg.x_low, cfg.x_high), make_sde(cfg.sde_adj, cfg.adj_low, cfg.adj_high)
    seed = cfg.seed * 1000
    score = _init(seed + 1, lambda: ScoreNet(dim, classes, cfg.score_hidden, cfg.score_layers))
    clf = _init(seed + 2, lambda: DomainNet(dim, cfg.guide_hidden, cfg.guide_layers))
    ratio = _init(seed + 3, lambda: DomainNet(dim, cfg.guide_hidden, cfg.guide_layers, classes=classes))
    gcn = _init(seed + 4, lambda: GCN(dim, cfg.gcn_hidden, classes, cfg.gcn_layers, cfg.gcn_dropout))
    nets = {"score": score, "guide": clf, "ratio": ratio, "gcn": gcn}
    disc = None
    if cfg.mode == "dann":  # trained with the GCN, by the GCN's optimizer
        disc = nets["disc"] = _init(seed + 5, lambda: DomainDiscriminator(gcn.out.in_features, cfg.dann_hidden))
    gcn_params = list(gcn.parameters()) + ([] if disc is None else list(disc.parameters()))
    opts = {"score": torch.optim.Adam(score.parameters(), lr=cfg.score_lr),
            "guide": torch.optim.Adam(clf.parameters(), lr=cfg.guide_lr),
            "ratio": torch.optim.Adam(ratio.parameters(), lr=cfg.guide_lr),
            "gcn": torch.optim.Adam(gcn_params, lr=cfg.gcn_lr)}
    gens = {s: torch.Generator().manual_seed(seed + 10 + i) for i, s in enumerate(STAGES)}
    bw = domain_bandwidths(source, target)
    metrics: dict[str, float] = {
        "eval/source_mmd": mmd_distance(source, target, bw),
        "eval/source_density": float(source.a.mean()),
        "eval/target_density": float(target.a.mean()),
        "eval/source_domain_acc": classifier_distance(source, target, seed + 7),
    }
    evolved: Graphs | None = None
    inter: Graphs | None = None  # mode='gradual': the intermediate domain of the current phase
    inter_phase = 0
    best: dict[str, Any] = {"f1": -math.inf, "epoch": 0, "state": None}

    step, state = 0, run.restore()
    if state is not None:
        step = int(state["step"])
        for s in STAGES:
            if s in state["nets"]:
                nets[s].load_state_dict(state["nets"][s])
                opts[s].load_state_dict(state["opts"][s])
            gens[s].set_state(state["gens"][s])
        if disc is not None:
            disc.load_state_dict(state["nets"]["disc"])
        metrics.update(state["metrics"])
        if state["evolved"] is not None:
            evolved = Graphs(**state["evolved"])
        if state.get("inter") is not None:
            inter, inter_phase = Graphs(**state["inter"]), int(state["inter_phase"])
        best = state["best"]

    def save() -> None:
        run.save({
            "step": step, "metrics": metrics, "best": best,
            "nets": {s: n.state_dict() for s, n in nets.items()}, "opts": {s: o.state_dict() for s, o in opts.items()},
            "gens": {s: g.get_state() for s, g in gens.items()},
            "evolved": None if evolved is None else {"x": evolved.x, "a": evolved.a, "y": evolved.y},
            "inter": None if inter is None else {"x": inter.x, "a": inter.a, "y": inter.y}, "inter_phase": inter_phase,
        })

    guide = None
    if lengths["guide"]:
        guide = (lambda x, a, t, y: clf(x, a, t)) if cfg.guidance == "classifier" else (lambda x, a, t, y: ratio(x, a, t, y))
    n_val = round(cfg.evolved_val_frac * cfg.source_graphs * cfg.evolved_copies) if cfg.select_by == "evolved" else 0
    train_set = val_set = None
    loss = math.nan
    for step in range(step + 1, total + 1):
        stage = next(s for s in STAGES if offset[s] < step <= offset[s] + lengths[s])
        report: dict[str, float] = {}
        if stage == "score":
            loss = score_step(score, opts["score"], sde_x, sde_a, source, cfg.score_batch, gens["score"])
            report["train/score_loss"] = loss
        elif stage == "guide":
            loss = classifier_step(clf, opts["guide"], sde_x, sde_a, source, target, cfg.score_batch, gens["guide"])
            report["train/guide_loss"] = loss
        elif stage == "ratio":
            loss = ratio_step(ratio, opts["ratio"], clf, sde_x, sde_a, source, cfg.score_batch, cfg.ratio_clip, gens["ratio"])
            report["train/ratio_loss"] = loss
        elif stage == "evolve":
            for n in nets.values():
                n.eval()
            evolved = evolve(score, sde_x, sde_a, source, cfg.evolved_copies, steps=cfg.sample_steps, gen=gens["evolve"],
                             guide=guide, scale=cfg.guidance_scale, adj_scale=cfg.guidance_scale * cfg.adj_guidance,
                             t_start=cfg.evolve_from)
            metrics["eval/evolved_mmd"] = mmd_distance(evolved, target, bw)
            metrics["eval/evolved_domain_acc"] = classifier_distance(evolved, target, seed + 7)
            metrics["eval/evolved_source_mmd"] = mmd_distance(evolved, source.unlabelled(), bw)
            metrics["eval/evolved_density"] = float(evolved.a.mean())
            report.update(metrics)
        else:
            epoch = step - offset["gcn"]
            phase = (epoch - 1) * (cfg.gradual_steps + 1) // cfg.gcn_epochs if cfg.mode == "gradual" else 0
            if phase > inter_phase:  # the next discrete domain, matched by the GCN's pseudo-labels as it stands
                inter = intermediate_graphs(source, target, predict(gcn, target), phase / (cfg.gradual_steps + 1),
                                            gens["gcn"])
                inter_phase, train_set = phase, None
                report["train/gradual_ratio"] = phase / (cfg.gradual_steps + 1)
            if train_set is None:
                train_set, val_set = gcn_sets(source if whole is None else whole[0], source_val, evolved, n_val,
                                              select_by=cfg.select_by, train_on=cfg.train_on)
                if inter is not None:  # the source keeps training beside the intermediate domain
                    train_set = Graphs(*(torch.cat([u, v]) for u, v in
                                         ((source.x, inter.x), (source.a, inter.a), (source.y, inter.y))))
            loss, extra = gcn_epoch(gcn, opts["gcn"], train_set, target if whole is None else whole[1], cfg.mmd_weight,
                                    gens["gcn"], disc=disc, dann_weight=cfg.dann_weight,
                                    progress=(epoch - 1) / cfg.gcn_epochs)
            report["train/gcn_loss"] = loss
            report.update(extra)
            if val_set is not None:
                f1 = f1_on(gcn, val_set, classes)
                report["eval/val_macro_f1"] = f1
                if f1 > best["f1"]:
                    best = {"f1": f1, "epoch": epoch, "state": {k: v.clone() for k, v in gcn.state_dict().items()}}
        if math.isfinite(loss):
            report["train/loss"] = loss
        if step % cfg.log_every == 0 or step == total or stage == "evolve":
            run.report({**report, "progress": step / total}, step=step)
        if step % cfg.checkpoint_every == 0 or step == total or step == offset[stage] + lengths[stage]:
            save()
    if best["state"] is not None:
        gcn.load_state_dict(best["state"])
    metrics["eval/selected_epoch"] = float(best["epoch"] if best["state"] is not None else cfg.gcn_epochs)
    metrics["eval/selected_val_f1"] = float(best["f1"]) if best["state"] is not None else math.nan
    metrics["train/loss"] = loss
    return {"gcn": gcn, "evolved": evolved, "metrics": metrics}
