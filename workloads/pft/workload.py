"""pft: Config, and the loop of the four phases and their arms (see the package docstring)."""

from __future__ import annotations

import dataclasses
import math

import torch
from components import pretrained
from orchestrator.run import devices, fraction_steps

from workloads.pft import data, frames, method, sfda
from workloads.pft.config import ARMS, MAX_WORKERS, Config  # noqa: F401  (the contract's names)
from workloads.pft.model import accuracy_report, changed_tensors, freeze, predict

def smoke() -> Config:
    """A CPU-sized run: 16-d frames, 6 source subjects, a few hundred steps per phase, a few seconds."""
    return Config(
        dim=16, source_subjects=6, frames_per_class=60, source_eval_per_class=10, target_neutral_frames=100,
        target_eval_per_class=100, hidden=64, feat=32, translator_hidden=64, source_steps=600,
        translator_steps=500, target_steps=300,
    )


def phases(cfg: Config) -> list[tuple[str, int]]:
    """(phase, steps) in the order they run; the step counter runs on across phases."""
    out = [("source", cfg.source_steps), ("translator", cfg.translator_steps),
           ("finetune", cfg.target_steps), ("pft", cfg.target_steps)]
    if cfg.scratch_arm:
        out.append(("scratch", cfg.target_steps))
    if cfg.no_exp_arm:
        out.append(("no_exp", cfg.target_steps))
    if cfg.sfda_arms:  # last, so that they leave every earlier arm's minibatch draws alone
        out += [("shot", cfg.target_steps), ("aad", cfg.target_steps)]
    return out


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no training: raised before anything is launched."""
    if cfg.data_dir:
        if not cfg.backbone:
            raise ValueError("data_dir needs backbone: a transformers image model folder or hub id, e.g. "
                             "google/vit-base-patch16-224-in21k or microsoft/resnet-50")
        if cfg.dim < 0:
            raise ValueError(f"dim must be the backbone's feature size or 0 (read from it), got {cfg.dim}")
    elif cfg.dim <= 0:
        raise ValueError(f"dim must be positive, got {cfg.dim}")
    for name in ("source_subjects", "frames_per_class", "source_eval_per_class", "target_neutral_frames",
                 "target_eval_per_class", "hidden", "feat", "translator_hidden", "batch", "source_steps",
                 "translator_steps", "target_steps", "target_batch", "log_every", "aad_k"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.classes < 2:
        raise ValueError(f"classes must be at least 2 (neutral and one expression), got {cfg.classes}")
    if not cfg.data_dir and cfg.classes - 1 > cfg.dim:
        raise ValueError(f"classes={cfg.classes} needs dim >= {cfg.classes - 1} for orthogonal expression prototypes, got dim={cfg.dim}")
    if cfg.source_subjects < 2:
        raise ValueError(f"source_subjects={cfg.source_subjects}: translator pairs need two different subjects, use >= 2")
    if cfg.target < 0:
        raise ValueError(f"target is a subject index, must be >= 0, got {cfg.target}")
    for name in ("expr_radius", "noise", "source_lr", "translator_lr", "target_lr"):
        if not getattr(cfg, name) > 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    for name in ("style_rotation", "style_scale", "style_shift", "target_rotation", "target_scale", "target_shift",
                 "exp_weight", "style_weight", "target_exp_weight", "shot_cls_weight", "aad_alpha", "aad_beta"):
        if not getattr(cfg, name) >= 0:
            raise ValueError(f"{name} must be non-negative, got {getattr(cfg, name)}")
    if cfg.exp_loss not in ("ce", "mse", "kl"):
        raise ValueError(f"exp_loss must be 'ce', 'mse' or 'kl', got {cfg.exp_loss!r}")
    if cfg.style_loss not in ("gram", "meanvar", "moments"):
        raise ValueError(f"style_loss must be 'gram', 'meanvar' or 'moments', got {cfg.style_loss!r}")
    if cfg.finetune_params not in ("model", "classifier", "encoder"):
        raise ValueError(f"finetune_params must be 'model', 'classifier' or 'encoder', got {cfg.finetune_params!r}")
    if cfg.style_loss != "gram" and cfg.batch < 2:
        raise ValueError(f"style_loss={cfg.style_loss!r} needs a spread over the batch: use batch >= 2, got {cfg.batch}")
    if not 0 < cfg.checkpoint_every_frac <= 1:
        raise ValueError(f"checkpoint_every_frac must lie in (0, 1], got {cfg.checkpoint_every_frac}")
    if cfg.threads < 0:
        raise ValueError(f"threads must be >= 0 (0: torch's own setting), got {cfg.threads}")


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it: with data_dir, the folder tree holds the expressions,
    subjects and frames the config needs, and a backbone given as a path is a model folder. Kept
    out of `validate` so that a sweep of data on a cluster's storage checks as valid anywhere."""
    if not cfg.data_dir:
        return
    layout = frames.scan(cfg.data_dir, cfg.neutral_class)
    frames.check(layout, classes=cfg.classes, target=cfg.target, source_subjects=cfg.source_subjects,
                 frames_per_class=cfg.frames_per_class, source_eval_per_class=cfg.source_eval_per_class,
                 target_neutral_frames=cfg.target_neutral_frames)
    if not pretrained.model_config(cfg.backbone):
        raise ValueError(f"backbone={cfg.backbone!r} is neither a transformers model folder (with config.json) nor a "
                         f"hub id in this machine's Hugging Face cache: {frames.BACKBONES}")


