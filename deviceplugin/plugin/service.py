"""The `v1beta1.DevicePlugin` service for one kubelet resource.

ListAndWatch answers with pre-encoded bytes (see `devices.DeviceList`), so the service is
registered with its own method handlers: identical method names and message types as the
generated servicer, but an identity serializer for the stream. Each handler answers an exception
it does not expect (a bug) with INTERNAL naming the call and the exception, and logs it with its
traceback; gRPC itself would answer UNKNOWN "Exception calling application" and log nothing of ours.
`fault(rpc)` runs first in each call: the supervisor's test hook (`Supervisor.inject`) raises there
for the calls its file names, as no real fault reaches some of them.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.gpu.health import HealthState
from deviceplugin.logs import describe_exception, get_log
from deviceplugin.plugin.allocate import AllocateError, Allocator
from deviceplugin.plugin.devices import DeviceList

log = get_log(__name__)
_Request = TypeVar("_Request", bound=Message)
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
        fault: Callable[[str], None] = lambda _rpc: None,
    ) -> None:
        self.devices = devices
        self.health = health
        self.allocator = allocator
        self.unavailable = unavailable  # the answer to Allocate when there is no allocator
        self.fault = fault
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

    def _failed(self, rpc: str, err: Exception, context: grpc.ServicerContext) -> None:
        text = describe_exception(err)
        log.error(
            "rpc failed",
            resource=self.resource_name,
            rpc=rpc,
            error=text,
            traceback="".join(traceback.format_tb(err.__traceback__)),
        )
        context.set_code(grpc.StatusCode.INTERNAL)
        context.set_details(f"{self.resource_name}: {rpc} failed: {text}")

    def _unary(
        self,
        rpc: str,
        method: Callable[[_Request, grpc.ServicerContext], _Response],
        request: type[_Request],
        empty: type[_Response],
    ) -> grpc.RpcMethodHandler:
        def call(message: _Request, context: grpc.ServicerContext) -> _Response:
            try:
                self.fault(rpc)
                return method(message, context)
            except Exception as err:  # a bug: see the module's docstring
                self._failed(rpc, err, context)
                return empty()

        return grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=request.FromString, response_serializer=_serialize
        )

    def _stream(self, message: pb.Empty, context: grpc.ServicerContext) -> Iterator[bytes]:
        try:
            self.fault("ListAndWatch")
            yield from self.list_and_watch(message, context)
        except Exception as err:  # a bug: see the module's docstring
            self._failed("ListAndWatch", err, context)

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "GetDevicePluginOptions": self._unary(
                    "GetDevicePluginOptions", self.get_device_plugin_options, pb.Empty, pb.DevicePluginOptions
                ),
                "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                    self._stream, request_deserializer=pb.Empty.FromString, response_serializer=_identity
                ),
                "GetPreferredAllocation": self._unary(
                    "GetPreferredAllocation",
                    self.get_preferred_allocation,
                    pb.PreferredAllocationRequest,
                    pb.PreferredAllocationResponse,
                ),
                "Allocate": self._unary("Allocate", self.allocate, pb.AllocateRequest, pb.AllocateResponse),
                "PreStartContainer": self._unary(
                    "PreStartContainer",
                    self.pre_start_container,
                    pb.PreStartContainerRequest,
                    pb.PreStartContainerResponse,
                ),
            },
        )
