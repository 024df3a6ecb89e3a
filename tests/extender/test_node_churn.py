"""Node names come and go (autoscaling): the extender's inventory keeps a view for a node while
the node exists or a pod is booked on it, and drops it after, so it does not grow with every name
a cluster ever had; a node seen again under an old name is fitted on what it publishes now."""

from __future__ import annotations

from deviceplugin.extender.inventory import Inventory
from tests.extender.conftest import Obj, memory_pod, share_node, vgpu_node


def bound(name: str, node: str, memory: int = 4000, gpu: int = 0) -> Obj:
    pod = memory_pod(name, memory, node=node, annotations={"volcano.sh/gpu-index": str(gpu)})
    pod["metadata"]["uid"] = f"uid-{name}"
    return pod


def booked_memory(inventory: Inventory, node: str) -> int:
    view = inventory.view(node)
    assert view is not None
    return sum(gpu.used_memory for gpu in view.gpus)


def test_a_deleted_node_with_nothing_booked_leaves_no_view() -> None:
    inventory = Inventory("share")
    for n in range(50):
        inventory.on_node("ADDED", share_node(f"n{n}"))
    for n in range(50):
        inventory.on_node("DELETED", share_node(f"n{n}"))
    assert dict(inventory.views) == {}
    assert inventory.node_names() == []


def test_a_deleted_nodes_view_stays_until_its_last_pod_goes() -> None:
    inventory = Inventory("share")
    inventory.on_node("ADDED", share_node("n1"))
    first, second = bound("a", "n1"), bound("b", "n1", gpu=1)
    inventory.on_pod("ADDED", first)
    inventory.on_pod("ADDED", second)
    inventory.on_node("DELETED", share_node("n1"))
    view = inventory.view("n1")
    assert view is not None and set(view.pods) == {"uid-a", "uid-b"}  # still booked there
    assert inventory.node_of("uid-a") == "n1"
    inventory.on_pod("DELETED", first)
    assert inventory.view("n1") is view
    inventory.on_pod("DELETED", second)
    assert inventory.view("n1") is None
    assert inventory.node_of("uid-b") == ""


def test_a_pod_bound_to_a_node_not_seen_yet_is_kept_and_dropped_with_it() -> None:
    inventory = Inventory("share")
    pod = bound("early", "n1", memory=6000)
    inventory.on_pod("ADDED", pod)  # the pod's event came before its node's
    assert inventory.view("n1") is not None and inventory.node_names() == []
    inventory.on_node("ADDED", share_node("n1"))
    assert booked_memory(inventory, "n1") == 6000  # booked once the node's GPUs are known
    inventory.on_pod("DELETED", pod)
    assert inventory.view("n1") is not None  # the node is there: its view stays
    never_seen = bound("stray", "gone")
    inventory.on_pod("ADDED", never_seen)
    inventory.on_pod("DELETED", never_seen)
    assert set(inventory.views) == {"n1"}


def test_a_pod_moving_off_a_deleted_node_drops_that_nodes_view() -> None:
    inventory = Inventory("share")
    inventory.on_node("ADDED", share_node("n1"))
    inventory.on_node("ADDED", share_node("n2"))
    inventory.on_pod("ADDED", bound("p", "n1"))
    inventory.on_node("DELETED", share_node("n1"))
    inventory.on_pod("MODIFIED", bound("p", "n2"))  # a new incarnation of the UID's booking
    assert inventory.view("n1") is None
    assert booked_memory(inventory, "n2") == 4000


def test_a_node_seen_again_is_fitted_on_what_it_publishes_now() -> None:
    """The caches of fit results (quick fits, gpu-aware scores, filter's per-pod results) trust a
    view's generation: a name seen again must not reuse any generation its earlier view had."""
    inventory = Inventory("vgpu")
    inventory.on_node("ADDED", vgpu_node("n1", memory=16000))
    earlier = inventory.view("n1")
    assert earlier is not None
    generations = {earlier.generation}
    for n in range(3):
        pod = bound(f"p{n}", "n1")
        inventory.on_pod("ADDED", pod)
        generations.add(earlier.generation)
        inventory.on_pod("DELETED", pod)
        generations.add(earlier.generation)
    inventory.on_node("DELETED", vgpu_node("n1"))
    assert earlier.retired
    inventory.on_node("ADDED", vgpu_node("n1", memory=8000))
    again = inventory.view("n1")
    assert again is not None and again is not earlier
    assert again.generation not in generations
    assert again.quick is None and again.aware is None
    assert [gpu.memory for gpu in again.gpus] == [8000, 8000]


def test_a_bind_undone_on_a_deleted_node_drops_its_view() -> None:
    inventory = Inventory("share")
    inventory.on_node("ADDED", share_node("n1"))
    view = inventory.view("n1")
    assert view is not None
    with view.lock:
        inventory.assume(view, bound("p", "n1"))
    inventory.on_node("DELETED", share_node("n1"))
    assert inventory.view("n1") is view  # the assumed pod is still booked there
    with view.lock:
        inventory.forget(view, "uid-p")  # the bind failed
    assert inventory.view("n1") is None and inventory.node_of("uid-p") == ""
