"""The `v1beta1.DevicePlugin` service for one kubelet resource.

ListAndWatch answers with pre-encoded bytes (see `devices.DeviceList`), so the service is
registered with its own method handlers: identical method names and message types as the
generated servicer, but an identity serializer for the stream.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.gpu.health import HealthState
from deviceplugin.logs import get_log
from deviceplugin.plugin.devices import DeviceList

log = get_log(__name__)
_Response = TypeVar("_Response", bound=Message)

SERVICE = pb.DESCRIPTOR.services_by_name["DevicePlugin"].full_name
# How often a ListAndWatch stream re-checks whether it should end, when nothing changes.
STREAM_POLL_S = 0.5
OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


def _identity(message: bytes) -> bytes:
    return message


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


class DevicePluginService:
    """Serves one resource's device list and follows GPU health."""

    def __init__(self, devices: DeviceList, health: HealthState) -> None:
        self.devices = devices
        self.health = health
        self.stopping = threading.Event()

    @property
    def resource_name(self) -> str:
        return self.devices.resource.name

    def get_device_plugin_options(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return OPTIONS

    def list_and_watch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[bytes]:
        """The full list on connect, then again after every health change; never an unchanged list."""
        version, health = self.health.snapshot()
        sent = self.devices.message(health)
        log.info("listandwatch connected", resource=self.resource_name, bytes=len(sent))
        yield sent
        while not self.stopping.is_set() and context.is_active():
            latest = self.health.wait_change(version, STREAM_POLL_S)
            if latest == version:
                continue
            version, health = self.health.snapshot()
            message = self.devices.message(health)
            if message != sent:
                sent = message
                yield sent
        log.info("listandwatch closed", resource=self.resource_name)

    def get_preferred_allocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        return self._unimplemented(context, pb.PreferredAllocationResponse())

    def allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        return self._unimplemented(context, pb.AllocateResponse())

    def pre_start_container(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    def _unimplemented(self, context: grpc.ServicerContext, empty: _Response) -> _Response:
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details(f"{self.resource_name}: allocation is not served yet")
        return empty

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(method: object, request: type[Message]) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                method, request_deserializer=request.FromString, response_serializer=_serialize
            )

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "GetDevicePluginOptions": unary(self.get_device_plugin_options, pb.Empty),
                "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                    self.list_and_watch,
                    request_deserializer=pb.Empty.FromString,
                    response_serializer=_identity,
                ),
                "GetPreferredAllocation": unary(self.get_preferred_allocation, pb.PreferredAllocationRequest),
                "Allocate": unary(self.allocate, pb.AllocateRequest),
                "PreStartContainer": unary(self.pre_start_container, pb.PreStartContainerRequest),
            },
        )
