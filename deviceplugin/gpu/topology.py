"""Named GPU topologies and topology files, for fake GPUs (`--fake-gpu-topology`, docs/topology.md).

A node of fake GPUs takes its interconnect from one of the presets, each the shape of a common
server as `nvidia-smi topo -m` shows it, or from a JSON file:

    {"numa": [0, 0, 1, 1], "links": {"0-1": "NV4", "2-3": "NV4"}, "default": "SYS"}

`numa` lists each GPU's NUMA node (-1: unknown) by GPU index, and so says how many GPUs the file
describes; `links` gives the link of a pair of GPU indices `"a-b"` (`NV<n>`, `PIX`, `PXB`, `PHB`,
`NODE`, `SYS`); `default` (optional) is the link of every pair `links` does not name, and without
it every pair must be named. A topology describes GPUs 0..n-1, the node's GPUs by index; it must
describe as many GPUs as the node has.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from deviceplugin.fit import jsontext
from deviceplugin.fit.topology import UNKNOWN_NUMA, Link, Topology, parse_link

_FILE_KEYS = frozenset({"numa", "links", "default"})


def _uniform(count: int, numa: Callable[[int], int], link: Callable[[int, int], str]) -> Topology:
    return Topology.build(
        range(count), [numa(gpu) for gpu in range(count)], lambda a, b: parse_link(link(a, b))
    )


def _dgx_a100() -> Topology:
    """DGX A100: six NVSwitches, two NVLinks from every GPU to each, so every pair reads NV12; GPUs
    0-3 on the first socket, 4-7 on the second (NUMA by socket, the BIOS's NPS1 setting)."""
    return _uniform(8, lambda gpu: gpu // 4, lambda _a, _b: "NV12")


def _pcie_2socket() -> Topology:
    """An 8-GPU PCIe server with two sockets: two GPUs behind each PCIe switch (PIX), the two
    switches of a socket on separate root ports of its CPU (NODE), the sockets joined by the CPUs'
    interconnect (SYS); GPUs 0-3 on NUMA node 0, 4-7 on 1."""

    def link(a: int, b: int) -> str:
        if a // 2 == b // 2:
            return "PIX"
        return "NODE" if a // 4 == b // 4 else "SYS"

    return _uniform(8, lambda gpu: gpu // 4, link)


def _nvlink_pairs() -> Topology:
    """Four PCIe GPUs on a 2-socket server, bridged in pairs: 0-1 and 2-3 by an NVLink bridge
    (NV4, as RTX A6000 pairs read; A100 PCIe cards with three bridges read NV12), GPUs 0-1 on
    socket 0 and 2-3 on socket 1, so every other pair crosses the sockets (SYS)."""
    return _uniform(4, lambda gpu: gpu // 2, lambda a, b: "NV4" if a // 2 == b // 2 else "SYS")


PRESETS: Mapping[str, Callable[[], Topology]] = {
    "dgx-a100": _dgx_a100,
    "pcie-2socket": _pcie_2socket,
    "nvlink-pairs": _nvlink_pairs,
}


@dataclass(frozen=True, slots=True)
class NamedTopology:
    """A topology and where it came from (a preset's name or a file's path), for messages."""

    source: str
    topology: Topology

    def __str__(self) -> str:
        return self.source

    def for_gpus(self, count: int) -> Topology:
        """The topology of a node of `count` GPUs; ValueError when it describes another number."""
        described = len(self.topology.gpus)
        if described != count:
            raise ValueError(f"describes {described} GPUs, the node has {count}")
        return self.topology


def read_topology(value: str) -> NamedTopology:
    """A preset's name, or the path of a topology file; ValueError naming the presets, or the file
    and the field at fault."""
    preset = PRESETS.get(value)
    if preset is not None:
        return NamedTopology(value, preset())
    path = Path(value)
    try:
        content = path.read_bytes()
    except OSError as err:
        presets = ", ".join(PRESETS)
        raise ValueError(
            f"{value!r} is neither a preset ({presets}) nor a readable topology file: {err.strerror}"
        ) from None
    try:
        return NamedTopology(value, parse_topology_file(content))
    except ValueError as err:
        raise ValueError(f"topology file {path}: {err}") from None


def parse_topology_file(content: str | bytes) -> Topology:
    """A topology file's content (the module's docstring); ValueError naming the field at fault."""
    try:
        document = jsontext.loads(content)
    except ValueError as err:
        raise ValueError(f"invalid JSON: {err}") from None
    if not isinstance(document, dict):
        raise ValueError('must hold a JSON object: {"numa": [...], "links": {"0-1": "NV4", ...}}')
    unknown = sorted(set(document) - _FILE_KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)} (known: numa, links, default)")
    numa = _numa(document.get("numa"))
    count = len(numa)
    links = _links(document.get("links"), count)
    default = document.get("default")
    fallback = None if default is None else _link(default, "default")
    missing = [pair for pair in itertools.combinations(range(count), 2) if pair not in links]
    if missing and fallback is None:
        named = ", ".join(f"{a}-{b}" for a, b in missing[:4]) + (" ..." if len(missing) > 4 else "")
        raise ValueError(f"links: {len(missing)} pair(s) not given ({named}) and no default link")

    def link(a: int, b: int) -> Link:
        found = links.get((a, b), fallback)
        assert found is not None  # every pair is named or has the default (checked above)
        return found

    return Topology.build(range(count), numa, link)


def _numa(value: object) -> list[int]:
    if not isinstance(value, list) or not value:
        raise ValueError("numa: must be a non-empty list of NUMA nodes, one per GPU")
    for gpu, node in enumerate(value):
        if type(node) is not int or node < UNKNOWN_NUMA:
            raise ValueError(f"numa[{gpu}]: {node!r} must be a NUMA node number, or -1 when unknown")
    return value


def _links(value: object, count: int) -> dict[tuple[int, int], Link]:
    if not isinstance(value, dict):
        raise ValueError('links: must be an object of GPU pairs, like {"0-1": "NV4"}')
    links: dict[tuple[int, int], Link] = {}
    for pair, kind in value.items():
        where = f"links[{pair!r}]"
        first, sep, second = pair.partition("-")
        if not (sep and first.isascii() and first.isdigit() and second.isascii() and second.isdigit()):
            raise ValueError(f"{where}: a pair is two GPU indices joined by '-', like \"0-1\"")
        a, b = sorted((int(first), int(second)))
        if a == b:
            raise ValueError(f"{where}: a GPU has no link to itself")
        if b >= count:
            raise ValueError(f"{where}: GPU {b} is not one of the {count} GPUs numa lists (0-{count - 1})")
        if (a, b) in links:
            raise ValueError(f"{where}: the pair {a}-{b} is given twice")
        links[(a, b)] = _link(kind, where)
    return links


def _link(value: object, where: str) -> Link:
    if not isinstance(value, str):
        raise ValueError(f"{where}: {value!r} must be a link class such as NV4, PIX or SYS")
    try:
        return parse_link(value)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def restrict(topology: Topology, gpus: Sequence[int]) -> Topology:
    """The part of `topology` among `gpus` (indices it describes): what a node that serves only
    those GPUs (the others excluded, or failed to enumerate) publishes."""
    return Topology.build(gpus, [topology.numa_of(gpu) for gpu in gpus], topology.link)
