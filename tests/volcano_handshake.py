"""Volcano's side of `volcano.sh/node-vgpu-handshake` (v1.8.0 to v1.15.0), as its scheduler runs it
for a node in every session (`vgpu/device_info.go: NewGPUDevices`): no annotation or `Deleted_…`
means no vGPUs; `Requesting_<t>` older than 60 s becomes `Deleted_<now>`; any other value becomes
`Requesting_<now>`. Writes are strategic-merge patches of the annotation, as Volcano's are."""

from __future__ import annotations

import datetime
import threading

from deviceplugin.fit import keys
from kubesim.apiserver import ApiServerEmulator

LAYOUT = "%Y.%m.%d %H:%M:%S"  # Go's 2006.01.02 15:04:05
EXPIRY = datetime.timedelta(seconds=60)


def stamp(kind: str, when: datetime.datetime) -> str:
    return f"{kind}_{when:{LAYOUT}}"


class VolcanoHandshake:
    def __init__(self, apiserver: ApiServerEmulator, node: str, session_s: float = 0.05) -> None:
        self.apiserver = apiserver
        self.node = node
        self.session_s = session_s
        self.requests = 0  # Requesting_ values written
        self.deleted = 0  # Deleted_ values written
        self.sessions = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="volcano-handshake", daemon=True)

    def value(self) -> str | None:
        node = self.apiserver.get("nodes", self.node) or {}
        return (node.get("metadata", {}).get("annotations") or {}).get(keys.NODE_VGPU_HANDSHAKE)

    def session(self) -> bool:
        """One scheduling session's look at the node; True when the node's vGPUs are usable."""
        self.sessions += 1
        value, now = self.value(), datetime.datetime.now()
        if value is None or ("Requesting" not in value and "Deleted" in value):
            return False
        if "Requesting" in value:
            # Go: `strings.Split(v, "_")[1]` panics without a "_" (IndexError here); a time that does
            # not parse is Go's zero time, long expired
            try:
                asked = datetime.datetime.strptime(value.split("_")[1], LAYOUT)
            except ValueError:
                asked = datetime.datetime.min
            if now > asked + EXPIRY:
                self._write(stamp("Deleted", now))
                self.deleted += 1
                return False
            return True
        self._write(stamp("Requesting", now))
        self.requests += 1
        return True

    def _write(self, value: str) -> None:
        self.apiserver.patch(
            "nodes", self.node, {"metadata": {"annotations": {keys.NODE_VGPU_HANDSHAKE: value}}}
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.session_s):
            self.session()
