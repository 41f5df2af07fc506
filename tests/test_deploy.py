"""The deployment examples in deploy/ parse, and say what the server understands: every harmony-proxy command
line parses with the CLI's own parser, probes point at /ready and /live, several replicas share PostgreSQL,
the engine replicas are routed to by cache, and the grace period outlasts the drain."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.server.arguments import build_parser

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def serve_args(argv: list[str], env: dict[str, str] | None = None) -> Any:
    """The command line as `harmony-proxy` reads it (Kubernetes' $(VAR) filled in from the container's env)."""
    def expand(arg: str) -> str:
        return re.sub(r"\$\((\w+)\)", lambda m: (env or {})[m.group(1)], arg)

    args = [expand(arg) for arg in argv]
    assert args[0] == "serve"
    return build_parser().parse_args(args)  # an unknown flag or a bad value exits: the test fails


def check_scale_out(args: Any) -> None:
    assert args.engine == "upstream"
    assert len(args.upstream_url) >= 2
    assert args.upstream_routing == "cache-aware"
    assert args.store_url.startswith("postgresql://")
    assert args.drain_seconds > 0


def test_the_compose_file() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    proxy = services["proxy"]
    password = "pw"  # what ${POSTGRES_PASSWORD} stands for
    command = [part.replace("${POSTGRES_PASSWORD}", password) for part in proxy["command"]]
    args = serve_args(command)
    check_scale_out(args)
    assert proxy["deploy"]["replicas"] >= 2
    # Every upstream is an engine service of this file, on the port it serves.
    for url in args.upstream_url:
        host, port = re.fullmatch(r"http://([\w-]+):(\d+)/v1", url).groups()
        assert host in services and "--port" in services[host]["command"]
        assert services[host]["command"][services[host]["command"].index("--port") + 1] == port
    store = re.fullmatch(r"postgresql://(\w+):(\w+)@([\w-]+):5432/(\w+)", args.store_url)
    assert store is not None
    user, secret, host, database = store.groups()
    postgres = services[host]["environment"]
    assert (postgres["POSTGRES_USER"], postgres["POSTGRES_DB"]) == (user, database)
    assert postgres["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD") and secret == password
    assert proxy["depends_on"][host] == {"condition": "service_healthy"}
    # The load balancer's readiness check is /ready; Docker's liveness check is /live (tests/test_deploy_probes.py
    # runs them).
    labels = proxy["labels"]
    assert labels["traefik.http.services.proxy.loadbalancer.healthcheck.path"] == "/ready"
    assert labels["traefik.http.services.proxy.loadbalancer.server.port"] == str(args.port)
    assert "http://localhost:8000/live" in " ".join(proxy["healthcheck"]["test"])
    assert _seconds(proxy["stop_grace_period"]) > args.drain_seconds + args.shutdown_timeout
    assert "load-balancer" in services and services["load-balancer"]["ports"] == [f"{args.port}:{args.port}"]
    assert proxy["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"


def test_the_kubernetes_manifests() -> None:
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "harmony-proxy.yaml").read_text()))
    by_kind = {(doc["kind"], doc["metadata"]["name"]): doc for doc in documents}
    deployment = by_kind["Deployment", "harmony-proxy"]
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    env = {var["name"]: var for var in container["env"]}
    assert env["STORE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "harmony-proxy-store"
    args = serve_args(container["args"], {"STORE_URL": "postgresql://harmony:pw@postgres:5432/harmony"})
    check_scale_out(args)
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert port == args.port
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/live", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/live", "port": "http"}
    assert pod["spec"]["terminationGracePeriodSeconds"] > args.drain_seconds + args.shutdown_timeout
    service = by_kind["Service", "harmony-proxy"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    # Each upstream is a pod of the engines' StatefulSet, by its stable name through the headless Service.
    engines = by_kind["StatefulSet", "vllm"]
    assert by_kind["Service", engines["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    names = {f"http://vllm-{i}.vllm:8000/v1" for i in range(engines["spec"]["replicas"])}
    assert set(args.upstream_url) == names
    postgres = by_kind["StatefulSet", "postgres"]
    assert ("Service", "postgres") in by_kind
    assert "@postgres:5432/" in args.store_url
    assert postgres["spec"]["template"]["spec"]["containers"][0]["image"].startswith("postgres:")


def test_the_dockerfile_installs_what_the_package_is() -> None:
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())
    packages = {name.split(".")[0] for name in project["tool"]["setuptools"]["packages"]}
    copied = {line.split()[1] for line in lines if line.startswith("COPY ") and line.split()[1] == line.split()[2]}
    assert packages <= copied
    entry = next(line for line in lines if line.startswith("ENTRYPOINT"))
    assert list(project["project"]["scripts"]) == ["harmony-proxy"] and '"harmony-proxy"' in entry
    cmd = yaml.safe_load(next(line for line in lines if line.startswith("CMD")).removeprefix("CMD "))
    assert serve_args(cmd).port == 8000


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", duration)
    if match is None:
        pytest.fail(f"unexpected duration {duration!r}")
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1)
