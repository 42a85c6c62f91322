"""The Helm chart, rendered by the real helm (no cluster): lint, the value sets, the guards, security and RBAC."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from loopd.cli._app import command_tree
from loopd.server.config import config_schema
from tests.deploy.chart import CHART, NAMESPACE, Objects, render, run_helm, template, value_sets

SERVER = "loopd-server"
OPERATORS = ("loopd-router", "loopd-longhorizon")
POSTGRES = {"database": {"type": "postgresql", "postgresql": {"existingSecret": "pg"}}}


def _containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return list(deployment["spec"]["template"]["spec"]["containers"])


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container.get("env", [])}


def _rules(objects: Objects, kind: str, name: str) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every rule of a Role/ClusterRole."""
    found: set[tuple[str, str, str]] = set()
    for rule in objects.get(kind, name)["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    found.add((group, resource, verb))
    return found


def _grant(group: str, resources: dict[str, list[str]]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for resource, verbs in resources.items() for verb in verbs}


@pytest.mark.parametrize("values", value_sets(), ids=lambda path: path.name)
def test_helm_lint_passes_for_every_value_set(values: Path) -> None:
    run = run_helm(["lint", "--strict", str(CHART), "--namespace", NAMESPACE, "-f", str(values)])
    assert run.code == 0, run.stdout + run.stderr


def test_helm_lint_passes_with_the_defaults() -> None:
    run = run_helm(["lint", "--strict", str(CHART)])
    assert run.code == 0, run.stdout + run.stderr


@pytest.mark.parametrize("values", value_sets(), ids=lambda path: path.name)
def test_every_value_set_renders_the_server_its_service_and_rbac(values: Path) -> None:
    objects = render(values)
    assert SERVER in objects.names("Deployment")
    assert "loopd" in objects.names("Service")
    assert SERVER in objects.names("ServiceAccount") and SERVER in objects.names("Role")
    assert not objects.of("CustomResourceDefinition")  # CRDs live in crds/, applied explicitly


def test_the_defaults_are_one_sqlite_server_on_a_claim_and_two_replicas_of_each_operator() -> None:
    objects = render()
    server = objects.get("Deployment", SERVER)
    assert server["spec"]["replicas"] == 1
    assert server["spec"]["strategy"]["type"] == "Recreate"  # one SQLite writer at a time
    volumes = {volume["name"]: volume for volume in server["spec"]["template"]["spec"]["volumes"]}
    assert volumes["state"]["persistentVolumeClaim"]["claimName"] == SERVER
    claim = objects.get("PersistentVolumeClaim", SERVER)
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert "LOOPD_DATABASE_URL" not in _env(_containers(server)[0])
    for name in OPERATORS:
        operator = objects.get("Deployment", name)
        assert operator["spec"]["replicas"] == 2
        assert objects.get("PodDisruptionBudget", name)["spec"]["minAvailable"] == 1
    assert not objects.of("Ingress") and not objects.of("HorizontalPodAutoscaler")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"server": {"replicas": 2}}, "server.replicas=2 needs database.type=postgresql"),
        ({"server": {"autoscaling": {"enabled": True}}}, "autoscaling.enabled needs database.type=postgresql"),
        ({"database": {"type": "postgresql"}}, "needs database.postgresql.existingSecret"),
        ({"ingress": {"enabled": True, "tls": {"enabled": True}}}, "ingress.tls.enabled needs ingress.tls.secretName"),
    ],
)
def test_the_guards_refuse_settings_that_cannot_work(values: dict[str, Any], message: str, tmp_path: Path) -> None:
    run = template(values, tmp=tmp_path)
    assert run.code != 0
    assert message in run.stderr


@pytest.mark.parametrize(
    "values",
    [
        {"server": {"replicas": 0}},
        {"database": {"type": "mysql"}},
        {"server": {"port": "http"}},
        {"server": {"unknown": True}},
        {"longhorizon": {"runTimeout": "a day"}},
        {"model": {"baseURL": "ftp://x"}},
    ],
)
def test_the_values_schema_refuses_bad_values(values: dict[str, Any], tmp_path: Path) -> None:
    run = template(values, tmp=tmp_path)
    assert run.code != 0
    assert "values don't meet the specifications of the schema" in run.stderr, run.stderr


