"""The deployment files in deploy/ (issue 23, "Deployment files"): they parse, and every port, probe
path, environment variable and config key they use is one the gateway has.

There is no container engine or cluster here, so nothing is started: the files are read with PyYAML,
`deploy/gateway.toml` with the gateway's own `load_config`, and the routes come from the app
`build_app` makes of that config (built, not started).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.app import build_app
from gateway.cli import DATA_DIR_ENV
from gateway.config import Config, load_config, parse_listen

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
CONFIG_PATH = DEPLOY / "gateway.toml"
KUBERNETES = DEPLOY / "kubernetes"
GATEWAY_SERVICES = ("gateway-a", "gateway-b")
CONFIG_FLAG = "--config"


def documents(path: Path) -> list[dict[str, Any]]:
    loaded = [document for document in yaml.safe_load_all(path.read_text(encoding="utf-8")) if document]
    assert all(isinstance(document, dict) for document in loaded), path
    return loaded


def manifests() -> dict[tuple[str, str], dict[str, Any]]:
    """Every Kubernetes object of deploy/kubernetes, by (kind, name)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for document in documents(path):
            if document.get("kind") == "Kustomization":
                continue
            key = (document["kind"], document["metadata"]["name"])
            assert key not in found, f"{key} defined twice"
            found[key] = document
    return found


@pytest.fixture(scope="module")
def config() -> Config:
    return load_config(str(CONFIG_PATH))


def env_names_read(config: Config) -> set[str]:
    """The environment variables the gateway reads with this config."""
    names = {DATA_DIR_ENV, config.auth.principal_key_env, config.auth.introspection.client_secret_env}
    for upstream in [config.upstream, *config.upstreams]:
        names |= {upstream.auth.client_secret_env, *upstream.http.headers_env.values()}
    return names - {""}


