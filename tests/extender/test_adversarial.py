"""Adversarial requests to the running extender found after issue 13 was built, over real sockets:
a malformed body is a 400 that names what is wrong, a hostile client does not hold others up, and
the extender goes on serving."""

from __future__ import annotations

import json

import pytest

from deviceplugin.extender.config import DEFAULT_MAX_BODY_BYTES
from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import StartExtender, create_pod, eventually, memory_pod, share_node
from tests.rawhttp import send

DEEP = 100_000  # JSON nesting: Python's decoder recurses once per level


def with_nodes(*items: object) -> bytes:
    return json.dumps({"Pod": memory_pod("p", 100), "Nodes": {"items": list(items)}}).encode()


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"[" * DEEP + b"]" * DEEP, "nested"),
        (b'{"Pod": ' + b'{"a": ' * DEEP + b"1" + b"}" * DEEP + b', "NodeNames": []}', "nested"),
        (with_nodes({"metadata": []}), "items[0]"),
        (with_nodes({"metadata": {"name": "n1"}}, {"metadata": {"name": 5}}), "items[1]"),
    ],
    ids=["deeply nested array", "deeply nested pod", "node metadata a list", "node name a number"],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_a_hostile_body_is_a_400_naming_the_problem(
    start_extender: StartExtender, verb: str, body: bytes, named: str
) -> None:
    """Before: 500 'internal error: RecursionError(...)' for deep nesting, and 500
    'AttributeError: list object has no attribute get' for a node whose metadata is a list."""
    ext = start_extender(strategy="share")
    reply = ext.client.request("POST", f"/{verb}", body)
    assert reply.status == 400, reply.body
    assert named in reply.body["Error"] and "internal error" not in reply.body["Error"], reply.body
    assert ext.client.request("GET", "/readyz").status == 200


def test_bodies_announced_but_never_sent_hold_no_room_for_others(start_extender: StartExtender) -> None:
    """Two connections each announcing a body of the largest size and sending none of it held the
    whole body budget (two such bodies) for as long as the request time allows: every other POST
    waited for room, then got 503. Two silent connections, reopened every request time, denied
    scheduling to the cluster. Here the request time is long, so a waiting filter would time out."""
    ext = start_extender(strategy="share", request_timeout=600)
    host, port = ext.client.host, ext.client.port
    head = f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {DEFAULT_MAX_BODY_BYTES}\r\n\r\n"
    with send((host, port), head.encode()), send((host, port), head.encode() + b"{"):
        result = ext.client.filter(memory_pod("p", 100), ["n1"])
    assert result["FailedAndUnresolvableNodes"] == {"n1": "node n1 is not in the extender's node cache"}


def test_a_bind_whose_answer_is_unreadable_fails_clearly_and_books_nothing(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """A proxy in the way answers the Binding with a page that is not JSON: the bind was a 500
    'internal error: JSONDecodeError', and the memory it had booked stayed booked while the pod
    stayed pending, so its retry found its own phantom in the way ('only 200 MiB free')."""
    apiserver.create("nodes", share_node("n1", gpus=1, memory=1000))
    ext = start_extender(strategy="share")
    eventually(lambda: ext.sees_node("n1"))
    pod = create_pod(apiserver, memory_pod("p", 800))
    garbled = apiserver.faults.garble(method="POST", path="/binding")
    meta = pod["metadata"]
    args = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": "n1"}
    reply = ext.client.post("/bind", args)
    assert garbled.hits == 1
    assert reply.status == 200 and "binding pod default/p to node n1 failed" in reply.body["Error"], (
        reply.body
    )
    apiserver.faults.clear(garbled)
    assert ext.client.bind(pod, "n1") == ""