def test_postgresql_runs_three_rolling_replicas_with_the_dsn_from_the_secret(tmp_path: Path) -> None:
    objects = render(value_sets_named("postgresql"))
    server = objects.get("Deployment", SERVER)
    assert server["spec"]["replicas"] == 3
    assert server["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    env = _env(_containers(server)[0])
    assert env["LOOPD_DATABASE_URL"] == {"secretKeyRef": {"name": "loopd-postgresql", "key": "dsn"}}
    assert not objects.of("PersistentVolumeClaim")
    volumes = {volume["name"]: volume for volume in server["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["state"]
    assert objects.get("PodDisruptionBudget", SERVER)["spec"]["maxUnavailable"] == 1


def test_ingress_with_tls_routes_the_host_to_the_service() -> None:
    objects = render(value_sets_named("ingress-tls"))
    ingress = objects.get("Ingress", "loopd")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"hosts": ["loopd.example.com"], "secretName": "loopd-tls"}]
    rule = ingress["spec"]["rules"][0]
    assert rule["host"] == "loopd.example.com"
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "loopd", "port": {"name": "http"}}
    policy = objects.get("NetworkPolicy", SERVER)
    peers = policy["spec"]["ingress"][0]["from"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}} in peers


def test_hpa_scales_the_server_deployment_and_leaves_its_replicas_alone() -> None:
    objects = render(value_sets_named("hpa"))
    hpa = objects.get("HorizontalPodAutoscaler", SERVER)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": SERVER}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert "replicas" not in objects.get("Deployment", SERVER)["spec"]


def test_operators_off_renders_no_operator_objects() -> None:
    objects = render(value_sets_named("operators-off"))
    assert objects.names("Deployment") == {SERVER}
    assert objects.names("ServiceAccount") == {SERVER}
    assert not objects.of("ClusterRole") and not objects.of("ClusterRoleBinding")
    assert not objects.of("NetworkPolicy")


@pytest.mark.parametrize("values", value_sets(), ids=lambda path: path.name)
def test_every_pod_runs_as_non_root_read_only_without_capabilities(values: Path) -> None:
    objects = render(values)
    for deployment in objects.of("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"] == {"drop": ["ALL"]}
            mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
            assert "/tmp" in mounts  # the only writable places are volumes
            assert "resources" in container and container["resources"]["limits"]["memory"]
        assert pod["serviceAccountName"] == deployment["metadata"]["name"]


def test_the_server_probes_healthz_for_liveness_and_readyz_for_readiness() -> None:
    container = _containers(render().get("Deployment", SERVER))[0]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["ports"] == [{"name": "http", "containerPort": 8420, "protocol": "TCP"}]


def test_credentials_come_from_secrets_never_from_values() -> None:
    objects = render(value_sets_named("sqlite"))
    server = _env(_containers(objects.get("Deployment", SERVER))[0])
    assert server["OPENAI_API_KEY"] == {"secretKeyRef": {"name": "model-api-key", "key": "api-key"}}
    assert server["LOOPD_ADMIN_TOKEN"] == {"secretKeyRef": {"name": "loopd-auth", "key": "admin-token"}}
    assert server["LOOPD_MODEL"] == "gpt-4o-mini"
    for name, key in (("loopd-router", "router"), ("loopd-longhorizon", "longhorizon")):
        env = _env(_containers(objects.get("Deployment", name))[0])
        assert env["LOOPD_TOKEN"] == {"secretKeyRef": {"name": "loopd-auth", "key": f"{key}-token"}}
        assert env["LOOPD_SERVER"] == "http://loopd.loopd.svc:8420"
        # The server adopts the same token as that operator's own (auth.actor_tokens of its configuration).
        assert server[f"LOOPD_{key.upper()}_TOKEN"] == {"secretKeyRef": {"name": "loopd-auth", "key": f"{key}-token"}}
    secrets = {base64.b64decode(value).decode() for value in objects.get("Secret", "loopd-auth")["data"].values()}
    for config_map in objects.of("ConfigMap"):
        assert not any(secret in str(config_map["data"]) for secret in secrets)


