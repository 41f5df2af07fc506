"""The deployment examples run (issue 26, 5): the proxy started exactly as deploy/compose.yaml and
deploy/kubernetes/ start it, with its engines down, is alive on the liveness probe's path (so nothing restarts it)
and not ready on the readiness probe's path (so nothing sends it traffic); every replica gets its reasoning key from
one shared source, and reasoning sealed by one replica opens on another."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from proxy.responses.sealing import KEY_ENV
from tests.conftest import MODEL
from tests.test_deploy import DEPLOY
from tests.test_store_processes import ROOT
from tests.waiting import eventually

SECRET = "the-one-reasoning-key-of-this-deployment"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["proxy"]


def _kubernetes() -> dict[str, Any]:
    documents = yaml.safe_load_all((DEPLOY / "kubernetes" / "harmony-proxy.yaml").read_text())
    deployment = next(doc for doc in documents if doc["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _compose_value(value: str, variables: dict[str, str]) -> str:
    """${NAME} and ${NAME:?message} as Compose fills them in (a missing required one fails, as Compose does)."""
    return re.sub(r"\$\{(\w+)(?::\?[^}]*)?\}", lambda m: variables[m.group(1)], value)


def _kubernetes_env(container: dict[str, Any], secret: dict[str, str]) -> dict[str, str]:
    env = {}
    for var in container["env"]:
        if "valueFrom" in var:
            ref = var["valueFrom"]["secretKeyRef"]
            assert ref["name"] == "harmony-proxy-store"
            env[var["name"]] = secret[ref["key"]]
        else:
            env[var["name"]] = var["value"]
    return env


class Replica:
    """The proxy as an example starts it: its own command line and environment, but on loopback: the port is a
    free one, the engines' URLs a port where nothing listens, the store this test's database."""

    def __init__(self, argv: list[str], env: dict[str, str], store_url: str, log: Path) -> None:
        self.port = _free_port()
        down = _free_port()
        argv = [re.sub(r"^--upstream-url=http://[^/]+", f"--upstream-url=http://127.0.0.1:{down}", arg) for arg in argv]
        replaced = {"--host": "127.0.0.1", "--port": str(self.port), "--store-url": store_url}
        argv = [f"{arg.split('=')[0]}={replaced[arg.split('=')[0]]}" if arg.split("=")[0] in replaced else arg
                for arg in argv]
        env = {key: value for key, value in env.items() if not key.startswith("OTEL_")}  # no collector here
        self.log = log
        with log.open("ab") as output:
            self.process = subprocess.Popen([sys.executable, "-m", "proxy", *argv], cwd=ROOT, stdout=output,
                                            stderr=output, env={**os.environ, **env})

    def get(self, path: str) -> int | None:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}{path}", timeout=10).status_code
        except httpx.TransportError:
            return None

    def running(self) -> bool:
        return self.process.poll() is None

    def wait_for(self, path: str) -> None:
        """Until `path` answers 200, as long as the replica runs (its log when it ends)."""
        eventually(lambda: self.get(path) == 200, still=self.running, interval=0.2, why=self.log.read_text)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def test_kubernetes_probes_with_the_engines_down(tmp_path: Path, postgres_url: str) -> None:
    container = _kubernetes()
    env = _kubernetes_env(container, {"STORE_URL": postgres_url, "REASONING_KEY": SECRET})
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg) for arg in container["args"]]
    replica = Replica(argv, env, postgres_url, tmp_path / "pod.log")
    try:
        replica.wait_for(container["startupProbe"]["httpGet"]["path"])
        for _ in range(5):  # as the kubelet probes, a few times: the engines stay down
            assert replica.get(container["livenessProbe"]["httpGet"]["path"]) == 200
            assert replica.get(container["readinessProbe"]["httpGet"]["path"]) == 503
            time.sleep(0.5)
        assert replica.get("/health") == 503  # which is why it is not the liveness probe
    finally:
        replica.stop()


def test_compose_probes_with_the_engines_down(tmp_path: Path, postgres_url: str) -> None:
    service = _compose()
    variables = {"POSTGRES_PASSWORD": "pw", "REASONING_KEY": SECRET}
    argv = [_compose_value(arg, variables) for arg in service["command"]]
    env = {key: _compose_value(value, variables) for key, value in service["environment"].items()}
    replica = Replica(argv, env, postgres_url, tmp_path / "replica.log")
    try:
        healthcheck = [_compose_value(part, variables).replace("localhost:8000", f"127.0.0.1:{replica.port}")
                       for part in service["healthcheck"]["test"]]
        assert healthcheck[0] == "CMD"
        program = [sys.executable if healthcheck[1] == "python" else healthcheck[1], *healthcheck[2:]]
        eventually(lambda: subprocess.run(program, capture_output=True, check=False).returncode == 0,
                   still=replica.running, interval=0.5, why=replica.log.read_text)
        path = service["labels"]["traefik.http.services.proxy.loadbalancer.healthcheck.path"]
        assert replica.get(path) == 503  # Traefik sends it nothing while the engines are down
    finally:
        replica.stop()


def test_every_replica_has_the_same_reasoning_key() -> None:
    # Compose: the replicas are one service's, all of them with its environment, whose key must be given.
    service = _compose()
    assert service["deploy"]["replicas"] >= 2
    key = service["environment"][KEY_ENV]
    assert re.fullmatch(r"\$\{(\w+):\?[^}]+\}", key)  # required: no replica starts with a random key of its own
    assert not any(arg.startswith("--reasoning-key") for arg in service["command"])
    # Kubernetes: every pod of the Deployment is its template, and the template reads the key from one Secret.
    container = _kubernetes()
    (var,) = [var for var in container["env"] if var["name"] == KEY_ENV]
    assert var["valueFrom"]["secretKeyRef"] == {"name": "harmony-proxy-store", "key": "REASONING_KEY"}
    assert not any(arg.startswith("--reasoning-key") for arg in container["args"])


def test_reasoning_sealed_by_one_replica_opens_on_another(tmp_path: Path) -> None:
    """Two replicas with the examples' key environment (the mock engine, which reasons, in place of vLLM): a
    stateless client's turn on the second carries the first's sealed reasoning, and the second opens it."""
    env = _kubernetes_env(_kubernetes(), {"STORE_URL": "", "REASONING_KEY": SECRET})
    replicas = [Replica(["serve", "--engine=mock", "--no-store", "--host=", "--port="], {KEY_ENV: env[KEY_ENV]}, "",
                        tmp_path / f"replica{n}.log") for n in range(2)]
    try:
        for replica in replicas:
            replica.wait_for("/health")
        first = httpx.post(f"http://127.0.0.1:{replicas[0].port}/v1/responses", timeout=60, json={
            "model": MODEL, "input": "What is 2 + 2?", "store": False, "include": ["reasoning.encrypted_content"]})
        assert first.status_code == 200, first.text
        output = first.json()["output"]
        assert any(item["type"] == "reasoning" and item.get("encrypted_content") for item in output)
        second = httpx.post(f"http://127.0.0.1:{replicas[1].port}/v1/responses", timeout=60, json={
            "model": MODEL, "store": False, "include": ["reasoning.encrypted_content"],
            "input": [{"role": "user", "content": "What is 2 + 2?"}, *output, {"role": "user", "content": "And 3?"}]})
        assert second.status_code == 200, second.text
    finally:
        for replica in replicas:
            replica.stop()
    log = replicas[1].log.read_text()
    assert "ignored the encrypted_content" not in log, log
    assert "sealed with a random key" not in replicas[0].log.read_text() + log
