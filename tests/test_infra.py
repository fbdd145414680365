"""infra/: every manifest parses, runs ladder commands and sweep files that exist, pins the Ray
version the project pins, references its secrets instead of holding them, keeps Ray's token
authentication on, and serves MLflow only to authenticated users (that one started for real)."""

from __future__ import annotations

import base64
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import REPO, free_port
from orchestrator.commands.cli import build_parser
from orchestrator.sweep import load_sweep_file

INFRA = REPO / "infra"
PINS = dict(line.split("==", 1) for line in (REPO / "constraints.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#"))
VERSION = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
YAMLS = sorted(INFRA.rglob("*.yaml"))
SECRET_NAME = re.compile(r"(PASSWORD|TOKEN|SECRET|ACCESS_KEY)", re.I)


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def kind(k: str) -> list[dict]:
    return [d for p in YAMLS for d in docs(p) if d.get("kind") == k]


def cluster_specs() -> list[dict]:
    return [d["spec"] for d in kind("RayCluster")] + [d["spec"]["rayClusterSpec"] for d in kind("RayJob")]


def containers(spec: dict) -> list[dict]:
    groups = [spec["headGroupSpec"]] + spec["workerGroupSpecs"]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def walk(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{path}[{i}]")
    yield path, node


def test_every_manifest_parses_and_the_expected_ones_exist():
    assert {p.relative_to(INFRA).as_posix() for p in YAMLS} >= {
        "kuberay/raycluster.yaml", "kuberay/rayjob.yaml", "cluster-launcher/aws.yaml",
        "mlflow/k8s/mlflow.yaml", "mlflow/k8s/postgres.yaml"}
    for path in YAMLS:
        assert docs(path), f"{path} holds no document"


def test_ray_version_everywhere_is_the_pinned_one():
    assert cluster_specs(), "no RayCluster or RayJob"
    for spec in cluster_specs():
        assert spec["rayVersion"] == PINS["ray"]
    dockerfile = (INFRA / "docker" / "Dockerfile").read_text()
    # The image installs ladder under constraints.txt, so its Ray is the pinned one.
    assert re.search(r"pip install .*-c constraints\.txt", dockerfile)
    assert "COPY pyproject.toml constraints.txt" in dockerfile
    images = [c["image"] for spec in cluster_specs() for c in containers(spec)]
    images.append(docs(INFRA / "cluster-launcher" / "aws.yaml")[0]["docker"]["image"])
    assert images and all(img.endswith(f"/ladder:{VERSION}") for img in images), images
    mlflow_docker = (INFRA / "mlflow" / "Dockerfile").read_text()
    assert f'"mlflow[auth]=={PINS["mlflow"]}"' in mlflow_docker and f'"Flask-WTF=={PINS["Flask-WTF"]}"' in mlflow_docker


def test_entrypoints_are_ladder_commands_on_sweep_files_that_exist():
    commands = [job["spec"]["entrypoint"] for job in kind("RayJob")]
    assert commands
    subcommands = set(build_parser()._subparsers._group_actions[0].choices)
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "ladder" and argv[1] in subcommands, command
        build_parser().parse_args(argv[1:])
        if argv[1] == "sweep":
            sweep_file = REPO / argv[2]  # the image's checkout is the working directory
            assert sweep_file.is_file(), f"{command}: no {argv[2]} in the repository"
            load_sweep_file(sweep_file).check()
    assert 'ladder = "orchestrator.commands.cli:main"' in (REPO / "pyproject.toml").read_text()


def test_secrets_are_referenced_not_inlined():
    assert not kind("Secret"), "a Secret object in infra/: create it with kubectl (see the headers), do not commit it"
    checked = 0
    for path in YAMLS:
        for d in docs(path):
            for where, node in walk(d):
                # An environment variable named like a credential takes its value from a Secret.
                if isinstance(node, dict) and SECRET_NAME.search(str(node.get("name", ""))) and (
                        "value" in node or "valueFrom" in node):
                    assert "secretKeyRef" in node.get("valueFrom", {}), f"{path}{where}: {node['name']} is inlined"
                    checked += 1
    assert checked >= 10
    text = "\n".join(p.read_text() for p in YAMLS)
    # No token value (a long opaque string after `auth_token:`); a path to a token file is fine.
    assert not re.search(r"auth_token:\s*[\"']?[A-Za-z0-9+=_-]{16,}", text) and "stringData" not in text
    assert "MLFLOW_TRACKING_PASSWORD=\n" in (INFRA / "cluster-launcher" / "ladder.env.example").read_text()


def test_ray_token_authentication_stays_on():
    for spec in cluster_specs():
        assert spec["authOptions"] == {"mode": "token", "secretName": "ladder-ray-token"}
        assert spec["enableInTreeAutoscaling"] is True
        groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
        assert {"cpu", "gpu"} <= set(groups)
        limits = groups["gpu"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) >= 1
    launcher = docs(INFRA / "cluster-launcher" / "aws.yaml")[0]
    assert "--env RAY_AUTH_MODE=token" in launcher["docker"]["run_options"]
    assert "/home/ubuntu/.ray/auth_token" in launcher["file_mounts"]
    assert "--dashboard-host=127.0.0.1" in " ".join(launcher["head_start_ray_commands"])


def test_the_cluster_launcher_config_passes_rays_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(docs(INFRA / "cluster-launcher" / "aws.yaml")[0]))  # defaults filled as `ray up` does


