"""The Kubernetes manifests are valid objects of the API they target.

No cluster runs here, so each document of deploy/k8s is checked against the Kubernetes
OpenAPI schemas that ``kubernetes-validate`` ships, strictly (a misspelt or misplaced
field fails, as ``kubectl apply --validate=strict`` would). The Kustomization is
kustomize's, not the API's (test_deploy_commands.py checks that it lists every file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
# An older release still run on managed clusters, and the newest the package knows.
VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_a_valid_kubernetes_object(path: Path, version: str) -> None:
    documents = _documents(path)
    assert documents, f"{path.name} holds no object"
    for doc in documents:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            name = doc.get("metadata", {}).get("name")
            pytest.fail(f"{path.name}: {doc.get('kind')} {name!r} on {version}: {exc.message}")


def test_a_broken_manifest_is_caught() -> None:
    """The check can fail: a field the API does not have is refused."""
    (deployment,) = _documents(K8S / "router.yaml")[:1]
    deployment["spec"]["replicaz"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)


def test_the_generated_secrets_are_valid_kubernetes_objects(tmp_path: Path) -> None:
    """What `hecate nats-config --secrets` writes for `kubectl apply -f` is valid too."""
    from hecate.wire import permissions
    from hecate_launcher import natsconfig

    out = natsconfig.write_deployment(
        tmp_path / "d",
        permissions.DEFAULT_TENANTS,
        permissions.DEFAULT_NODES,
        hosts=natsconfig.deployment_hosts(),
    )
    documents = _documents(out / "k8s" / "secrets.yaml")
    names = {d["metadata"]["name"] for d in documents}
    assert {"nats-server", "nats-server-passwords", "hecate-nats-ca"} <= names
    assert {
        natsconfig.secret_name(permissions.node_user(n)) for n in permissions.DEFAULT_NODES
    } <= names
    for doc in documents:
        kubernetes_validate.validate(doc, VERSIONS[0], strict=True)


def _secrets_named(node: Any) -> set[str]:
    """Every Secret a manifest refers to: envFrom secretRef, env secretKeyRef, volumes."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("secretRef", "secretKeyRef") and isinstance(value, dict):
                found.add(value["name"])
            elif key == "secret" and isinstance(value, dict):
                found.add(value.get("secretName") or value["name"])
            found |= _secrets_named(value)
    elif isinstance(node, list):
        for value in node:
            found |= _secrets_named(value)
    return found


def test_every_secret_the_manifests_use_is_generated(tmp_path: Path) -> None:
    """The Job that makes the KV buckets and every pod find the Secrets they name among
    those `hecate nats-config --secrets --topology examples/swarm.json` writes."""
    from hecate.wire import permissions
    from hecate_launcher import natsconfig

    out = natsconfig.write_deployment(
        tmp_path / "d",
        permissions.DEFAULT_TENANTS,
        permissions.DEFAULT_NODES,
        hosts=natsconfig.deployment_hosts(),
    )
    generated = {d["metadata"]["name"] for d in _documents(out / "k8s" / "secrets.yaml")}
    used = {name for path in MANIFESTS for doc in _documents(path) for name in _secrets_named(doc)}
    # The API keys' hashes are the operator's own (`hecate keys add`, see gateway.yaml).
    used.discard("hecate-gateway-keys")
    assert used <= generated, f"not generated: {sorted(used - generated)}"
    (job,) = _documents(K8S / "kv-buckets-job.yaml")
    assert {natsconfig.secret_name(u) for u in ("planner", "telemetry", "breaker")} <= (
        _secrets_named(job)
    )
