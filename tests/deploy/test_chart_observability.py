"""The chart's metrics and tracing: the ServiceMonitor (off by default) scrapes /metrics with a token of its own
that the server adopts; an OTLP endpoint reaches every pod's environment and opens its port in the NetworkPolicies.

Its value file (ci/observability.yaml) is not one of the ``*-values.yaml`` sets the server-side dry run applies: a
ServiceMonitor needs the Prometheus Operator's CRD, which that cluster does not have."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.chart import render, run_helm, template

SERVER = "loopd-server"
OPERATORS = ("loopd-router", "loopd-longhorizon")
OBSERVED = Path(__file__).parents[2] / "deploy" / "helm" / "loopd" / "ci" / "observability.yaml"


def _env(deployment: dict[str, Any]) -> dict[str, Any]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container.get("env", [])}


def _egress_ports(policy: dict[str, Any]) -> set[int]:
    return {port["port"] for rule in policy["spec"]["egress"] for port in rule.get("ports", [])}


def test_the_defaults_make_no_service_monitor_no_metrics_token_and_no_tracing() -> None:
    objects = render()
    assert "ServiceMonitor" not in objects.kinds()
    assert "metrics-token" not in objects.get("Secret", "loopd-auth")["data"]
    for name in (SERVER, *OPERATORS):
        assert not any(key.startswith("OTEL_") for key in _env(objects.get("Deployment", name)))
    assert 4318 not in _egress_ports(objects.get("NetworkPolicy", SERVER))


def test_the_service_monitor_scrapes_metrics_with_the_token_the_server_adopts() -> None:
    objects = render(OBSERVED)
    (monitor,) = objects.of("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    service = objects.get("Service", "loopd")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    assert any(port["name"] == "http" for port in service["spec"]["ports"])
    credentials = endpoint["authorization"]["credentials"]
    assert credentials == {"name": "loopd-auth", "key": "metrics-token"}
    secret = {key: base64.b64decode(value) for key, value in objects.get("Secret", "loopd-auth")["data"].items()}
    assert secret["metrics-token"] not in {value for key, value in secret.items() if key != "metrics-token"}
    # The server knows that token as operator:metrics (an actor token: /metrics answers it, nothing admin).
    config = yaml.safe_load(objects.get("ConfigMap", SERVER)["data"]["config.yaml"])
    assert {"actor": "operator:metrics", "token_env": "LOOPD_METRICS_TOKEN"} in config["auth"]["actor_tokens"]
    server = _env(objects.get("Deployment", SERVER))
    assert server["LOOPD_METRICS_TOKEN"] == {"secretKeyRef": {"name": "loopd-auth", "key": "metrics-token"}}
    # No operator runs as the scraper.
    assert "loopd-metrics" not in objects.names("Deployment")


def test_an_otlp_endpoint_reaches_every_pod_and_opens_its_port() -> None:
    objects = render(OBSERVED)
    for name, service in ((SERVER, "loopd-server"), ("loopd-router", "loopd-router")):
        env = _env(objects.get("Deployment", name))
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
        assert env["OTEL_SERVICE_NAME"] == service
    for name in (SERVER, *OPERATORS):
        assert 4318 in _egress_ports(objects.get("NetworkPolicy", name))


def test_bad_observability_values_are_refused(tmp_path: Path) -> None:
    for values in (
        {"tracing": {"otlpEndpoint": "otel-collector:4318"}},  # no scheme
        {"metrics": {"serviceMonitor": {"interval": "often"}}},
        {"metrics": {"prometheus": True}},
    ):
        run = template(values, tmp=tmp_path)
        assert run.code != 0, values


def test_helm_lint_passes_with_metrics_and_tracing() -> None:
    run = run_helm(["lint", "--strict", str(OBSERVED.parents[1]), "-f", str(OBSERVED)])
    assert run.code == 0, run.stdout + run.stderr
