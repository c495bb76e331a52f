"""The Helm chart, rendered offline by Helm's own Go engine (helm-python-sdk, no helm binary).

Every rendered manifest is validated strictly against the Kubernetes schemas of each supported
version (kubernetes-validate's Python API: its CLI exits 0 on an unknown apiVersion). The
ServiceMonitor and ScaledObject are custom resources without a schema there: they are listed in
``CUSTOM_RESOURCES`` and checked field by field below instead; any other kind without a schema
fails. What the service itself requires (probe paths, ports, the read-only engines directory,
grace period, metric and setting names) is asserted against the service's own code, not against
copies of its names.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError

from ttsvc.config import Settings
from ttsvc.observability.metrics import ServiceMetrics
from ttsvc.voice import NAME_MAX, name_problem

CHART = Path(__file__).resolve().parents[2] / "helm" / "ttsvc"
SUPPORTED_KUBERNETES = ("1.33", "1.34", "1.35", "1.36", "1.37")
"""The versions docs/deploy.md and Chart.yaml's kubeVersion promise."""
CUSTOM_RESOURCES = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("keda.sh/v1alpha1", "ScaledObject"),
}
RELEASE, NAMESPACE = "speech", "tts"
IMAGE_ENGINES = "/opt/ttsvc/engines"
"""Where the cpu image holds its engines (the Dockerfile's TTSVC_ENGINES_DIR, which
tests/deploy/test_image.py holds equal to the chart's engines.imagePath)."""
FULLNAME = f"{RELEASE}-ttsvc"

VALUES_SETS = {"defaults": {}} | {
    p.name.removesuffix("-values.yaml"): yaml.safe_load(p.read_text())
    for p in sorted((CHART / "ci").glob("*-values.yaml"))
}
"""Defaults plus every example under ci/ (chart-testing's convention): gpu, autoscaling on a TTS
metric, on CPU and through KEDA, ServiceMonitor on, engines from the image, API keys on."""


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: helm.Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object the chart renders for ``values`` (NOTES.txt is text, not a manifest)."""
    out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [
        doc
        for name, text in sorted(out.items())
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def exported_metrics() -> set[str]:
    """Every metric (family) and series name ttsvc's metrics port serves, from the service's own
    registry: ``ttsvc_ttfa_seconds`` as well as its ``_bucket``, ``_count`` and ``_sum``."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ()}
    families = list(ServiceMetrics().registry.collect())
    return {f.name for f in families} | {f.name + s for f in families for s in suffixes[f.type]}


def settings_configmap(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The TTSVC_* ConfigMap's data (the other ConfigMap is the dashboard)."""
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap"
                    and o["metadata"]["name"] == FULLNAME]  # fmt: skip
    data: dict[str, str] = configmap["data"]
    return data