def locate(plan: list[tuple[str, int]], step: int) -> tuple[str, int, int]:
    """(phase, step within it counting from 1, its length) of global step `step` (from 1)."""
    for name, n in plan:
        if step <= n:
            return name, step, n
        step -= n
    raise ValueError(f"step {step} lies past the plan")


def snapshot(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def train(cfg: Config, run) -> dict[str, float]:
    validate(cfg, run.world_size)
    if cfg.data_dir:  # real frames through a frozen backbone
        from components.cache import cache_root

        real = frames.load(cfg, cache_root())
        if cfg.dim not in (0, real.dim):
            raise ValueError(f"backbone {cfg.backbone!r} gives {real.dim}-d features, not dim={cfg.dim}: set dim={real.dim} or 0")
        cfg = dataclasses.replace(cfg, dim=real.dim)
        world = data.World(torch.zeros(cfg.classes, real.dim), [], real.source_x, real.source_eval_x, real.source_eval_y)
        neutral = real.neutral  # [n, dim], no labels: the adaptation data
        target_frames = lambda: (real.eval_x, real.eval_y)  # noqa: E731
    else:
        world = method.make_world(cfg)
        target = method.make_target(cfg, world)
        neutral = method.neutral_frames(cfg, world, target)  # [n, dim], no labels: the adaptation data
        target_frames = lambda: method.eval_frames(cfg, world, target)  # noqa: E731
    nets = method.build_models(cfg)
    plan = phases(cfg)
    total = sum(n for _, n in plan)
    save_at = fraction_steps(total, cfg.checkpoint_every_frac)
    gen = torch.Generator().manual_seed(cfg.seed)  # minibatch draws, checkpointed with the rest

    results: dict[str, dict[str, float]] = {}  # arm -> accuracy report on the target
    diag: dict[str, float] = {}
    frozen: dict[str, dict[str, torch.Tensor]] = {}  # nets as they were when they were frozen
    memory: dict[str, torch.Tensor] = {}  # the SFDA arms' state besides weights: pseudo-labels, banks
    start, opt_state = 0, None
    state = run.restore()
    if state is not None:
        for name, sd in state["nets"].items():
            nets[name].load_state_dict(sd)
        gen.set_state(state["gen"])
        results, diag, frozen, start, opt_state = state["results"], state["diag"], state["frozen"], state["step"], state["optimizer"]
        memory = state.get("memory", {})
    for name in frozen:
        freeze(nets[name])

    def evaluate(arm: str, encoder, classifier, translator=None) -> None:
        x, y = target_frames()  # the only read of target labels
        results[arm] = accuracy_report(predict(x, encoder, classifier, translator), y, cfg.classes)
        run.report({**{f"eval/{k}/{arm}": v for k, v in results[arm].items()}, "progress": step / total}, step=step)

    def make_optimizer(phase: str) -> torch.optim.Optimizer:
        lr = {"source": cfg.source_lr, "translator": cfg.translator_lr}.get(phase, cfg.target_lr)
        return torch.optim.Adam(method.phase_params(cfg, phase, nets), lr=lr)

    optimizer = None
    if opt_state is not None and start < total and locate(plan, start + 1)[1] > 1:
        optimizer = make_optimizer(locate(plan, start + 1)[0])  # resumed mid-phase
        optimizer.load_state_dict(opt_state)
    loss_value, window_start, window_steps, steps_per_s = math.nan, devices.clock(run.device), 0, math.nan
    step = start
    for step in range(start + 1, total + 1):
        phase, local, length = locate(plan, step)
        if local == 1:  # a phase starts: set up its networks and a fresh optimizer
            if phase == "finetune":
                nets["ft_encoder"].load_state_dict(nets["encoder"].state_dict())
                nets["ft_classifier"].load_state_dict(nets["classifier"].state_dict())
            elif phase == "pft":
                nets["pft_translator"].load_state_dict(nets["translator"].state_dict())
            elif phase == "shot":
                nets["shot_encoder"].load_state_dict(nets["encoder"].state_dict())
            elif phase == "aad":
                nets["aad_encoder"].load_state_dict(nets["encoder"].state_dict())
                nets["aad_classifier"].load_state_dict(nets["classifier"].state_dict())
                memory["aad_feats"], memory["aad_scores"] = sfda.aad_banks(neutral, nets["aad_encoder"], nets["aad_classifier"])
            optimizer = make_optimizer(phase)

        if phase == "source":
            x, y = method.source_batch(world, cfg.batch, gen)
            loss = torch.nn.functional.cross_entropy(nets["classifier"](nets["encoder"](x)), y)
        elif phase == "translator":
            x1, x2 = method.pair_batch(world, cfg.batch, gen)
            l_exp, l_style = method.translator_losses(cfg, x1, x2, nets["encoder"], nets["classifier"], nets["translator"])
            loss = cfg.exp_weight * l_exp + cfg.style_weight * l_style
        else:
            idx = torch.randint(len(neutral), (cfg.target_batch,), generator=gen)
            x = neutral[idx]
            if phase == "finetune":
                loss = method.finetune_loss(x, nets["ft_encoder"], nets["ft_classifier"])
            elif phase == "shot":  # the source classifier stays frozen: SHOT adapts the encoder to it
                if (local - 1) % max(1, length // sfda.SHOT_REFRESHES) == 0:
                    memory["shot_labels"] = sfda.shot_pseudo_labels(neutral, nets["shot_encoder"], nets["classifier"])
                loss = sfda.shot_loss(x, memory["shot_labels"][idx], nets["shot_encoder"], nets["classifier"],
                                      cls_weight=cfg.shot_cls_weight)
            elif phase == "aad":
                alpha = sfda.aad_alpha(local - 1, length, alpha=cfg.aad_alpha, beta=cfg.aad_beta)
                loss, memory["aad_feats"], memory["aad_scores"] = sfda.aad_loss(
                    x, idx, memory["aad_feats"], memory["aad_scores"], nets["aad_encoder"], nets["aad_classifier"],
                    k=cfg.aad_k, alpha=alpha)
            else:
                loss = method.pft_loss(x, nets["encoder"], nets["classifier"], nets[f"{phase}_translator"],
                                       exp_weight=0.0 if phase == "no_exp" else cfg.target_exp_weight, exp_loss=cfg.exp_loss)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_value = loss.item()
        window_steps += 1

        if local == length:  # a phase ends: evaluate its arm, freeze what later phases must not move
            if phase == "source":
                freeze(nets["encoder"], nets["classifier"])
                frozen.update(encoder=snapshot(nets["encoder"]), classifier=snapshot(nets["classifier"]))
                src_pred = predict(world.source_eval_x, nets["encoder"], nets["classifier"])
                diag["source_acc"] = float((src_pred == world.source_eval_y).float().mean())
                evaluate("source", nets["encoder"], nets["classifier"])
            elif phase == "translator":
                freeze(nets["translator"])
                frozen["translator"] = snapshot(nets["translator"])
                diag["frozen_changed_by_pretraining"] = float(sum(
                    changed_tensors(frozen[n], nets[n]) for n in ("encoder", "classifier")))
                evaluate("translator", nets["encoder"], nets["classifier"], nets["translator"])
            elif phase == "finetune":
                evaluate("finetune", nets["ft_encoder"], nets["ft_classifier"])
            elif phase == "shot":
                evaluate("shot", nets["shot_encoder"], nets["classifier"])
            elif phase == "aad":
                evaluate("aad", nets["aad_encoder"], nets["aad_classifier"])
            else:
                # Only the adapted translator may differ from what the phase started with.
                diag[f"frozen_changed_by_{phase}"] = float(sum(
                    changed_tensors(frozen[n], nets[n]) for n in ("encoder", "classifier", "translator")))
                if phase == "pft":
                    diag["translator_changed_by_pft"] = float(changed_tensors(frozen["translator"], nets["pft_translator"]))
                evaluate(phase, nets["encoder"], nets["classifier"], nets[f"{phase}_translator"])
        if step % cfg.log_every == 0 or local == length:
            now = devices.clock(run.device)
            steps_per_s = window_steps / max(now - window_start, 1e-9)
            window_start, window_steps = now, 0
            run.report({"train/loss": loss_value, f"train/loss/{phase}": loss_value, "perf/steps_per_s": steps_per_s,
                        "progress": step / total}, step=step)
        if step in save_at or local == length:
            run.save({"step": step, "nets": {n: net.state_dict() for n, net in nets.items()}, "gen": gen.get_state(),
                      "optimizer": optimizer.state_dict(), "results": results, "diag": diag, "frozen": frozen,
                      "memory": memory})
    out = {f"eval/{k}/{arm}": v for arm, r in results.items() for k, v in r.items()}
    out.update({f"diag/{k}": v for k, v in diag.items()})
    out.update({"train/loss": loss_value, "perf/steps_per_s": steps_per_s})
    return out
