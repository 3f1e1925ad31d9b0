"""The Kubernetes manifests (deploy/kubernetes/): every resource validates against a
current Kubernetes schema (``kubernetes-validate``, strict: unknown fields are errors),
as written in the base, with each overlay's patches applied, and as ``kustomize``
renders each cell when a ``kubectl`` is installed; and they say what docs/cells.md
says: two router replicas per cell behind the readiness probe, kairosd a DaemonSet
that may set clocks without taking a GPU, credentials from Secrets, configurations
that load with the real schemas.

Without ``kubectl`` (its built-in kustomize renders the overlays) the rendering
check skips, saying so; the overlays are then checked by merging their patches into
the base resources here (the patches only change maps, which a strategic merge
patch merges key by key, so the merge below is the same)."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kairos_common.config import config_reference, load_config
from kairos_common.wire import LIVENESS_PATH, READY_PATH
from kairosd.config import ENV_PREFIX as KAIROSD_ENV
from kairosd.config import KairosdConfig
from router.config import ENV_PREFIX as ROUTER_ENV
from router.config import RouterConfig
from scripts import gen_config_reference
from tests.deploy.units import ROOT

K8S = ROOT / "deploy" / "kubernetes"
BASE = K8S / "base"
OVERLAYS = sorted(p for p in (K8S / "overlays").iterdir() if p.is_dir())
VERSION = kubernetes_validate.latest_version()
KUBECTL = shutil.which("kubectl")
Resource = dict[str, Any]


def _docs(path: Path) -> list[Resource]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _kustomization(folder: Path) -> Resource:
    (doc,) = _docs(folder / "kustomization.yaml")
    return doc


def base_resources() -> list[Resource]:
    return [d for name in _kustomization(BASE)["resources"] for d in _docs(BASE / name)]


def _merge(target: Any, patch: Any, where: str) -> Any:
    if isinstance(patch, dict) and isinstance(target, dict):
        out = dict(target)
        for key, value in patch.items():
            out[key] = _merge(target.get(key), value, f"{where}.{key}") if key in target else value
        return out
    assert not isinstance(patch, list), f"{where}: list patches need kustomize's merge keys"
    return patch


def patched(overlay: Path) -> list[Resource]:
    """The base resources with ``overlay``'s patches merged in (names unprefixed)."""
    resources = copy.deepcopy(base_resources())
    for entry in _kustomization(overlay).get("patches", []):
        for patch in _docs(overlay / entry["path"]):
            key = (patch["kind"], patch["metadata"]["name"])
            index = next(
                k for k, r in enumerate(resources) if (r["kind"], r["metadata"]["name"]) == key
            )
            resources[index] = _merge(resources[index], patch, f"{overlay.name}/{entry['path']}")
    return resources