def settings_from(data: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The Settings the service builds from these variables and no other TTSVC_* ones."""
    for key in [k for k in os.environ if k.startswith("TTSVC_")]:
        monkeypatch.delenv(key)
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    return Settings()


def test_values_sets_cover_what_the_issue_asks() -> None:
    assert {"defaults", "gpu", "autoscaling-metric", "servicemonitor", "api-keys", "wyoming",
            "voices", "voices-per-pod", "hostpath",
            "network-policy"} <= VALUES_SETS.keys()  # fmt: skip


@pytest.mark.parametrize("name", sorted(VALUES_SETS))
def test_lint_strict_is_clean(name: str) -> None:
    report = helm.lint(CHART, VALUES_SETS[name], strict=True, namespace=NAMESPACE,
                       kube_version=f"v{SUPPORTED_KUBERNETES[0]}.0")  # fmt: skip
    assert report["errors"] == []
    # severity 1 is information (only "icon is recommended": the project publishes no icon)
    assert [m for m in report["messages"] if m["severity"] > 1] == []


def test_chart_promises_the_versions_validated_here(chart: helm.Chart) -> None:
    """Helm refuses to install on a cluster below kubeVersion: the oldest version tested here."""
    assert chart.metadata["kubeVersion"] == f">={SUPPORTED_KUBERNETES[0]}.0-0"


@pytest.mark.parametrize("name", sorted(VALUES_SETS))
def test_every_manifest_validates_strictly(chart: helm.Chart, name: str) -> None:
    objects = render(chart, VALUES_SETS[name])
    assert objects
    for obj in objects:
        for version in SUPPORTED_KUBERNETES:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except SchemaNotFoundError:
                assert (obj["apiVersion"], obj["kind"]) in CUSTOM_RESOURCES, obj["kind"]


@pytest.mark.parametrize("name", sorted(VALUES_SETS))
def test_pod_contract(chart: helm.Chart, name: str) -> None:
    """What the service needs from its pod, in every values set."""
    objects = render(chart, VALUES_SETS[name])
    settings = Settings()  # the service's defaults, which the chart must agree with
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    c = container(objects)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    wyoming = VALUES_SETS[name].get("ports", {}).get("wyoming", settings.wyoming_port)
    wanted = {"http": settings.port, "metrics": settings.metrics_port}
    assert ports == wanted | ({"wyoming": wyoming} if wyoming else {})

    for probe, path in (("readinessProbe", "/health"), ("startupProbe", "/live"),
                        ("livenessProbe", "/live")):  # fmt: skip
        assert c[probe]["httpGet"] == {"path": path, "port": "http"}
    assert c["readinessProbe"]["periodSeconds"] == 5

    # the engines: a whole directory, read-only, where TTSVC_ENGINES_DIR points
    data = settings_configmap(objects)
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "engines"]
    assert mount["readOnly"] is True
    assert "subPath" not in mount and "subPathExpr" not in mount
    assert mount["mountPath"] == data["TTSVC_ENGINES_DIR"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "engines"]
    storage = VALUES_SETS[name].get("engines", {}).get("storage", "perPod")
    kind = {"perPod": "emptyDir", "pvc": "persistentVolumeClaim", "hostPath": "hostPath"}[storage]
    assert kind in volume
    if storage == "hostPath":
        assert volume["hostPath"]["type"] in ("Directory", "DirectoryOrCreate")
    assert data["TTSVC_COMPILE_DEFAULT_VOICE"] == "false"  # never write into the engines dir
    # the service binds loopback unless told: in a pod the Service, kubelet's probes and
    # Prometheus come from outside the container
    assert data["TTSVC_HOST"] == "0.0.0.0" != settings.host

    # read-only root: the only writable place is /tmp, and the engine cache lives there
    (tmp,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    (tmp_volume,) = [v for v in pod["volumes"] if v["name"] == tmp["name"]]
    assert "emptyDir" in tmp_volume
    assert data["TTSVC_ENGINE_CACHE_DIR"].startswith("/tmp/")
    assert all(m["mountPath"] == "/tmp" or m.get("readOnly") for m in c["volumeMounts"])

    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for each in [c, *pod.get("initContainers", [])]:
        assert each["securityContext"] == {
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }
    assert pod["automountServiceAccountToken"] is False

    # SIGKILL must not come before the preStop sleep and the drain are over
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = float(data["TTSVC_DRAIN_GRACE_S"])
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]

    service = one(objects, "Service")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        name: (port, name) for name, port in ports.items()
    }


RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}  # fmt: skip
"""The volume types Pod Security "restricted" allows (every other source, hostPath first)."""
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}  # fmt: skip
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
NEEDS_MORE_THAN_RESTRICTED = {
    "gpu": "TensorRT plans from each node's directory (hostPath): Pod Security privileged",
    "hostpath": "engines from each node's directory (hostPath): Pod Security privileged",
}
"""Examples that need more than "restricted", with the reason (each example's file says so too);
each may break that profile's rules only by hostPath volumes."""


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every pod template the objects carry, named by its object."""
    for obj in objects:
        spec = obj.get("spec", {})
        template = {
            "Pod": obj,
            "Deployment": spec.get("template"),
            "StatefulSet": spec.get("template"),
            "DaemonSet": spec.get("template"),
            "ReplicaSet": spec.get("template"),
            "Job": spec.get("template"),
            "CronJob": spec.get("jobTemplate", {}).get("spec", {}).get("template"),
        }.get(obj["kind"])
        if template is not None:
            yield f"{obj['kind']}/{obj['metadata']['name']}", template["spec"]


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Where ``pod`` breaks Kubernetes' Pod Security Standards, "restricted" profile (which
    includes "baseline"), as the admission controller judges it at its latest version."""
    found: list[str] = []
    psc = pod.get("securityContext", {})
    containers = [*pod.get("initContainers", []), *pod.get("containers", []),
                  *pod.get("ephemeralContainers", [])]  # fmt: skip
    for host in ("hostNetwork", "hostPID", "hostIPC"):  # hostUsers false is the safer one
        if pod.get(host) is True:
            found.append(f"{host}: {pod[host]}")
    for volume in pod.get("volumes", []):
        source = set(volume) - {"name"}
        if not source <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: {', '.join(sorted(source))}")
    for sysctl in psc.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"sysctl {sysctl['name']}")
    if psc.get("runAsUser") == 0:
        found.append("pod runAsUser 0")
    if psc.get("seLinuxOptions", {}).get("type", "") not in SELINUX_TYPES:
        found.append("pod seLinuxOptions.type")
    if psc.get("appArmorProfile", {}).get("type", "RuntimeDefault") == "Unconfined":
        found.append("pod appArmorProfile Unconfined")
    pod_seccomp = psc.get("seccompProfile", {}).get("type")
    for c in containers:
        name, sc = c["name"], c.get("securityContext", {})
        if sc.get("privileged"):
            found.append(f"{name}: privileged")
        if sc.get("windowsOptions", {}).get("hostProcess"):
            found.append(f"{name}: hostProcess")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            found.append(f"{name}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            found.append(f"{name}: procMount")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation not false")
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
            found.append(f"{name}: runAsNonRoot not true")
        if sc.get("runAsUser") == 0:
            found.append(f"{name}: runAsUser 0")
        if sc.get("seccompProfile", {}).get("type", pod_seccomp) not in ("RuntimeDefault",
                                                                        "Localhost"):
            found.append(f"{name}: seccompProfile not RuntimeDefault or Localhost")  # fmt: skip
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            found.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: capabilities add {caps['add']}")
        if sc.get("appArmorProfile", {}).get("type") == "Unconfined":
            found.append(f"{name}: appArmorProfile Unconfined")
    return found


@pytest.mark.parametrize("name", sorted(VALUES_SETS))
def test_every_pod_meets_pod_security_restricted(chart: helm.Chart, name: str) -> None:
    """The default render and every example: each pod the chart makes (the Deployment's, the
    voices Job's) passes "restricted", but for the hostPath of the examples that say so."""
    pods = dict(pod_specs(render(chart, VALUES_SETS[name])))
    assert "Deployment/" + FULLNAME in pods
    allowed = r"volume engines: hostPath" if name in NEEDS_MORE_THAN_RESTRICTED else r"(?!)"
    for where, pod in pods.items():
        broken = [v for v in restricted_violations(pod) if not re.fullmatch(allowed, v)]
        assert broken == [], f"{name}: {where}"
    if name in NEEDS_MORE_THAN_RESTRICTED:
        assert any(restricted_violations(pod) for pod in pods.values()), "no longer needs more"
        text = (CHART / "ci" / f"{name}-values.yaml").read_text()
        assert 'Pod Security "privileged"' in text  # the example says what it needs


def test_the_restricted_check_can_fail(chart: helm.Chart) -> None:
    """What "restricted" refuses is found: the checker is not a pass for everything."""
    (pod,) = [p for _, p in pod_specs(render(chart, {}))]
    assert restricted_violations(pod) == []
    assert restricted_violations(pod | {"hostUsers": False}) == []  # a user namespace: allowed
    c = pod["containers"][0]
    pod = pod | {"hostNetwork": True, "volumes": [*pod["volumes"], {"name": "x", "hostPath": {
        "path": "/"}}], "containers": [c | {"securityContext": {"privileged": True,
        "capabilities": {"add": ["SYS_ADMIN"]}}, "ports": [{"containerPort": 1, "hostPort": 1}]}],
        "initContainers": [pod["initContainers"][0] | {"securityContext": {}}]}  # fmt: skip
    assert restricted_violations(pod) == [
        "hostNetwork: True", "volume x: hostPath",
        "seed-engines: allowPrivilegeEscalation not false",
        "seed-engines: capabilities do not drop ALL",
        "ttsvc: privileged", "ttsvc: hostPort", "ttsvc: allowPrivilegeEscalation not false",
        "ttsvc: capabilities do not drop ALL", "ttsvc: capabilities add ['SYS_ADMIN']",
    ]  # fmt: skip


def test_the_documented_publisher_pod_is_restricted_and_mounts_the_claim(
    chart: helm.Chart,
) -> None:
    """docs/deploy.md's pod for publishing into a shared claim: valid for every supported
    version, "restricted", and on the claim and path the chart gives release ``tts``."""
    docs = (CHART.parents[1] / "docs" / "deploy.md").read_text()
    block = re.search(r"```yaml\n\s*# publisher\.yaml\n(.*?)```", docs, re.S)
    assert block is not None
    pod = yaml.safe_load(textwrap.dedent(block.group(1)))
    for version in SUPPORTED_KUBERNETES:
        kubernetes_validate.validate(pod, version, strict=True)
    assert restricted_violations(pod["spec"]) == []
    out = chart.render({"engines": {"storage": "pvc"}}, name="tts", namespace="speech")
    (claim,) = [d for d in yaml.safe_load_all(out["ttsvc/templates/engines-pvc.yaml"]) if d]
    assert pod["metadata"]["namespace"] == "speech"
    (volume,) = [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    (mount,) = [m for m in pod["spec"]["containers"][0]["volumeMounts"]
                if m["name"] == volume["name"]]  # fmt: skip
    assert mount["mountPath"] == chart.values["engines"]["mountPath"]
    assert pod["spec"]["securityContext"]["runAsUser"] == chart.values["securityContext"][
        "runAsUser"]  # fmt: skip


def test_default_install_needs_no_node_and_no_storage_class(chart: helm.Chart) -> None:
    """The default render mounts no hostPath and claims no volume: the engines are a per-pod
    emptyDir that an init container seeds from the image before the service starts."""
    objects = render(chart, {})
    assert "hostPath" not in json.dumps(objects)
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "engines"]
    assert set(volume) == {"name", "emptyDir"}
    seed = pod["initContainers"][0]
    assert seed["name"] == "seed-engines" and "restartPolicy" not in seed  # done before serving
    engines_dir = settings_configmap(objects)["TTSVC_ENGINES_DIR"]
    assert seed["args"] == seed_args(engines_dir)
    (mount,) = seed["volumeMounts"]
    assert mount == {"name": "engines", "mountPath": engines_dir}
    assert seed["image"] == container(objects)["image"]
    # the gpu image has no engines to seed with; a node's directory is not the pod's to fill
    for values in (VALUES_SETS["gpu"], VALUES_SETS["hostpath"],
                   {"engines": {"seedFromImage": False}}):  # fmt: skip
        pod = one(render(chart, values), "Deployment")["spec"]["template"]["spec"]
        assert "seed-engines" not in {c["name"] for c in pod.get("initContainers", [])}


def seed_args(engines_dir: str) -> list[str]:
    """The seed's command: the image's engines (the Dockerfile's TTSVC_ENGINES_DIR) copied in."""
    return ["engines", "copy", IMAGE_ENGINES, "--engines-dir", engines_dir]


def test_replicas_spread_over_nodes_then_zones_but_one_node_will_do(chart: helm.Chart) -> None:
    objects = render(chart, {})
    pod = one(objects, "Deployment")["spec"]["template"]
    constraints = pod["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in constraints] == ["kubernetes.io/hostname",
                                                        "topology.kubernetes.io/zone"]  # fmt: skip
    for c in constraints:
        assert c["whenUnsatisfiable"] == "ScheduleAnyway"  # a preference: one node takes all
        assert c["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert c["matchLabelKeys"] == ["pod-template-hash"]
    own = {"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
           "labelSelector": {"matchLabels": {"tier": "tts"}}}  # fmt: skip
    pod = one(render(chart, {"topologySpreadConstraints": [own]}), "Deployment")["spec"]
    assert pod["template"]["spec"]["topologySpreadConstraints"] == [own]
    off = one(render(chart, {"topologySpreadConstraints": []}), "Deployment")["spec"]
    assert "topologySpreadConstraints" not in off["template"]["spec"]


def test_network_policy_lets_only_prometheus_reach_the_metrics_port(chart: helm.Chart) -> None:
    assert not [o for o in render(chart, {}) if o["kind"] == "NetworkPolicy"]  # off by default
    values = VALUES_SETS["network-policy"]
    objects = render(chart, values)
    policy = one(objects, "NetworkPolicy")
    labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = {tuple(p["port"] for p in r["ports"]): r.get("from") for r in
             policy["spec"]["ingress"]}  # fmt: skip
    ports = {p["name"] for p in container(objects)["ports"]}
    assert {port for key in rules for port in key} == ports  # every port, by its name
    assert rules[("http",)] == values["networkPolicy"]["apiFrom"]
    # one peer carrying both selectors: Prometheus' pods in Prometheus' namespace, not either
    assert rules[("metrics",)] == [values["networkPolicy"]["metrics"]]
    wyoming = one(render(chart, values | {"ports": {"wyoming": 10200}}), "NetworkPolicy")
    assert [p["port"] for p in wyoming["spec"]["ingress"][0]["ports"]] == ["http", "wyoming"]
    anyone = one(render(chart, {"networkPolicy": {"enabled": True}}), "NetworkPolicy")
    assert "from" not in anyone["spec"]["ingress"][0]  # the API as open as the Service


@pytest.mark.parametrize(
    ("pre_stop", "drain"), [(1, 0), (5, 30), (10, 0.5), (30, 600), (300, 3600)]
)
def test_grace_period_covers_prestop_and_drain(chart: helm.Chart, pre_stop: int,
                                               drain: float) -> None:  # fmt: skip
    objects = render(chart, {"lifecycle": {"preStopSleepSeconds": pre_stop},
                             "settings": {"drain_grace_s": drain}})  # fmt: skip
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain
    assert float(settings_configmap(objects)["TTSVC_DRAIN_GRACE_S"]) == drain


@pytest.mark.parametrize("name", sorted(VALUES_SETS))
def test_configmap_is_settings_the_service_accepts(
    chart: helm.Chart, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every key is a real Settings field (Settings ignores unknown TTSVC_* variables, so a typo
    would pass silently), and the service builds its Settings from them."""
    data = settings_configmap(render(chart, VALUES_SETS[name]))
    fields = {f"TTSVC_{field.upper()}" for field in Settings.model_fields}
    assert set(data) <= fields, set(data) - fields
    settings = settings_from(data | pod_cpus(render(chart, VALUES_SETS[name])), monkeypatch)
    assert str(settings.engines_dir) == data["TTSVC_ENGINES_DIR"]


def pod_cpus(objects: list[dict[str, Any]]) -> dict[str, str]:
    """TTSVC_CPUS as the kubelet sets it from the container's downward API reference: its CPU
    request in whole CPUs, rounded up (none where the chart sets no such reference)."""
    c = container(objects)
    refs = {e["name"]: e["valueFrom"]["resourceFieldRef"] for e in c.get("env", [])}
    if "TTSVC_CPUS" not in refs:
        return {}
    assert refs == {"TTSVC_CPUS": {"resource": "requests.cpu", "divisor": "1"}}
    request = str(c["resources"]["requests"]["cpu"])
    cores = int(request[:-1]) / 1000 if request.endswith("m") else float(request)
    return {"TTSVC_CPUS": str(math.ceil(cores))}


@pytest.mark.parametrize(
    ("values", "split"),
    [
        ({}, (1, 2)),  # the default request, cpu: "2"
        ({"resources": {"requests": {"cpu": "500m"}}}, (1, 1)),
        ({"resources": {"requests": {"cpu": "6"}}}, (2, 3)),
        ({"resources": {"requests": {"cpu": "16"}}}, (4, 4)),
        ({"resources": {"requests": {"cpu": "8"}}, "settings": {"workers": 4}}, (4, 2)),
        ({"resources": {"requests": {"cpu": "8"}}, "settings": {"cpus": 3}}, (1, 3)),
    ],
)
def test_pod_plans_workers_and_threads_for_its_cpu_request(
    chart: helm.Chart, values: dict[str, Any], split: tuple[int, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pod without a CPU limit has no cgroup quota, and its affinity mask is the node's cores:
    the chart hands the service its CPU request, so the split never follows the node's size. A
    ``cpus`` setting replaces the request."""
    objects = render(chart, values)
    env = settings_configmap(objects) | pod_cpus(objects)
    settings = settings_from(env, monkeypatch)
    assert (settings.workers, settings.compute_threads) == split
    assert settings.cpu_budget().source == "cpus setting"


def test_api_keys_are_a_read_only_secret_directory(
    chart: helm.Chart, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Secret is mounted as a directory (a subPath mount never sees the Secret's updates, so
    keys could not be rotated) and TTSVC_API_KEYS_FILE names the file inside that mount."""
    for values, secret, key in (
        (VALUES_SETS["api-keys"], "ttsvc-keys", "keys"),
        ({"apiKeys": {"existingSecret": "tenant-keys", "key": "keys.txt"}}, "tenant-keys",
         "keys.txt"),
    ):  # fmt: skip
        objects = render(chart, values)
        pod = one(objects, "Deployment")["spec"]["template"]["spec"]
        (mount,) = [m for m in container(objects)["volumeMounts"] if m["name"] == "api-keys"]
        assert mount["readOnly"] is True
        assert "subPath" not in mount and "subPathExpr" not in mount
        (volume,) = [v for v in pod["volumes"] if v["name"] == "api-keys"]
        assert volume["secret"]["secretName"] == secret
        assert volume["secret"]["items"] == [{"key": key, "path": key}]
        data = settings_configmap(objects)
        assert data["TTSVC_API_KEYS_FILE"] == f"{mount['mountPath']}/{key}"
        settings = settings_from(data, monkeypatch)
        assert settings.api_keys_file is not None
        assert settings.api_keys_file.parent.as_posix() == mount["mountPath"]
        assert not settings.api_keys_file.is_relative_to(data["TTSVC_ENGINES_DIR"])


def test_api_keys_are_off_by_default(chart: helm.Chart, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(chart, {})
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert "api-keys" not in {v["name"] for v in pod["volumes"]}
    assert "api-keys" not in {m["name"] for m in container(objects)["volumeMounts"]}
    data = settings_configmap(objects)
    assert "TTSVC_API_KEYS_FILE" not in data
    assert settings_from(data, monkeypatch).api_keys_file is None


def test_list_and_map_settings_reach_the_service_as_json(
    chart: helm.Chart, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pydantic-settings parses list and dict fields from the env as JSON, not Go's %v text."""
    wanted = {
        "cors_origins": ["https://app.example.com", "http://localhost:3000"],
        "voice_aliases": {"narrator": "en_US-joe-medium"},
        "default_rpm": 120,
        "default_audio_s_per_min": 12.5,
    }
    data = settings_configmap(render(chart, {"settings": wanted}))
    assert json.loads(data["TTSVC_CORS_ORIGINS"]) == wanted["cors_origins"]
    settings = settings_from(data, monkeypatch)
    assert {name: getattr(settings, name) for name in wanted} == wanted
    assert settings_from(settings_configmap(render(chart, {"settings": {"cors_origins": []}})),
                         monkeypatch).cors_origins == []  # fmt: skip


def test_connection_bounds_are_chart_settings(
    chart: helm.Chart, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every transport's session bounds can be set from the chart (its schema lists each
    setting it lets through: a bound missing there fails the install)."""
    wanted = {"ws_max_sessions": 32, "ws_idle_timeout_s": 15.0, "wyoming_max_connections": 8,
              "wyoming_idle_timeout_s": 10.0}  # fmt: skip
    settings = settings_from(settings_configmap(render(chart, {"settings": wanted})),
                             monkeypatch)  # fmt: skip
    assert {name: getattr(settings, name) for name in wanted} == wanted


def test_wyoming_is_an_option_off_by_default(
    chart: helm.Chart, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off: no port anywhere and the service's own default (off). Set: the container and the
    Service expose it, and the service is told to listen there."""
    objects = render(chart, {})
    assert "wyoming" not in {p["name"] for p in container(objects)["ports"]}
    assert "TTSVC_WYOMING_PORT" not in settings_configmap(objects)
    assert settings_from(settings_configmap(objects), monkeypatch).wyoming_port == 0
    objects = render(chart, VALUES_SETS["wyoming"])
    (port,) = [p for p in container(objects)["ports"] if p["name"] == "wyoming"]
    assert port == {"name": "wyoming", "containerPort": 10200, "protocol": "TCP"}
    (service,) = [p for p in one(objects, "Service")["spec"]["ports"] if p["name"] == "wyoming"]
    assert (service["port"], service["targetPort"]) == (10200, "wyoming")
    assert settings_from(settings_configmap(objects), monkeypatch).wyoming_port == 10200


def test_schema_settings_are_settings_fields(chart: helm.Chart) -> None:
    schema = chart.schema
    assert schema is not None
    assert set(schema["properties"]["settings"]["properties"]) <= set(Settings.model_fields)


def test_settings_change_rolls_the_pods(chart: helm.Chart) -> None:
    def checksum(values: dict[str, Any]) -> str:
        pod = one(render(chart, values), "Deployment")["spec"]["template"]
        return str(pod["metadata"]["annotations"]["checksum/config"])

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"settings": {"log_level": "debug"}})


def test_gpu_values(chart: helm.Chart) -> None:
    objects = render(chart, VALUES_SETS["gpu"])
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    c = container(objects)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert c["image"].endswith("-gpu")
    cpu = render(chart, {})
    assert "nvidia.com/gpu" not in str(cpu) and not container(cpu)["image"].endswith("-gpu")


def test_hpa_scales_on_a_metric_the_service_exports(chart: helm.Chart) -> None:
    objects = render(chart, VALUES_SETS["autoscaling-metric"])
    hpa = one(objects, "HorizontalPodAutoscaler")
    names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert names == ["ttsvc_headroom_used"]  # real-time room in use, served by the adapter rules
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": FULLNAME}  # fmt: skip
    # the HPA owns the replica count
    assert "replicas" not in one(objects, "Deployment")["spec"]
    assert one(objects, "ServiceMonitor")


def test_prometheus_adapter_rules_serve_exported_metrics() -> None:
    """The adapter example names each rule after the series it reads, so HPA metric names and
    Prometheus names are the same words; the chart's default HPA metric is among them."""
    rules = yaml.safe_load((CHART / "examples" / "prometheus-adapter-values.yaml").read_text())
    exported = exported_metrics()
    served = set()
    for rule in rules["rules"]["custom"]:
        series = rule["seriesQuery"].split("{")[0]
        assert series in exported, series
        name = rule["name"]["as"]
        # a gauge that falls as load grows (headroom) is served as the share used, which an
        # HPA can scale up on: ttsvc_headroom_ratio becomes ttsvc_headroom_used, 1 - it
        derived = name == series.removesuffix("_ratio") + "_used"
        assert name in exported or derived, name
        assert not derived or rule["metricsQuery"].startswith("1 - ")
        served.add(name)
    with helm.Chart.load(CHART) as loaded:
        assert loaded.values["autoscaling"]["metric"]["name"] in served


def test_cpu_autoscaling(chart: helm.Chart) -> None:
    hpa = one(render(chart, VALUES_SETS["autoscaling-cpu"]), "HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"


def test_keda_scaled_object(chart: helm.Chart) -> None:
    """No schema for ScaledObject in kubernetes-validate: its fields are checked here."""
    objects = render(chart, VALUES_SETS["autoscaling-keda"])
    assert not [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]  # KEDA makes it
    scaled = one(objects, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"] == {"name": FULLNAME}
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    query = trigger["metadata"]["query"]
    assert f'namespace="{NAMESPACE}"' in query and f'service="{FULLNAME}"' in query
    assert set(re.findall(r"ttsvc_[a-z_]+", query)) == {"ttsvc_headroom_ratio"}
    assert "ttsvc_headroom_ratio" in exported_metrics()
    assert float(trigger["metadata"]["threshold"]) > 0


def test_service_monitor(chart: helm.Chart) -> None:
    """No schema for ServiceMonitor in kubernetes-validate: its fields are checked here."""
    objects = render(chart, VALUES_SETS["servicemonitor"])
    monitor = one(objects, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = one(objects, "Service")
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert selected.items() <= service["metadata"]["labels"].items()
    assert "metrics" in {p["name"] for p in service["spec"]["ports"]}
    assert not [o for o in render(chart, {}) if o["kind"] == "ServiceMonitor"]  # optional


def test_disruption_budget_selects_the_pods(chart: helm.Chart) -> None:
    objects = render(chart, {})
    pdb = one(objects, "PodDisruptionBudget")
    labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1


def test_dashboard_configmap_is_the_dashboard(chart: helm.Chart) -> None:
    objects = render(chart, {})
    (dashboard,) = [o for o in objects if o["kind"] == "ConfigMap" and "ttsvc.json" in o["data"]]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"  # Grafana's sidecar label
    source = (CHART / "dashboards" / "ttsvc.json").read_text()
    assert dashboard["data"]["ttsvc.json"] == source.rstrip("\n")
    assert json.loads(dashboard["data"]["ttsvc.json"]) == json.loads(source)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"settings": {"port": 8080}}, "/settings"),  # the chart owns the ports
        ({"settings": {"api_keys_file": "/keys"}}, "/settings"),  # and the key file (apiKeys)
        ({"settings": {"default_rpm": 0}}, "/settings/default_rpm"),
        ({"settings": {"default_audio_s_per_min": -1}}, "/settings/default_audio_s_per_min"),
        ({"settings": {"cors_origins": "https://app.example.com"}}, "/settings/cors_origins"),
        ({"settings": {"cors_origins": ["https://app.example.com/"]}}, "/settings/cors_origins/0"),
        ({"settings": {"voice_aliases": {"narrator": ""}}}, "/settings/voice_aliases"),
        ({"apiKeys": {"existingSecret": "Tenant_Keys"}}, "/apiKeys/existingSecret"),
        ({"apiKeys": {"key": "../keys"}}, "/apiKeys/key"),
        ({"apiKeys": {"key": "..data"}}, "/apiKeys/key"),  # the kubelet's own name in the mount
        ({"apiKeys": {"secret": "ttsvc-keys"}}, "/apiKeys"),  # a typo of existingSecret
        ({"settings": {"workers": "many"}}, "/settings/workers"),
        ({"settings": {"max_streams_per_worker": 0}}, "/settings/max_streams_per_worker"),
        ({"probes": {"readiness": {"periodSeconds": 0}}}, "/probes/readiness/periodSeconds"),
        ({"engines": {"hostPath": {"type": "File"}}}, "/engines/hostPath/type"),
        ({"engines": {"mountPath": "/tmp/engines"}}, "/engines/mountPath"),
        ({"engines": {"storage": "nfs"}}, "/engines/storage"),
        ({"engines": {"hostPath": {"enabled": True}}}, "/engines/hostPath"),  # the old switch
        ({"engines": {"pvc": {"accessModes": ["ReadWriteSometimes"]}}},
         "/engines/pvc/accessModes/0"),
        ({"gpu": {"enabled": True}}, "/engines/storage"),  # the gpu image ships no engines
        ({"networkPolicy": {"metrics": {"podSelector": "prometheus"}}},
         "/networkPolicy/metrics/podSelector"),
        ({"topologySpreadConstraints": [{"topologyKey": "zone"}]},
         "/topologySpreadConstraints/0"),
        ({"autoscaling": {"type": "memory"}}, "/autoscaling/type"),
        ({"autoscaling": {"metric": {"name": "up"}}}, "/autoscaling/metric/name"),
        ({"ports": {"http": 70000}}, "/ports/http"),
        ({"ports": {"wyoming": -1}}, "/ports/wyoming"),
        ({"lifecycle": {"preStopSleepSeconds": 0}}, "/lifecycle/preStopSleepSeconds"),
        ({"securityContext": {"runAsUser": 0}}, "/securityContext/runAsUser"),
        ({"replicas": 3}, "replicas"),  # a typo of replicaCount
    ],
)
def test_schema_rejects_bad_values(chart: helm.Chart, values: dict[str, Any], field: str) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert field in str(refused.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"ports": {"http": 9000, "metrics": 9000}}, "ports.metrics must differ"),
        ({"ports": {"wyoming": 9000}}, "ports.wyoming must differ"),
        ({"autoscaling": {"minReplicas": 5, "maxReplicas": 4}}, "minReplicas must not exceed"),
        ({"engines": {"mountPath": "/opt/ttsvc/engines"}}, "engines.mountPath must lie apart"),
        ({"engines": {"mountPath": "/opt/ttsvc"}}, "engines.mountPath must lie apart"),
    ],
)
def test_template_refuses_what_the_schema_cannot(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError) as refused:
        chart.render(values, name=RELEASE)
    assert message in str(refused.value)


