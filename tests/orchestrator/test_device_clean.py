"""The device-placement check (`orchestrator.run.placement`) that lets a CPU-only machine find a
tensor a GPU run would leave on the CPU, and the device choice of `ladder run`.

Each stray below is a pattern that raises on CUDA ("Expected all tensors to be on the same
device") and runs silently on a CPU; each allowed pattern is one that CUDA runs. `ladder check`
runs every workload's smoke under the check (tests/test_conformance.py covers the built-in ones).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from orchestrator.run import LocalRun, devices
from orchestrator.run.placement import PLACED_DEVICE as DEV, DevicePlacement, PlacementError, where


def moved_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(DEV)


STRAYS = {
    "a batch never moved": lambda m: m(torch.randn(3, 4)),
    "a model never moved": lambda m: torch.nn.Linear(4, 2)(torch.randn(3, 4, device=DEV)),
    "a mask made with arange": lambda m: m(torch.randn(3, 4, device=DEV))[torch.arange(3) < 2] * torch.arange(3)[:, None],
    "numpy data through torch.tensor": lambda m: m(torch.tensor(np.ones((3, 4), dtype=np.float32))),
    "a cat of both": lambda m: torch.cat([torch.zeros(2, 4, device=DEV), torch.zeros(2, 4)]),
    "targets left behind": lambda m: F.cross_entropy(m(torch.randn(3, 4, device=DEV)), torch.tensor([0, 1, 1])),
    "numpy of a device tensor": lambda m: m(torch.randn(3, 4, device=DEV)).detach().numpy(),
    "the original after a move": lambda m: (lambda x: (x.to(DEV), m(x)))(torch.randn(3, 4)),
    "a tensor moved back by .cpu()": lambda m: m(torch.randn(3, 4, device=DEV).cpu()),
}


@pytest.mark.parametrize("stray", sorted(STRAYS))
def test_a_tensor_left_on_the_cpu_fails_the_op_that_meets_it(stray):
    with DevicePlacement():
        model = moved_model()
        with pytest.raises(PlacementError) as info:
            STRAYS[stray](model)
    msg = str(info.value)
    assert ("left on the CPU" in msg and "run.device" in msg) or "numpy()" in msg, msg
    assert "fails" in msg  # says why it matters and what to do
    assert "test_device_clean.py" in where(info.value)  # the line of the caller, not of torch


def test_what_cuda_allows_passes_and_keeps_its_placement():
    with DevicePlacement() as mode:
        model = moved_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x = torch.randn(5, 4).to(DEV)
        assert x.device == DEV and mode.placed(x) and model[0].weight.device == DEV
        for _ in range(2):  # gradients, optimizer state (CPU step counters: 0-d) and clipping
            loss = F.mse_loss(model(x), torch.zeros(5, 2, device=x.device))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        assert mode.placed(model[0].weight.grad) and mode.placed(opt.state[model[0].weight]["exp_avg"])
        y = model(x)
        y * torch.tensor(2.0)  # a CPU scalar tensor
        y[torch.tensor([0, 2])]  # CPU indices
        y.detach().copy_(torch.ones(5, 2))  # copies cross devices
        torch.ones(5, 2).copy_(y.detach())
        assert mode.placed(torch.zeros_like(y)) and mode.placed(y.new_zeros(3))
        assert mode.placed(torch.ones(2, 4).to(y.device)) and mode.placed(torch.ones(2, 4).to(y))
        assert mode.placed(copy.deepcopy(model)[0].weight)  # a copy of a moved model stays there
        assert y.detach().cpu().numpy().shape == (5, 2) and np.isfinite(loss.item())
        assert torch.empty(2, device="meta").device.type == "meta"  # meta stays meta
        # The move copied: the original is still on the CPU and meets the model's tensors nowhere.
        cpu = torch.randn(3, 4)
        cpu.to(DEV)
        assert mode.placement(cpu) is False


def test_the_check_runs_the_same_numbers_as_the_plain_cpu(tmp_path):
    """Nothing but placement changes: the same loop gives the same floats with the check on."""
    def loop(run):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = run.prepare(model, opt)
        data = torch.randn(16, 4)
        for _ in range(3):
            loss = model(data.to(run.device)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return loss.item()

    plain = loop(LocalRun(tmp_path / "a"))
    with DevicePlacement():
        checked = loop(LocalRun(tmp_path / "b", device=DEV))
    assert checked == plain


def test_a_restored_checkpoint_is_on_the_cpu_until_moved(tmp_path):
    """Checkpoints load with map_location="cpu": `ladder check` marks what `restore` returns as
    left, so a loop that uses a restored tensor without moving it fails as it would on a GPU."""
    from types import SimpleNamespace

    from orchestrator.commands.check import Placement

    def train(cfg, run):
        buf = torch.zeros(4, device=run.device)
        state = run.restore()
        if state is not None:
            buf = state["buf"] if cfg["forget_move"] else state["buf"].to(run.device)
        buf + torch.ones(4, device=run.device)
        run.save({"step": 1, "buf": buf})
        return {"train/loss": 0.0}

    W = SimpleNamespace(train=train, threads=lambda cfg: 0)
    for forget in (False, True):
        folder = tmp_path / f"forget-{forget}"
        check = Placement()
        check.train(W, {"forget_move": forget}, lambda d: LocalRun(folder, device=d))  # saves a checkpoint
        run, _ = check.restart(W, {"forget_move": forget}, folder, None)
        holds, detail = check.verdict()
        assert holds is (not forget), detail
        # The restart itself trains on the plain CPU from the folder; the check ran on a copy of it.
        assert run.restored_step == 1 and run.device == torch.device("cpu")
        assert sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(folder.name)) == [folder.name]
    assert "test_device_clean.py" in detail and "left on the CPU" in detail


def test_device_choice_and_its_refusals():
    assert devices.resolve("cpu") == torch.device("cpu")
    assert devices.resolve(None) == (torch.device("cuda", 0) if devices.cuda_count() else torch.device("cpu"))
    assert devices.tags("cpu") == {"ladder.device": "cpu"}
    with pytest.raises(devices.DeviceError, match="not a device"):
        devices.resolve("gpu0")
    if not devices.cuda_count():
        with pytest.raises(devices.DeviceError, match="torch sees no CUDA device") as info:
            devices.resolve("cuda:1")
        assert "drop --device" in str(info.value)


def test_a_local_run_says_where_it_trains_first_and_records_it(tmp_path, monkeypatch, capsys):
    from orchestrator.commands.cli import main
    from orchestrator.tracking import sink as tracking

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(["run", "curves", "--smoke", "--local", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "curves: training in this process on cpu", out
    client = tracking.client(uri)
    [run] = client.search_runs([client.get_experiment_by_name("curves").experiment_id])
    assert run.data.tags["ladder.device"] == "cpu" and run.info.status == "FINISHED"


def test_bf16_autocast_is_refused_without_a_gpu_before_anything_runs(tmp_path, monkeypatch, capsys):
    """pica and palc train in bf16 in their papers: `autocast='bf16'` runs their forward passes under
    CUDA autocast, and is refused for a run on a CPU (the CLI, a sweep's check, the trial itself)."""
    from orchestrator.commands.cli import main
    from orchestrator.sweep import Sweep, SweepError

    monkeypatch.chdir(tmp_path)
    for name in ("pica", "palc"):
        assert main(["run", name, "--smoke", "--local", "--device", "cpu", "--no-track", "--set", "autocast=bf16"]) == 2
        err = capsys.readouterr().err
        assert f"{name}: autocast='bf16' trains under CUDA autocast" in err and "set autocast=fp32" in err, err
        assert not (tmp_path / "ladder-runs").exists()  # refused before a run folder was made
        with pytest.raises(SweepError, match="autocast='bf16'"):
            Sweep(name="s", workload=name, base="smoke", overrides={"autocast": "bf16"}).check()
        # GPU workers take it (where it can run is asked at launch, apart from whether it is valid).
        Sweep(name="s", workload=name, base="smoke", overrides={"autocast": "bf16"}, gpus_per_worker=1).check()
    assert main(["run", "pica", "--smoke", "--local", "--no-track", "--set", "autocast=fp16"]) == 2
    assert "autocast must be one of 'fp32', 'bf16', got 'fp16'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no GPU"):
        devices.autocast("cpu", "bf16")
    with devices.autocast("cpu", "fp32"):
        assert not torch.is_autocast_enabled("cuda")
