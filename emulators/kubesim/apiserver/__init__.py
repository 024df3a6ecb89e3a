"""Kubernetes API-server emulator over real HTTP: the `kubernetes` client and kubectl work against it.

Layout, top to bottom: `server` (the emulator object) wires `transport` (HTTP/1.1, request bodies
in `body`, faults, request log) to `api` (routing, verbs, content negotiation), which drives `store`
(objects, resourceVersions, watch history and feeds). Beside them: `kinds` (one table entry per
kind), `defaults` and `validation` (what the registry fills in and rejects), `selectors`,
`mergepatch` and `jsonpatch`, `watch` (feeds and event streams), `tables` and `printers`
(server-side printing), `discovery`, `errors` (Status bodies), `faults`, `requestlog`,
`kubeconfig`, `runner` (the CLI command).
"""

from kubesim.apiserver.faults import ErrorReply, Fault, FaultInjector, Garbled, Hang, Latency
from kubesim.apiserver.requestlog import RequestLog, RequestRecord
from kubesim.apiserver.runner import run_apiserver
from kubesim.apiserver.server import ApiServerEmulator

__all__ = [
    "ApiServerEmulator",
    "ErrorReply",
    "Fault",
    "FaultInjector",
    "Garbled",
    "Hang",
    "Latency",
    "RequestLog",
    "RequestRecord",
    "run_apiserver",
]
