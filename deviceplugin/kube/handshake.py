"""The `volcano.sh/node-vgpu-handshake` heartbeat that Volcano <= 1.15 requires (SPEC §5).

Those schedulers treat a node as having no vGPUs once the value they last wrote
(`Requesting_<time>`) is older than 60 s without the plugin answering `Reported <time>`. Newer
Volcano dropped the handshake because thousands of nodes writing every 30 s throttled the API
server, so it is off unless `--vgpu-handshake` asks for it; writes are jittered so nodes started
together do not write together.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable

from deviceplugin.fit import keys
from deviceplugin.kube.api import ApiError, Kube
from deviceplugin.logs import get_log
from deviceplugin.worker import Worker

log = get_log(__name__)

JITTER = 0.2
RETRY_S = 5.0


def reported(now: datetime.datetime) -> str:
    """`Reported ` + the time in the layout of Go's `time.Time.String()` (UTC)."""
    return f"Reported {now.astimezone(datetime.UTC):%Y-%m-%d %H:%M:%S.%f} +0000 UTC"


class Handshake:
    def __init__(
        self,
        kube: Kube,
        node_name: str,
        interval_s: float,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.kube = kube
        self.node_name = node_name
        self.interval_s = interval_s
        self.clock = clock
        self.writes = 0
        self._worker = Worker("vgpu-handshake", self._run)

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def _run(self) -> None:
        while not self._worker.stopping.is_set():
            try:
                annotations = {keys.NODE_VGPU_HANDSHAKE: reported(self.clock())}
                self.kube.patch_node(self.node_name, {"metadata": {"annotations": annotations}})
                self.writes += 1
                pause = self.interval_s * random.uniform(1 - JITTER, 1 + JITTER)
            except ApiError as err:
                log.warning("handshake write failed", node=self.node_name, error=str(err))
                pause = min(RETRY_S, self.interval_s)
            self._worker.stopping.wait(pause)