def test_voices_pull_job_writes_into_the_deployments_engines_volume(chart: helm.Chart) -> None:
    """``voices.pull`` on a shared claim: a hook Job runs ``ttsvc voices pull`` on the
    Deployment's own engines volume (writable there only), with the mirror's URL; its pod is
    not the Service's."""
    objects = render(chart, VALUES_SETS["voices"])
    job = one(objects, "Job")
    assert job["metadata"]["name"] == f"{FULLNAME}-voices"
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    mount_path = settings_configmap(objects)["TTSVC_ENGINES_DIR"]
    assert c["args"] == ["voices", "pull", "en_GB-alba-medium", "de_DE-thorsten-high",
                         "--engines-dir", mount_path]  # fmt: skip
    assert c["image"] == container(objects)["image"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "engines"]
    assert mount["mountPath"] == mount_path
    assert not mount.get("readOnly")
    deployment = one(objects, "Deployment")["spec"]["template"]["spec"]
    (served,) = [v for v in deployment["volumes"] if v["name"] == "engines"]
    (pulled,) = [v for v in pod["volumes"] if v["name"] == "engines"]
    assert pulled == served == {"name": "engines", "persistentVolumeClaim": {
        "claimName": one(objects, "PersistentVolumeClaim")["metadata"]["name"]}}  # fmt: skip
    # the claim is writable by the service's user: fsGroup, in both pods
    assert pod["securityContext"]["fsGroup"] == deployment["securityContext"]["fsGroup"] == (
        deployment["securityContext"]["runAsGroup"])  # fmt: skip
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["TTSVC_VOICES_URL"] == VALUES_SETS["voices"]["voices"]["baseUrl"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["restartPolicy"] == "Never"
    selector = one(objects, "Service")["spec"]["selector"]
    assert not selector.items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert "TTSVC_VOICES_URL" not in {
        e["name"] for e in one(render(chart, {"voices": {"pull": ["x"]},
                                              "engines": {"storage": "pvc"}}), "Job")["spec"][
            "template"]["spec"]["containers"][0]["env"]
    }  # fmt: skip


def test_shared_claim_is_read_write_many_and_polled(
    chart: helm.Chart, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One claim for every replica (pods on several nodes: ReadWriteMany), its class chosen or
    the cluster's default; the service polls it (NFS-like filesystems send no events of other
    nodes' writes), unless told otherwise; an existing claim is used as it is."""
    objects = render(chart, VALUES_SETS["voices"])
    claim = one(objects, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["storageClassName"] == "nfs-client"
    assert settings_from(settings_configmap(objects), monkeypatch).watch_polling is True
    default_class = one(render(chart, {"engines": {"storage": "pvc"}}), "PersistentVolumeClaim")
    assert "storageClassName" not in default_class["spec"]
    no_class = one(render(chart, {"engines": {"storage": "pvc", "pvc": {
        "storageClassName": "-"}}}), "PersistentVolumeClaim")  # fmt: skip
    assert no_class["spec"]["storageClassName"] == ""
    told = render(chart, {"engines": {"storage": "pvc"}, "settings": {"watch_polling": False}})
    assert settings_from(settings_configmap(told), monkeypatch).watch_polling is False
    existing = render(chart, {"engines": {"storage": "pvc", "pvc": {"existingClaim": "voices"}}})
    assert not [o for o in existing if o["kind"] == "PersistentVolumeClaim"]
    pod = one(existing, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "engines"]
    assert volume["persistentVolumeClaim"] == {"claimName": "voices"}
    for values in ({}, VALUES_SETS["hostpath"]):  # inotify sees writes on a local filesystem
        assert not settings_from(settings_configmap(render(chart, values)),
                                 monkeypatch).watch_polling  # fmt: skip


def test_per_pod_voices_are_a_sidecar_following_a_configmap(chart: helm.Chart) -> None:
    """Per-pod volumes: no Job (it would fill one pod's volume at most); each pod's native
    sidecar follows the voices ConfigMap, mounted as a directory (its updates reach it), which
    the pod template does not hold: changing voices.pull rolls no pod."""
    objects = render(chart, VALUES_SETS["voices-per-pod"])
    assert not [o for o in objects if o["kind"] == "Job"]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    (sidecar,) = [c for c in pod["initContainers"] if c["name"] == "voices"]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar
    engines_dir = settings_configmap(objects)["TTSVC_ENGINES_DIR"]
    mounts = {m["name"]: m for m in sidecar["volumeMounts"]}
    assert mounts["engines"]["mountPath"] == engines_dir and not mounts["engines"].get("readOnly")
    assert "subPath" not in mounts["voices"] and mounts["voices"]["readOnly"] is True
    args = sidecar["args"]
    assert args[:2] == ["voices", "sync"]
    names_file = Path(args[2])
    assert names_file.parent.as_posix() == mounts["voices"]["mountPath"]
    assert args[args.index("--engines-dir") + 1] == engines_dir
    (volume,) = [v for v in pod["volumes"] if v["name"] == "voices"]
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap"
                    and o["metadata"]["name"] == volume["configMap"]["name"]]  # fmt: skip
    assert configmap["data"][names_file.name].split() == ["en_GB-alba-medium"]
    more = {"voices": {"pull": ["en_GB-alba-medium", "de_DE-thorsten-high"]}}
    assert one(render(chart, more), "Deployment") == one(objects, "Deployment")
    assert sidecar["image"] == container(objects)["image"]


@pytest.mark.parametrize("voice", ["en_US-joe-medium", "en_GB-alba-medium", "it's"])
def test_per_pod_service_starts_once_its_voice_is_published(
    chart: helm.Chart, tmp_path: Path, voice: str
) -> None:
    """``serve`` exits at once while settings.voice has no version: a voice only the sidecar
    pulls would crash-loop the pod. The sidecar's startupProbe (which holds the service's
    container) is run here as the kubelet runs it, against a volume laid out as the pod's:
    it fails until a numbered version holds its manifest, a staging directory or a version
    without its manifest not counting, and a voice with a quote in it is one argument."""
    objects = render(chart, VALUES_SETS["voices-per-pod"] | {"settings": {"voice": voice}})
    engines_dir = settings_configmap(objects)["TTSVC_ENGINES_DIR"]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    (sidecar,) = [c for c in pod["initContainers"] if c["name"] == "voices"]
    assert {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}["engines"] == engines_dir
    probe = sidecar["startupProbe"]
    assert set(probe) == {"exec", "periodSeconds", "timeoutSeconds", "failureThreshold"}
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 600  # a pull has its time
    volume = tmp_path / "engines"  # the mount, here
    command = [a.replace(engines_dir, str(volume)) for a in probe["exec"]["command"]]
    assert command != probe["exec"]["command"]  # it names the volume

    def passes() -> bool:
        run = subprocess.run(command, capture_output=True, timeout=30, check=False)
        return run.returncode == 0

    assert not passes()  # an empty volume
    (volume / voice / ".staging-x").mkdir(parents=True)
    (volume / voice / ".staging-x" / "manifest.json").write_text("{}")
    (volume / voice / "1").mkdir()  # a version still being written: no manifest yet
    assert not passes()
    (volume / voice / "1" / "manifest.json").write_text("{}")
    assert passes()


def test_no_voices_job_without_voices_pull(chart: helm.Chart) -> None:
    for storage in ("perPod", "pvc", "hostPath"):
        objects = render(chart, {"engines": {"storage": storage}})
        assert not [o for o in objects if o["kind"] == "Job"]
    with pytest.raises(helm.HelmValuesError) as bad:
        chart.render({"voices": {"pull": ["--force"]}}, name=RELEASE)
    assert "/voices/pull/0" in str(bad.value)


@pytest.mark.parametrize(
    "name",
    ["en_GB-alba-medium", "v1.2", "x" * NAME_MAX, "x" * (NAME_MAX + 1), "../../../rel/pwned-voice",
     "a/b", ".hidden", "a..b", "-flag", "a b"],
)  # fmt: skip
def test_voices_pull_takes_what_ttsvc_takes_as_a_voice_name(chart: helm.Chart, name: str) -> None:
    """The schema's pattern is ``ttsvc.voice.NAME_RE`` in JSON Schema's terms (Go's regexp has
    no lookahead: the '..' is a ``not``): an install fails on a name the Job would refuse."""
    values = {"voices": {"pull": [name]}, "engines": {"storage": "pvc"}}
    if name_problem(name) is None:
        (job,) = one(render(chart, values), "Job")["spec"]["template"]["spec"]["containers"]
        assert job["args"][2] == name
        return
    with pytest.raises(helm.HelmValuesError) as bad:
        chart.render(values, name=RELEASE)
    assert "/voices/pull/0" in str(bad.value)
