"""Kubelet gRPC APIs: generated stubs under short names, plus kubelet's constants.

The stubs are generated from ``proto/`` by ``scripts/gen_proto.py`` (``make proto``)
and committed; do not edit them by hand.

- ``deviceplugin_pb2`` / ``deviceplugin_grpc``: device-plugin API ``v1beta1``
  (``Registration`` served by kubelet, ``DevicePlugin`` served by us).
- ``podresources_pb2`` / ``podresources_grpc``: pod-resources API ``v1``
  (``PodResourcesLister`` served by kubelet).

Careful: generated attribute names follow the proto field names verbatim, e.g.
``Device.ID``, ``ContainerAllocateRequest.devices_ids``,
``ContainerPreferredAllocationRequest.available_deviceIDs``.
"""

from typing import Final

from deviceplugin.api.deviceplugin.v1beta1 import api_pb2 as deviceplugin_pb2
from deviceplugin.api.deviceplugin.v1beta1 import api_pb2_grpc as deviceplugin_grpc
from deviceplugin.api.podresources.v1 import api_pb2 as podresources_pb2
from deviceplugin.api.podresources.v1 import api_pb2_grpc as podresources_grpc

# Values of k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/constants.go.

#: ``Device.health`` of a usable device.
HEALTHY: Final[str] = "Healthy"
#: ``Device.health`` of a device kubelet must stop handing out.
UNHEALTHY: Final[str] = "Unhealthy"
#: Device-plugin API version sent in ``RegisterRequest.version``.
VERSION: Final[str] = "v1beta1"
#: API versions kubelet accepts in ``RegisterRequest.version``.
SUPPORTED_VERSIONS: Final[tuple[str, ...]] = ("v1beta1",)
#: Directory of kubelet's and every plugin's socket (trailing slash, as in kubelet).
DEVICE_PLUGIN_PATH: Final[str] = "/var/lib/kubelet/device-plugins/"
#: Kubelet's ``Registration`` socket.
KUBELET_SOCKET: Final[str] = DEVICE_PLUGIN_PATH + "kubelet.sock"
#: Timeout kubelet applies to ``PreStartContainer``, in seconds.
PRE_START_CONTAINER_TIMEOUT_S: Final[int] = 30

#: Kubelet's pod-resources socket (``PodResourcesLister``).
POD_RESOURCES_SOCKET: Final[str] = "/var/lib/kubelet/pod-resources/kubelet.sock"

#: Largest gRPC message kubelet's device-plugin client receives (gRPC default, 4 MiB);
#: bounds the size of one ``ListAndWatchResponse``.
KUBELET_MAX_MESSAGE_BYTES: Final[int] = 4 * 1024 * 1024

__all__ = [
    "DEVICE_PLUGIN_PATH",
    "HEALTHY",
    "KUBELET_MAX_MESSAGE_BYTES",
    "KUBELET_SOCKET",
    "POD_RESOURCES_SOCKET",
    "PRE_START_CONTAINER_TIMEOUT_S",
    "SUPPORTED_VERSIONS",
    "UNHEALTHY",
    "VERSION",
    "deviceplugin_grpc",
    "deviceplugin_pb2",
    "podresources_grpc",
    "podresources_pb2",
]