def _config(objects: Objects) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(objects.get("ConfigMap", SERVER)["data"]["config.yaml"])
    return loaded


def test_each_operator_has_its_own_token_that_the_server_adopts() -> None:
    objects = render()
    assert _config(objects)["auth"] == {
        "actor_tokens": [
            {"actor": "operator:router", "token_env": "LOOPD_ROUTER_TOKEN"},
            {"actor": "operator:longhorizon", "token_env": "LOOPD_LONGHORIZON_TOKEN"},
        ]
    }


def test_an_existing_secret_names_the_keys(tmp_path: Path) -> None:
    values = {"auth": {"existingSecret": "tokens", "routerTokenKey": "router", "longhorizonTokenKey": "lh"}}
    objects = render(values, tmp=tmp_path)
    assert not objects.of("Secret")  # an existing Secret: the chart makes none
    server = _env(_containers(objects.get("Deployment", SERVER))[0])
    for name, key, env_name in (("loopd-router", "router", "ROUTER"), ("loopd-longhorizon", "lh", "LONGHORIZON")):
        env = _env(_containers(objects.get("Deployment", name))[0])
        assert env["LOOPD_TOKEN"] == {"secretKeyRef": {"name": "tokens", "key": key}}
        assert server[f"LOOPD_{env_name}_TOKEN"] == {"secretKeyRef": {"name": "tokens", "key": key}}


def test_an_empty_token_key_signs_that_operator_in_with_the_admin_token(tmp_path: Path) -> None:
    objects = render({"auth": {"routerTokenKey": ""}, "longhorizon": {"enabled": False}}, tmp=tmp_path)
    env = _env(_containers(objects.get("Deployment", "loopd-router"))[0])
    assert env["LOOPD_TOKEN"] == {"secretKeyRef": {"name": "loopd-auth", "key": "admin-token"}}
    assert "auth" not in _config(objects)
    assert set(objects.get("Secret", "loopd-auth")["data"]) == {"admin-token"}
    server = _env(_containers(objects.get("Deployment", SERVER))[0])
    assert "LOOPD_ROUTER_TOKEN" not in server and "LOOPD_LONGHORIZON_TOKEN" not in server


def test_the_generated_token_secret_is_kept_on_uninstall() -> None:
    secret = render().get("Secret", "loopd-auth")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert set(secret["data"]) == {"admin-token", "router-token", "longhorizon-token"}
    assert len(set(secret["data"].values())) == 3  # three different random tokens


def test_operators_run_their_command_against_the_service_with_leader_election() -> None:
    objects = render()
    router = _containers(objects.get("Deployment", "loopd-router"))[0]
    assert router["args"][:2] == ["operator", "router"]
    assert f"--namespace={NAMESPACE}" in router["args"] and "--lease-duration=15" in router["args"]
    longhorizon = _containers(objects.get("Deployment", "loopd-longhorizon"))[0]
    assert longhorizon["args"][:2] == ["operator", "longhorizon"]
    assert "--max-rounds=25" in longhorizon["args"] and "--run-timeout=24h" in longhorizon["args"]


