"""deploy/networkpolicy.yaml: each policy selects its workload's pods and opens exactly the port the
server listens on, to the documented peers; egress stays open (the API server's address varies)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.manifests import (
    DAEMONSET,
    EXTENDER,
    NETWORK_POLICY,
    Doc,
    container_env,
    documents,
    expand,
    find,
    only_container,
    port_number,
)

PROMETHEUS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
CONTROL_PLANE = {"ipBlock": {"cidr": "192.0.2.0/24"}}  # a placeholder the user replaces (documented)
SECOND_SCHEDULER = {
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "volcano-gpu-scheduler"}},
}


def listen_port(workload: Doc) -> int:
    """The port the container's server binds, from its args or env (`--address`, `METRICS_ADDRESS`)."""
    container = only_container(workload)
    env = container_env(container, {"spec.nodeName": "n1"})
    args = [expand(arg, env) for arg in container.get("args", [])]
    address = args[args.index("--address") + 1] if "--address" in args else env["METRICS_ADDRESS"]
    return int(address.rpartition(":")[2])


@pytest.mark.parametrize(
    ("manifest", "kind", "name", "peers"),
    [
        (DAEMONSET, "DaemonSet", "volcano-gpu-deviceplugin", [PROMETHEUS]),
        (EXTENDER, "Deployment", "volcano-gpu-extender", [CONTROL_PLANE, SECOND_SCHEDULER, PROMETHEUS]),
    ],
    ids=["daemon metrics", "extender"],
)
def test_policy_opens_the_servers_port_to_its_peers_only(
    manifest: Path, kind: str, name: str, peers: list[Doc]
) -> None:
    workload = find(documents(manifest), kind, name)
    policy = find(documents(NETWORK_POLICY), "NetworkPolicy", name)
    assert policy["metadata"]["namespace"] == workload["metadata"]["namespace"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= workload["spec"]["template"]["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (port,) = rule["ports"]
    assert port["protocol"] == "TCP"
    assert port_number(only_container(workload), port["port"]) == listen_port(workload)
    assert rule["from"] == peers
