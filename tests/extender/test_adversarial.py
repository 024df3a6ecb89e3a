"""Adversarial requests to the running extender found after issue 13 was built, over real sockets:
a malformed body is a 400 that names what is wrong, a hostile client does not hold others up, and
the extender goes on serving."""

from __future__ import annotations

import json

import pytest

from deviceplugin.extender.config import DEFAULT_MAX_BODY_BYTES
from tests.extender.conftest import StartExtender, memory_pod
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
