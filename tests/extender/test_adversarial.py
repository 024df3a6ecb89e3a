"""Adversarial requests to the running extender found after issue 13 was built, over real sockets:
each is a 400 that names what is wrong, and the extender goes on serving."""

from __future__ import annotations

import json

import pytest

from tests.extender.conftest import StartExtender, memory_pod

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
