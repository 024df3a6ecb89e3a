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
from deviceplugin.plugin.allocate import AllocateError, Allocator
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

    def __init__(
        self,
        devices: DeviceList,
        health: HealthState,
        allocator: Allocator | None = None,
        unavailable: tuple[grpc.StatusCode, str] = (
            grpc.StatusCode.UNIMPLEMENTED,
            "allocation is not served",
        ),
    ) -> None:
        self.devices = devices
        self.health = health
        self.allocator = allocator
        self.unavailable = unavailable  # the answer to Allocate when there is no allocator
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
        if self.allocator is None:
            return self._unavailable(context, pb.PreferredAllocationResponse())
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(deviceIDs=self.allocator.preferred(container))
                for container in request.container_requests
            ]
        )

    def allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        if self.allocator is None:
            return self._unavailable(context, pb.AllocateResponse())
        if not request.container_requests:
            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
            context.set_details(f"{self.resource_name}: Allocate carried no container requests")
            return pb.AllocateResponse()
        responses = []
        for container in request.container_requests:
            try:
                responses.append(self.allocator.allocate(list(container.devices_ids)))
            except AllocateError as err:
                context.set_code(err.code)
                context.set_details(str(err))
                return pb.AllocateResponse()
        return pb.AllocateResponse(container_responses=responses)

    def pre_start_container(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    def _unavailable(self, context: grpc.ServicerContext, empty: _Response) -> _Response:
        context.set_code(self.unavailable[0])
        context.set_details(f"{self.resource_name}: {self.unavailable[1]}")
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
