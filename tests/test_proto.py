"""The kubelet API protos: committed stubs are fresh, names/numbers/types match kubelet, wire bytes.

The expected tables below are transcribed from the kubelet API field tables
(docs: shared reference ``kubelet-api-fields.md`` sections 1 and 2). Wire
compatibility with a real kubelet depends on exactly these numbers and types,
and the gRPC method paths on the package/service/method names.
"""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.message import Message

from deviceplugin.api import (
    DEVICE_PLUGIN_PATH,
    HEALTHY,
    KUBELET_MAX_MESSAGE_BYTES,
    KUBELET_SOCKET,
    POD_RESOURCES_SOCKET,
    PRE_START_CONTAINER_TIMEOUT_S,
    SUPPORTED_VERSIONS,
    UNHEALTHY,
    VERSION,
    deviceplugin_pb2,
    podresources_pb2,
)

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
GENERATED_TREES = ("deviceplugin/api/deviceplugin", "deviceplugin/api/podresources")


def _load_gen_proto() -> ModuleType:
    path = REPO_ROOT / "scripts" / "gen_proto.py"
    spec = importlib.util.spec_from_file_location("gen_proto_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree_files(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Files of the generated trees below ``root``, keyed by repo-relative posix path."""
    found: dict[str, pathlib.Path] = {}
    for tree in GENERATED_TREES:
        for path in (root / tree).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                found[path.relative_to(root).as_posix()] = path
    return found


# --------------------------------------------------------------------------- (a) freshness


def test_committed_stubs_match_regeneration(tmp_path: pathlib.Path) -> None:
    gen_proto = _load_gen_proto()
    written: list[pathlib.Path] = gen_proto.generate(tmp_path)
    regenerated = {path.relative_to(tmp_path).as_posix(): path for path in written}
    assert regenerated == _tree_files(tmp_path), "generate() must report every file it writes"

    committed = _tree_files(REPO_ROOT)
    missing = sorted(set(regenerated) - set(committed))
    assert not missing, f"generated files not committed: {missing}; run `make proto`"
    stale = sorted(set(committed) - set(regenerated))
    assert not stale, f"committed files no longer generated: {stale}; run `make proto`"
    differing = sorted(
        rel for rel, path in regenerated.items() if path.read_bytes() != committed[rel].read_bytes()
    )
    assert not differing, f"committed stubs are out of date: {differing}; run `make proto`"

    expected_layout = {
        "deviceplugin/api/deviceplugin/__init__.py",
        "deviceplugin/api/deviceplugin/v1beta1/__init__.py",
        "deviceplugin/api/deviceplugin/v1beta1/api_pb2.py",
        "deviceplugin/api/deviceplugin/v1beta1/api_pb2.pyi",
        "deviceplugin/api/deviceplugin/v1beta1/api_pb2_grpc.py",
        "deviceplugin/api/podresources/__init__.py",
        "deviceplugin/api/podresources/v1/__init__.py",
        "deviceplugin/api/podresources/v1/api_pb2.py",
        "deviceplugin/api/podresources/v1/api_pb2.pyi",
        "deviceplugin/api/podresources/v1/api_pb2_grpc.py",
    }
    assert set(regenerated) == expected_layout


def test_regeneration_is_deterministic(tmp_path: pathlib.Path) -> None:
    gen_proto = _load_gen_proto()
    first = {p.relative_to(tmp_path / "a"): p.read_bytes() for p in gen_proto.generate(tmp_path / "a")}
    second = {p.relative_to(tmp_path / "b"): p.read_bytes() for p in gen_proto.generate(tmp_path / "b")}
    assert first == second


def test_stubs_import_inside_package() -> None:
    grpc_stub = (REPO_ROOT / "deviceplugin/api/deviceplugin/v1beta1/api_pb2_grpc.py").read_text()
    assert "from deviceplugin.api.deviceplugin.v1beta1 import api_pb2 as" in grpc_stub
    grpc_stub = (REPO_ROOT / "deviceplugin/api/podresources/v1/api_pb2_grpc.py").read_text()
    assert "from deviceplugin.api.podresources.v1 import api_pb2 as" in grpc_stub


# --------------------------------------------------------------------------- (b) method names

EXPECTED_METHODS = [
    "/v1beta1.Registration/Register",
    "/v1beta1.DevicePlugin/GetDevicePluginOptions",
    "/v1beta1.DevicePlugin/ListAndWatch",
    "/v1beta1.DevicePlugin/GetPreferredAllocation",
    "/v1beta1.DevicePlugin/Allocate",
    "/v1beta1.DevicePlugin/PreStartContainer",
    "/v1.PodResourcesLister/List",
    "/v1.PodResourcesLister/GetAllocatableResources",
    "/v1.PodResourcesLister/Get",
]

# (input type, output type, server streaming) per method, short names within the package.
EXPECTED_SIGNATURES = {
    "/v1beta1.Registration/Register": ("RegisterRequest", "Empty", False),
    "/v1beta1.DevicePlugin/GetDevicePluginOptions": ("Empty", "DevicePluginOptions", False),
    "/v1beta1.DevicePlugin/ListAndWatch": ("Empty", "ListAndWatchResponse", True),
    "/v1beta1.DevicePlugin/GetPreferredAllocation": (
        "PreferredAllocationRequest",
        "PreferredAllocationResponse",
        False,
    ),
    "/v1beta1.DevicePlugin/Allocate": ("AllocateRequest", "AllocateResponse", False),
    "/v1beta1.DevicePlugin/PreStartContainer": (
        "PreStartContainerRequest",
        "PreStartContainerResponse",
        False,
    ),
    "/v1.PodResourcesLister/List": ("ListPodResourcesRequest", "ListPodResourcesResponse", False),
    "/v1.PodResourcesLister/GetAllocatableResources": (
        "AllocatableResourcesRequest",
        "AllocatableResourcesResponse",
        False,
    ),
    "/v1.PodResourcesLister/Get": ("GetPodResourcesRequest", "GetPodResourcesResponse", False),
}

FILES: tuple[FileDescriptor, ...] = (deviceplugin_pb2.DESCRIPTOR, podresources_pb2.DESCRIPTOR)


def test_full_method_names() -> None:
    names = [
        f"/{service.full_name}/{method.name}"
        for file in FILES
        for service in file.services_by_name.values()
        for method in service.methods
    ]
    assert names == EXPECTED_METHODS


def test_method_signatures() -> None:
    seen: dict[str, tuple[str, str, bool]] = {}
    for file in FILES:
        for service in file.services_by_name.values():
            for method in service.methods:
                prefix = file.package + "."
                seen[f"/{service.full_name}/{method.name}"] = (
                    method.input_type.full_name.removeprefix(prefix),
                    method.output_type.full_name.removeprefix(prefix),
                    method.server_streaming,
                )
                assert not method.client_streaming
    assert seen == EXPECTED_SIGNATURES


def test_packages() -> None:
    assert deviceplugin_pb2.DESCRIPTOR.package == "v1beta1"
    assert podresources_pb2.DESCRIPTOR.package == "v1"
    for file in FILES:
        file_proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(file_proto)
        assert file_proto.syntax == "proto3"
        assert not file_proto.dependency  # self-contained: no imports


# --------------------------------------------------------------------------- (c) field tables

Field = tuple[int, str, str]

DEVICEPLUGIN_FIELDS: dict[str, list[Field]] = {
    "DevicePluginOptions": [
        (1, "pre_start_required", "bool"),
        (2, "get_preferred_allocation_available", "bool"),
    ],
    "RegisterRequest": [
        (1, "version", "string"),
        (2, "endpoint", "string"),
        (3, "resource_name", "string"),
        (4, "options", "DevicePluginOptions"),
    ],
    "Empty": [],
    "ListAndWatchResponse": [(1, "devices", "repeated Device")],
    "TopologyInfo": [(1, "nodes", "repeated NUMANode")],
    "NUMANode": [(1, "ID", "int64")],
    "Device": [
        (1, "ID", "string"),
        (2, "health", "string"),
        (3, "topology", "TopologyInfo"),
    ],
    "PreStartContainerRequest": [(1, "devices_ids", "repeated string")],
    "PreStartContainerResponse": [],
    "PreferredAllocationRequest": [
        (1, "container_requests", "repeated ContainerPreferredAllocationRequest"),
    ],
    "ContainerPreferredAllocationRequest": [
        (1, "available_deviceIDs", "repeated string"),
        (2, "must_include_deviceIDs", "repeated string"),
        (3, "allocation_size", "int32"),
    ],
    "PreferredAllocationResponse": [
        (1, "container_responses", "repeated ContainerPreferredAllocationResponse"),
    ],
    "ContainerPreferredAllocationResponse": [(1, "deviceIDs", "repeated string")],
    "AllocateRequest": [(1, "container_requests", "repeated ContainerAllocateRequest")],
    "ContainerAllocateRequest": [(1, "devices_ids", "repeated string")],
    "CDIDevice": [(1, "name", "string")],
    "AllocateResponse": [(1, "container_responses", "repeated ContainerAllocateResponse")],
    "ContainerAllocateResponse": [
        (1, "envs", "map<string,string>"),
        (2, "mounts", "repeated Mount"),
        (3, "devices", "repeated DeviceSpec"),
        (4, "annotations", "map<string,string>"),
        (5, "cdi_devices", "repeated CDIDevice"),
    ],
    "Mount": [
        (1, "container_path", "string"),
        (2, "host_path", "string"),
        (3, "read_only", "bool"),
    ],
    "DeviceSpec": [
        (1, "container_path", "string"),
        (2, "host_path", "string"),
        (3, "permissions", "string"),
    ],
}

PODRESOURCES_FIELDS: dict[str, list[Field]] = {
    "AllocatableResourcesRequest": [],
    "AllocatableResourcesResponse": [
        (1, "devices", "repeated ContainerDevices"),
        (2, "cpu_ids", "repeated int64"),
        (3, "memory", "repeated ContainerMemory"),
    ],
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [(1, "pod_resources", "repeated PodResources")],
    "PodResources": [
        (1, "name", "string"),
        (2, "namespace", "string"),
        (3, "containers", "repeated ContainerResources"),
        (4, "cpu_ids", "repeated int64"),
        (5, "memory", "repeated ContainerMemory"),
    ],
    "ContainerResources": [
        (1, "name", "string"),
        (2, "devices", "repeated ContainerDevices"),
        (3, "cpu_ids", "repeated int64"),
        (4, "memory", "repeated ContainerMemory"),
        (5, "dynamic_resources", "repeated DynamicResource"),
    ],
    "ContainerMemory": [
        (1, "memory_type", "string"),
        (2, "size", "uint64"),
        (3, "topology", "TopologyInfo"),
    ],
    "ContainerDevices": [
        (1, "resource_name", "string"),
        (2, "device_ids", "repeated string"),
        (3, "topology", "TopologyInfo"),
    ],
    "TopologyInfo": [(1, "nodes", "repeated NUMANode")],
    "NUMANode": [(1, "ID", "int64")],
    "DynamicResource": [
        (2, "claim_name", "string"),
        (3, "claim_namespace", "string"),
        (4, "claim_resources", "repeated ClaimResource"),
    ],
    "ClaimResource": [
        (1, "cdi_devices", "repeated CDIDevice"),
        (2, "driver_name", "string"),
        (3, "pool_name", "string"),
        (4, "device_name", "string"),
        (5, "share_id", "optional string"),
    ],
    "CDIDevice": [(1, "name", "string")],
    "GetPodResourcesRequest": [
        (1, "pod_name", "string"),
        (2, "pod_namespace", "string"),
    ],
    "GetPodResourcesResponse": [(1, "pod_resources", "PodResources")],
}

_SCALAR_NAMES: dict[int, str] = {
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_SINT32: "sint32",
    FieldDescriptor.TYPE_SINT64: "sint64",
    FieldDescriptor.TYPE_FIXED32: "fixed32",
    FieldDescriptor.TYPE_FIXED64: "fixed64",
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_FLOAT: "float",
}


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _base_type(field: FieldDescriptor, package: str) -> str:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        assert field.message_type is not None
        full_name: str = field.message_type.full_name
        # Every message reference in these APIs stays inside its own package.
        assert full_name.startswith(package + "."), full_name
        return full_name.removeprefix(package + ".")
    return _SCALAR_NAMES[field.type]


def _describe(field: FieldDescriptor, package: str) -> str:
    """Render a field's type the way the reference tables write it."""
    if _is_map(field):
        entry = field.message_type
        assert entry is not None
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        assert (key.number, value.number) == (1, 2)
        return f"map<{_base_type(key, package)},{_base_type(value, package)}>"
    base = _base_type(field, package)
    if field.is_repeated:
        return f"repeated {base}"
    # proto3: only message fields and `optional` scalars track presence.
    if field.has_presence and field.type != FieldDescriptor.TYPE_MESSAGE:
        return f"optional {base}"
    return base


def _message_cases() -> list[tuple[FileDescriptor, str, list[Field]]]:
    cases: list[tuple[FileDescriptor, str, list[Field]]] = []
    for file, table in (
        (deviceplugin_pb2.DESCRIPTOR, DEVICEPLUGIN_FIELDS),
        (podresources_pb2.DESCRIPTOR, PODRESOURCES_FIELDS),
    ):
        cases.extend((file, name, fields) for name, fields in table.items())
    return cases


@pytest.mark.parametrize(
    ("file", "message", "expected"),
    _message_cases(),
    ids=[f"{f.package}.{m}" for f, m, _ in _message_cases()],
)
def test_message_fields(file: FileDescriptor, message: str, expected: list[Field]) -> None:
    descriptor: Descriptor = file.message_types_by_name[message]
    actual = [(f.number, f.name, _describe(f, file.package)) for f in descriptor.fields]
    assert sorted(actual) == sorted(expected)
    # Declaration order follows the field numbers too (keeps generated code readable).
    assert [f.number for f in descriptor.fields] == sorted(f.number for f in descriptor.fields)


@pytest.mark.parametrize(
    ("file", "table"),
    [(deviceplugin_pb2.DESCRIPTOR, DEVICEPLUGIN_FIELDS), (podresources_pb2.DESCRIPTOR, PODRESOURCES_FIELDS)],
    ids=["v1beta1", "v1"],
)
def test_no_extra_messages(file: FileDescriptor, table: dict[str, list[Field]]) -> None:
    assert set(file.message_types_by_name) == set(table)
    assert not file.enum_types_by_name


def test_map_entries_are_string_string() -> None:
    response = deviceplugin_pb2.ContainerAllocateResponse.DESCRIPTOR
    for name in ("envs", "annotations"):
        entry = response.fields_by_name[name].message_type
        assert entry is not None
        assert entry.GetOptions().map_entry
        assert [(f.number, f.name, f.type) for f in entry.fields] == [
            (1, "key", FieldDescriptor.TYPE_STRING),
            (2, "value", FieldDescriptor.TYPE_STRING),
        ]


def _message_proto(message_class: type[Message]) -> descriptor_pb2.DescriptorProto:
    descriptor = message_class.DESCRIPTOR
    file_proto = descriptor_pb2.FileDescriptorProto()
    descriptor.file.CopyToProto(file_proto)
    (message,) = [m for m in file_proto.message_type if m.name == descriptor.name]
    return message


def test_dynamic_resource_reserves_class_name() -> None:
    proto = _message_proto(podresources_pb2.DynamicResource)
    # Reserved ranges are half-open: [1, 2) is number 1 alone.
    assert [(r.start, r.end) for r in proto.reserved_range] == [(1, 2)]
    assert list(proto.reserved_name) == ["class_name"]
    assert 1 not in podresources_pb2.DynamicResource.DESCRIPTOR.fields_by_number


def test_share_id_has_explicit_presence() -> None:
    proto = _message_proto(podresources_pb2.ClaimResource)
    optional = {f.name for f in proto.field if f.proto3_optional}
    assert optional == {"share_id"}
    unset = podresources_pb2.ClaimResource(device_name="gpu-0")
    assert not unset.HasField("share_id")
    empty = podresources_pb2.ClaimResource(device_name="gpu-0", share_id="")
    assert empty.HasField("share_id")
    # Presence survives the wire even for the default value.
    decoded = podresources_pb2.ClaimResource.FromString(empty.SerializeToString())
    assert decoded.HasField("share_id") and decoded.share_id == ""
    assert not podresources_pb2.ClaimResource.FromString(unset.SerializeToString()).HasField("share_id")


def test_no_other_optional_fields() -> None:
    for file in FILES:
        file_proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(file_proto)
        optional = [
            f"{m.name}.{f.name}" for m in file_proto.message_type for f in m.field if f.proto3_optional
        ]
        assert optional == (["ClaimResource.share_id"] if file.package == "v1" else [])


# --------------------------------------------------------------------------- (d) wire bytes


def test_list_and_watch_response_wire_bytes() -> None:
    # proto3 encoding, by hand. A tag byte is (field_number << 3) | wire_type, with
    # wire type 0 = varint and 2 = length-delimited (strings and sub-messages).
    #
    #   NUMANode{ID: 1}            08 01                      field 1 varint, value 1     =  2 B
    #   TopologyInfo{nodes: [..]}  0a 02 <NUMANode>           field 1 LEN, length 2       =  4 B
    #   Device{
    #     ID: "0-0"                0a 03 '0-0'                field 1 LEN, length 3       =  5 B
    #     health: "Healthy"        12 07 'Healthy'            field 2 LEN, length 7       =  9 B
    #     topology: <TopologyInfo> 1a 04 <TopologyInfo>       field 3 LEN, length 4       =  6 B
    #   }                                                     Device body                 = 20 B
    #   ListAndWatchResponse{devices: [<Device>]}
    #                              0a 14 <Device>             field 1 LEN, length 20      = 22 B
    # fmt: off
    expected = (
        b"\x0a\x14"  # ListAndWatchResponse.devices: tag (1, LEN), length 20
        b"\x0a\x03" b"0-0"  # Device.ID: tag (1, LEN), length 3, "0-0"
        b"\x12\x07" b"Healthy"  # Device.health: tag (2, LEN), length 7, "Healthy"
        b"\x1a\x04"  # Device.topology: tag (3, LEN), length 4
        b"\x0a\x02"  # TopologyInfo.nodes: tag (1, LEN), length 2
        b"\x08\x01"  # NUMANode.ID: tag (1, VARINT), value 1
    )
    # fmt: on
    assert len(expected) == 22
    message = deviceplugin_pb2.ListAndWatchResponse(
        devices=[
            deviceplugin_pb2.Device(
                ID="0-0",
                health=HEALTHY,
                topology=deviceplugin_pb2.TopologyInfo(nodes=[deviceplugin_pb2.NUMANode(ID=1)]),
            )
        ]
    )
    assert message.SerializeToString() == expected
    assert deviceplugin_pb2.ListAndWatchResponse.FromString(expected) == message


def _entry_size(device: deviceplugin_pb2.Device) -> int:
    """Bytes one Device adds to a ListAndWatchResponse (tag + length prefix + body)."""
    return deviceplugin_pb2.ListAndWatchResponse(devices=[device]).ByteSize()


UUID = "8c1b7a1e-2f3d-4c5b-9a6e-0123456789ab"


@pytest.mark.parametrize(
    ("device_id", "entry_bytes"),
    [
        (f"GPU-{UUID}", 53),  # 40 chars: plain GPU uuid
        (f"GPU-{UUID}-3", 55),  # 42 chars: replica id
        (f"GPU-{UUID}-memory-12345", 66),  # 53 chars: one id per memory unit
        ("123-456", 20),  # 7 chars: short "i-j" id
    ],
)
def test_entry_sizes_healthy_without_topology(device_id: str, entry_bytes: int) -> None:
    device = deviceplugin_pb2.Device(ID=device_id, health=HEALTHY)
    # 1 (tag) + 1 (length varint, body < 128) + (2 + len(ID)) + (2 + len("Healthy"))
    assert entry_bytes == 1 + 1 + (2 + len(device_id)) + (2 + len(HEALTHY))
    assert _entry_size(device) == entry_bytes
    unhealthy = deviceplugin_pb2.Device(ID=device_id, health=UNHEALTHY)
    assert _entry_size(unhealthy) == entry_bytes + 2


def test_entry_size_topology_overhead() -> None:
    base = _entry_size(deviceplugin_pb2.Device(ID=f"GPU-{UUID}", health=HEALTHY))

    def with_node(node: int) -> int:
        topology = deviceplugin_pb2.TopologyInfo(nodes=[deviceplugin_pb2.NUMANode(ID=node)])
        return _entry_size(deviceplugin_pb2.Device(ID=f"GPU-{UUID}", health=HEALTHY, topology=topology))

    assert with_node(0) == base + 4  # NUMA node 0 is the default value: not on the wire
    assert with_node(1) == base + 6
    assert with_node(127) == base + 6
    assert with_node(128) == base + 7  # two-byte varint


@pytest.mark.parametrize(
    ("device_id", "fit"),
    [(f"GPU-{UUID}-memory-12345", 63_550), ("123-456", 209_715)],
)
def test_entries_fitting_kubelet_limit(device_id: str, fit: int) -> None:
    assert KUBELET_MAX_MESSAGE_BYTES == 4 * 1024 * 1024
    entry = _entry_size(deviceplugin_pb2.Device(ID=device_id, health=HEALTHY))
    assert KUBELET_MAX_MESSAGE_BYTES // entry == fit
    # Entries add up exactly: the response has no other fields.
    response = deviceplugin_pb2.ListAndWatchResponse(
        devices=[deviceplugin_pb2.Device(ID=device_id, health=HEALTHY)] * fit
    )
    assert response.ByteSize() == fit * entry <= KUBELET_MAX_MESSAGE_BYTES
    response.devices.add(ID=device_id, health=HEALTHY)
    assert response.ByteSize() > KUBELET_MAX_MESSAGE_BYTES


def test_constants() -> None:
    assert (HEALTHY, UNHEALTHY) == ("Healthy", "Unhealthy")
    assert VERSION == "v1beta1"
    assert SUPPORTED_VERSIONS == (VERSION,)
    assert DEVICE_PLUGIN_PATH == "/var/lib/kubelet/device-plugins/"
    assert KUBELET_SOCKET == "/var/lib/kubelet/device-plugins/kubelet.sock"
    assert POD_RESOURCES_SOCKET == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert PRE_START_CONTAINER_TIMEOUT_S == 30
    assert KUBELET_MAX_MESSAGE_BYTES == 4_194_304