def test_rbac_grants_each_component_only_what_its_code_calls() -> None:
    objects = render()
    assert _rules(objects, "Role", SERVER) == _grant(
        "loopd.dev", {"tasks": ["get", "list", "watch", "create", "patch", "delete"], "tasks/status": ["patch"]}
    )
    operator_base = _grant("loopd.dev", {"tasks": ["get", "list", "watch"], "tasks/status": ["patch"]}) | _grant(
        "coordination.k8s.io", {"leases": ["get", "create", "update"]}
    )
    assert _rules(objects, "Role", "loopd-router") == operator_base
    assert _rules(objects, "Role", "loopd-longhorizon") == operator_base | _grant(
        "longhorizon.loopd.dev",
        {
            "runs": ["get", "list", "watch", "create", "patch", "delete"],
            "executions": ["get", "create"],
            "audits": ["get", "create"],
            "runs/status": ["update"],
            "executions/status": ["update"],
            "audits/status": ["update"],
        },
    )
    # Cluster-wide: only reading LongHorizon's own three CRDs, by name.
    (cluster_role,) = objects.of("ClusterRole")
    assert cluster_role["rules"] == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "resourceNames": [
                "runs.longhorizon.loopd.dev",
                "executions.longhorizon.loopd.dev",
                "audits.longhorizon.loopd.dev",
            ],
            "verbs": ["get"],
        }
    ]
    for role in objects.of("Role") + objects.of("ClusterRole"):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
            assert not {"secrets", "pods", "pods/exec"} & set(rule["resources"])
    bindings = {item["metadata"]["name"]: item for item in objects.of("RoleBinding")}
    for name in (SERVER, *OPERATORS):
        assert bindings[name]["roleRef"]["name"] == name
        assert bindings[name]["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]


def test_manage_crds_adds_create_and_update_of_crds(tmp_path: Path) -> None:
    objects = render({"longhorizon": {"manageCRDs": True}}, tmp=tmp_path)
    (cluster_role,) = objects.of("ClusterRole")
    verbs = {verb for rule in cluster_role["rules"] for verb in rule["verbs"]}
    assert verbs == {"get", "update", "create"}


def test_network_policies_let_only_the_operators_reach_the_server() -> None:
    objects = render()
    server = objects.get("NetworkPolicy", SERVER)["spec"]
    assert server["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = server["ingress"]
    components = {peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in ingress["from"]}
    assert components == {"router", "longhorizon"}
    for name in OPERATORS:
        policy = objects.get("NetworkPolicy", name)["spec"]
        assert policy["ingress"] == []  # nobody connects to an operator
        targets = [rule for rule in policy["egress"] if "to" in rule]
        assert targets[0]["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "server"


def test_the_config_map_is_a_valid_loopd_server_configuration(tmp_path: Path) -> None:
    extra = {"capacity": {"harness_calls": 8}, "timeouts": {"harness_call": 600}}
    objects = render({"server": {"config": extra}}, tmp=tmp_path)
    config = yaml.safe_load(objects.get("ConfigMap", SERVER)["data"]["config.yaml"])
    jsonschema.validate(config, config_schema())
    assert config["kubernetes"] == {"api": "in-cluster", "namespace": NAMESPACE}
    assert config["listen"] == {"host": "0.0.0.0", "port": 8420, "public": True}
    assert config["capacity"] == {"harness_calls": 8}
    deployment = objects.get("Deployment", SERVER)
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/config"]  # a config change rolls the pods


def value_sets_named(name: str) -> Path:
    """The value set ``ci/<name>-values.yaml``."""
    path = CHART / "ci" / f"{name}-values.yaml"
    assert path.is_file(), path
    return path


def _cli_options(*path: str) -> set[str]:
    """The option names of ``loopd <path...>`` (from the CLI's own definition)."""
    command: Any = command_tree()
    for name in path:
        command = command.commands[name]
    return {option for param in command.params for option in getattr(param, "opts", [])}


def test_the_pods_run_commands_and_options_the_cli_has() -> None:
    objects = render(value_sets_named("sqlite"))
    for deployment in objects.of("Deployment"):
        (container,) = _containers(deployment)
        args = [arg for arg in container["args"] if not arg.startswith("-")]
        command = args[:2] if args[0] == "operator" else args[:1]
        options = _cli_options(*command)
        for arg in container["args"]:
            if arg.startswith("--"):
                assert arg.split("=", 1)[0] in options, f"{deployment['metadata']['name']}: {arg}"


def test_clusters_older_than_1_29_are_refused() -> None:
    run = template(extra=["--kube-version", "1.28.9"])
    assert run.code != 0 and "kubeVersion: >=1.29.0-0" in run.stderr, run.stderr
    assert template(extra=["--kube-version", "1.29.0"]).code == 0
