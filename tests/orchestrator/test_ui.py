"""`ladder ui` serves the MLflow UI on the local store, on localhost, and shows our runs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

from conftest import LADDER
from orchestrator.runners import launch, registry


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ui_serves_the_store(workdir):
    launch.run_local("celerity_lm", registry.load("celerity_lm").smoke(), progress=False)
    port = _free_port()
    proc = subprocess.Popen(LADDER + ["ui", "--port", str(port)], cwd=workdir, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        health = None
        while time.monotonic() < deadline and health is None:
            try:
                health = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read().decode()
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.5)
        assert health == "OK"
        body = json.dumps({"max_results": 10}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search", data=body,
                                     headers={"Content-Type": "application/json"})
        names = [e["name"] for e in json.loads(urllib.request.urlopen(req, timeout=10).read())["experiments"]]
        assert "celerity_lm" in names
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read().decode()
        assert "<html" in page.lower()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