def test_clusters_are_wired_to_mlflow_and_shared_storage_and_fit_the_cluster_sweep():
    service = next(d for d in docs(INFRA / "mlflow" / "k8s" / "mlflow.yaml") if d["kind"] == "Service")
    url = f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local:{service['spec']['ports'][0]['port']}"
    sweep = load_sweep_file(REPO / "sweeps" / "celerity_family_cluster.py")
    for spec in cluster_specs():
        for c in containers(spec):
            env = {e["name"]: e for e in c["env"]}
            assert env["MLFLOW_TRACKING_URI"]["value"] == url
            assert {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"} <= set(env)
            assert env["LADDER_RUNS_DIR"]["value"].startswith("/mnt/ladder/")
            assert any(m["mountPath"] == "/mnt/ladder" for m in c["volumeMounts"])
        gpu = next(g for g in spec["workerGroupSpecs"] if g["groupName"] == "gpu")
        limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
        gpus, cpus = int(limits["nvidia.com/gpu"]), float(limits["cpu"])
        per_pod = min(gpus // sweep.gpus_per_worker, cpus // sweep.cpus_per_worker)
        assert per_pod * gpu["maxReplicas"] >= sweep.workers, "the GPU group cannot hold one trial of the cluster sweep"


def test_the_mlflow_deployment_sets_what_serve_sh_requires():
    script = (INFRA / "mlflow" / "serve.sh").read_text()
    required = re.search(r"for name in (.*?); do", script, re.S).group(1).replace("\\", " ").split()
    assert "--app-name basic-auth" in script
    deployment = next(d for d in docs(INFRA / "mlflow" / "k8s" / "mlflow.yaml") if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container and "args" not in container, "the image's entrypoint is serve.sh"
    env = {e["name"] for e in container["env"]}
    assert set(required) <= env, set(required) - env
    assert "ENTRYPOINT [\"/usr/local/bin/ladder-mlflow-serve\"]" in (INFRA / "mlflow" / "Dockerfile").read_text()


def _status(url: str, user: str | None = None, password: str | None = None) -> int:
    headers = {}
    if user:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):  # not listening yet
        return 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mlflow_server_refuses_anonymous_clients_and_ladder_logs_with_credentials(tmp_path, monkeypatch):
    from conftest import stop_process_group
    from orchestrator.tracking import sink as tracking

    port = free_port()
    password = "correct-horse-battery"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
           "MLFLOW_ARTIFACTS_DESTINATION": str(tmp_path / "artifacts"),
           "MLFLOW_AUTH_DATABASE_URI": f"sqlite:///{tmp_path / 'auth.db'}",
           "MLFLOW_AUTH_ADMIN_USERNAME": "admin", "MLFLOW_AUTH_ADMIN_PASSWORD": password,
           "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-only-key", "MLFLOW_HOST": "127.0.0.1",
           "MLFLOW_PORT": str(port), "MLFLOW_WORKERS": "1"}
    missing = subprocess.run(["bash", str(INFRA / "mlflow" / "serve.sh")], capture_output=True, text=True,
                             env={k: v for k, v in env.items() if k != "MLFLOW_AUTH_ADMIN_PASSWORD"})
    assert missing.returncode == 2 and "set MLFLOW_AUTH_ADMIN_PASSWORD" in missing.stderr
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(["bash", str(INFRA / "mlflow" / "serve.sh")], env=env, cwd=tmp_path,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while _status(f"{base}/health") != 200:
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()[-3000:]
            time.sleep(0.5)
        search = f"{base}/api/2.0/mlflow/experiments/search?max_results=5"
        assert _status(search) == 401
        assert _status(search, "admin", "wrong-password") == 401
        assert _status(search, "admin", password) == 200
        # ladder's own client path, with the credentials MLflow reads from the environment.
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
        run_id = tracking.start_run("infra_auth", run_name="auth-check", tags={"workload": "none"}, params={}, uri=base)
        tracking.end_run(run_id, "FINISHED", uri=base)
        assert tracking.client(base).get_run(run_id).info.status == "FINISHED"
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
        with pytest.raises(Exception, match="401|Unauthorized|credentials"):
            tracking.client(base).get_run(run_id)
    finally:
        stop_process_group(server)
