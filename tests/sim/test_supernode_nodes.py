"""A simulated node's `super-node` (docs/simulate.md): its volcano.sh/super-node label, and the
values a label cannot take refused naming the node and the key."""

from __future__ import annotations

import pytest

from kubesim.nodes import NodeSpecError, parse_node_options, parse_nodes


def test_a_super_node_becomes_the_nodes_label() -> None:
    (inside, outside) = parse_nodes(
        [{"strategy": "number", "super-node": "rack-7.a"}, {"strategy": "number"}], "f"
    )
    assert inside.labels == {"volcano.sh/super-node": "rack-7.a"}
    assert outside.labels == {}
    assert parse_node_options(["strategy=number,super-node=sn-b"])[0].super_node == "sn-b"


@pytest.mark.parametrize("value", ["-edge", "has space", "x" * 64, 7])
def test_a_super_node_that_is_no_label_value_is_refused(value: object) -> None:
    with pytest.raises(NodeSpecError, match=r"f: nodes\[0\]\.super-node: .* must be a label value"):
        parse_nodes([{"strategy": "number", "super-node": value}], "f")