def rendered(overlay: Path) -> list[Resource]:
    if KUBECTL is None:
        pytest.skip("no kubectl (its kustomize renders the overlays); patches checked merged")
    done = subprocess.run(
        [KUBECTL, "kustomize", str(overlay)], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _validate(resource: Resource) -> None:
    try:
        kubernetes_validate.validate(resource, VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        name = f"{resource.get('kind')}/{resource.get('metadata', {}).get('name')}"
        pytest.fail(f"{name} is not a valid {VERSION} resource: {exc.message} at {exc.path}")


def _id(r: Resource) -> str:
    return f"{r['kind']}/{r['metadata']['name']}"


@pytest.mark.parametrize("resource", base_resources(), ids=_id)
def test_every_base_resource_validates(resource: Resource) -> None:
    _validate(resource)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_every_overlay_validates_with_its_patches_merged(overlay: Path) -> None:
    for resource in patched(overlay):
        _validate(resource)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_every_overlay_renders_and_validates(overlay: Path) -> None:
    resources = rendered(overlay)
    assert {r["kind"] for r in resources} >= {"Deployment", "DaemonSet", "StatefulSet", "Service"}
    for resource in resources:
        _validate(resource)
        assert resource["metadata"]["name"].startswith(f"{overlay.name}-")
        assert resource["metadata"]["labels"]["kairos.dev/cell"] == overlay.name.removeprefix(
            "cell-"
        )


def test_validation_catches_a_broken_resource() -> None:
    """Guards the checks above against passing vacuously."""
    router = copy.deepcopy(_one(base_resources(), "Deployment"))
    router["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(router, VERSION, strict=True)
    router = copy.deepcopy(_one(base_resources(), "Deployment"))
    router["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(router, VERSION, strict=True)


def _one(resources: list[Resource], kind: str, name: str | None = None) -> Resource:
    (found,) = [
        r
        for r in resources
        if r["kind"] == kind and (name is None or name in r["metadata"]["name"])
    ]
    return found


def _container(workload: Resource) -> Resource:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container


def test_the_router_is_a_pair_behind_the_readiness_probe() -> None:
    router = _one(base_resources(), "Deployment")
    assert router["spec"]["replicas"] == 2
    c = _container(router)
    assert c["readinessProbe"]["httpGet"]["path"] == READY_PATH
    assert c["livenessProbe"]["httpGet"]["path"] == LIVENESS_PATH
    service = _one(base_resources(), "Service", "router")
    assert service["spec"]["selector"] == router["spec"]["selector"]["matchLabels"]
    assert "publishNotReadyAddresses" not in service["spec"]  # the leader only


def test_kairosd_may_set_clocks_and_never_takes_a_gpu() -> None:
    daemons = _one(base_resources(), "DaemonSet")
    c = _container(daemons)
    security = c["securityContext"]
    assert security.get("privileged") or "SYS_ADMIN" in security["capabilities"]["add"]
    for pod_spec in (daemons["spec"]["template"]["spec"],):
        for container in pod_spec["containers"] + pod_spec.get("initContainers", []):
            resources = container.get("resources", {})
            for part in ("requests", "limits"):
                assert "nvidia.com/gpu" not in resources.get(part, {}), container["name"]


def test_credentials_come_from_secrets_and_none_is_committed() -> None:
    for path in K8S.rglob("*.yaml"):
        assert all(d.get("kind") != "Secret" for d in _docs(path)), f"{path}: a committed Secret"
    router = _container(_one(base_resources(), "Deployment"))
    volumes = {v["name"]: v for v in _one(base_resources(), "Deployment")["spec"]["template"][
        "spec"]["volumes"]}  # fmt: skip
    env = {e["name"]: e.get("value") for e in router["env"]}
    mount = next(m for m in router["volumeMounts"] if m["name"] == "credentials")
    assert "secret" in volumes["credentials"]
    assert env[f"{ROUTER_ENV}_CREDENTIALS_DIR"] == mount["mountPath"]
    daemons = _one(base_resources(), "DaemonSet")
    dvolumes = {v["name"]: v for v in daemons["spec"]["template"]["spec"]["volumes"]}
    assert "secret" in dvolumes["daemon-tokens"]


def _toml(resource: Resource, tmp_path: Path) -> Path:
    ((name, text),) = resource["data"].items()
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_each_cells_configuration_loads_and_names_its_cell(overlay: Path, tmp_path: Path) -> None:
    resources = patched(overlay)
    cell = overlay.name.removeprefix("cell-")
    router = load_config(
        RouterConfig, path=_toml(_one(resources, "ConfigMap", "router"), tmp_path),
        env_prefix=ROUTER_ENV, env={},
    )  # fmt: skip
    assert router.cell == cell
    assert router.store == f"redis://{overlay.name}-kairos-redis:6379/0"  # its own Redis
    daemon = load_config(
        KairosdConfig, path=_toml(_one(resources, "ConfigMap", "kairosd"), tmp_path),
        env_prefix=KAIROSD_ENV, env={},
    )  # fmt: skip
    assert daemon.router_url == (f"http://{overlay.name}-kairos-router:24157",)
    nodes = _one(resources, "DaemonSet")["spec"]["template"]["spec"]["nodeSelector"]
    assert nodes["kairos.dev/cell"] == cell


@pytest.mark.parametrize(("kind", "prefix", "schema"), [
    ("Deployment", ROUTER_ENV, RouterConfig), ("DaemonSet", KAIROSD_ENV, KairosdConfig),
])  # fmt: skip
def test_workload_environment_names_real_keys(kind: str, prefix: str, schema: type) -> None:
    env = [e["name"] for e in _container(_one(base_resources(), kind))["env"]]
    ours = [n for n in env if n.startswith(f"{prefix}_")]
    known = {gen_config_reference.env_name(prefix, key) for key, _, _ in config_reference(schema)}
    assert ours and set(ours) <= known, set(ours) - known