def served_paths(config: Config, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The paths the app built from `config` routes (the env its config names set, as a pod's would be)."""
    for name in env_names_read(config) - {DATA_DIR_ENV}:
        monkeypatch.setenv(name, "set-by-the-deployment")
    return {route.resource.canonical for route in build_app(config).router.routes() if route.resource is not None}


def config_path_of(command: list[str]) -> str:
    assert CONFIG_FLAG in command, command
    return command[command.index(CONFIG_FLAG) + 1]


def seconds(value: str) -> float:
    """A compose duration ("30s", "1m30s") in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|m|s|ms)", value)
    assert parts and "".join(number + unit for number, unit in parts) == value, value
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(number) * scale[unit] for number, unit in parts)


def test_every_file_parses_and_the_config_is_the_gateways(config: Config) -> None:
    assert config.store.kind == "redis" and config.auth.mode == "api_key"
    assert config.server.metrics_listen, "metrics on a port of their own, out of the MCP clients' reach"
    documents(DEPLOY / "compose.yaml")
    assert len(manifests()) >= 7
    kustomization = documents(KUBERNETES / "kustomization.yaml")[0]
    listed = set(kustomization["resources"])
    assert listed == {path.name for path in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}


# -- compose ---------------------------------------------------------------------------------------------


def test_compose_runs_two_replicas_of_the_config_with_probes_and_a_grace_period_that_fit(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    compose = documents(DEPLOY / "compose.yaml")[0]
    services = compose["services"]
    _, port = parse_listen(config.server.listen)
    paths = served_paths(config, monkeypatch)
    for name in GATEWAY_SERVICES:
        gateway = services[name]
        assert gateway["build"]["context"] == ".." and (DEPLOY / ".." / gateway["build"]["dockerfile"]).is_file()
        mounts = {target: source for source, target, *_ in (volume.split(":") for volume in gateway["volumes"])}
        assert (DEPLOY / mounts[config_path_of(gateway["command"])]).resolve() == CONFIG_PATH
        assert {int(mapping.rsplit(":", 1)[1]) for mapping in gateway["ports"]} == {port}
        probe = " ".join(gateway["healthcheck"]["test"])
        assert f"http://127.0.0.1:{port}/readyz" in probe and "/readyz" in paths
        assert set(gateway["environment"]) <= env_names_read(config)
        assert set(gateway["environment"]) >= env_names_read(config) - {DATA_DIR_ENV}
        assert seconds(gateway["stop_grace_period"]) > config.server.drain_timeout_s
        assert gateway.get("stop_signal", "SIGTERM") == "SIGTERM"
        assert {"redis", "upstream"} <= set(gateway["depends_on"])

    redis = " ".join(services["redis"]["command"])
    assert "--maxmemory-policy noeviction" in redis and "--appendonly yes" in redis
    assert config.store.url.startswith("redis://redis:")
    upstream = services["upstream"]["command"]
    assert str(config.upstream.url) == f"http://upstream:{upstream[upstream.index('--port') + 1]}/mcp"


# -- Kubernetes ------------------------------------------------------------------------------------------


def test_the_deployment_probes_ports_env_and_grace_period_fit_the_gateway(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = manifests()
    deployment = objects[("Deployment", "mcp-task-gateway")]
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert spec["replicas"] == 2
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()

    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {
        "mcp": parse_listen(config.server.listen)[1],
        "metrics": parse_listen(config.server.metrics_listen)[1],
    }
    paths = served_paths(config, monkeypatch)
    readiness, liveness = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
    assert (readiness["path"], liveness["path"]) == ("/readyz", "/healthz")
    assert {readiness["path"], liveness["path"]} <= paths
    assert readiness["port"] in ports and liveness["port"] in ports

    # The config the pod reads is the ConfigMap's, and the ConfigMap's is deploy/gateway.toml.
    (mount,) = container["volumeMounts"]
    (volume,) = [volume for volume in pod["volumes"] if volume["name"] == mount["name"]]
    config_map = objects[("ConfigMap", volume["configMap"]["name"])]
    assert config_path_of(container["args"]) == f"{mount['mountPath']}/{CONFIG_PATH.name}"
    assert config_map["data"][CONFIG_PATH.name] == CONFIG_PATH.read_text(encoding="utf-8")

    # Secrets by reference only, for exactly the variables the config names; no Secret object shipped.
    env = {item["name"]: item for item in container["env"]}
    assert set(env) == env_names_read(config) - {DATA_DIR_ENV}
    assert all("value" not in item and "secretKeyRef" in item["valueFrom"] for item in env.values())
    assert not [key for key in objects if key[0] == "Secret"]

    # SIGTERM comes after the preStop sleep; the drain and the stop must fit in what the grace period leaves.
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > float(pre_stop[1]) + config.server.drain_timeout_s


def test_service_pdb_redis_and_upstream_match_the_deployment_and_the_config(config: Config) -> None:
    objects = manifests()
    pod_labels = objects[("Deployment", "mcp-task-gateway")]["spec"]["template"]["metadata"]["labels"]
    service = objects[("Service", "mcp-task-gateway")]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    mcp_port = next(port for port in service["spec"]["ports"] if port["targetPort"] == "mcp")
    assert f"{service['metadata']['name']}:*" in config.server.allowed_hosts and mcp_port["port"] == 8765

    budget = objects[("PodDisruptionBudget", "mcp-task-gateway")]["spec"]
    assert budget["selector"]["matchLabels"].items() <= pod_labels.items() and budget["minAvailable"] == 1

    redis = objects[("StatefulSet", "redis")]["spec"]["template"]["spec"]["containers"][0]
    arguments = " ".join(redis["args"])
    assert "--maxmemory-policy noeviction" in arguments and "--appendonly yes" in arguments
    redis_port = objects[("Service", "redis")]["spec"]["ports"][0]["port"]
    assert config.store.url == f"redis://redis:{redis_port}/0"

    upstream_port = objects[("Service", "upstream")]["spec"]["ports"][0]["port"]
    assert str(config.upstream.url) == f"http://upstream:{upstream_port}/mcp"
