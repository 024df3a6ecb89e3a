"""Discovery documents: `/version`, `/api`, `/api/v1`, `/apis` and the OpenAPI v3 index and core/v1 doc.

kubectl 1.32 asks for aggregated discovery (`apidiscovery.k8s.io/v2`) first; answering the legacy
documents with `Content-Type: application/json` makes it fall back, as it does with older servers.
The OpenAPI v3 doc carries only what kubectl reads from it: the PATCH operation of each kind with
its `fieldValidation` parameter, which tells kubectl to leave validation to the server.
"""

from __future__ import annotations

import hashlib
import json

from deviceplugin.sim.apiserver.kinds import API_VERSION, KINDS, VERBS, Kind
from deviceplugin.sim.apiserver.meta import Obj

SERVER_VERSION = {"major": "1", "minor": "32", "git": "v1.32.0+deviceplugin.sim"}
OPENAPI_V3_CORE = "/openapi/v3/api/v1"
_SUBRESOURCE_VERBS = {"status": ("get", "patch", "update"), "binding": ("create",)}
_PATCH_PARAMETERS = ("dryRun", "fieldManager", "fieldValidation", "force", "pretty")


def version() -> Obj:
    return {
        "major": SERVER_VERSION["major"],
        "minor": SERVER_VERSION["minor"],
        "gitVersion": SERVER_VERSION["git"],
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.23.4",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str) -> Obj:
    return {
        "kind": "APIVersions",
        "versions": [API_VERSION],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def api_groups() -> Obj:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}


def _resource(kind: Kind) -> Obj:
    entry: Obj = {
        "name": kind.plural,
        "singularName": kind.singular,
        "namespaced": kind.namespaced,
        "kind": kind.kind,
        "verbs": list(VERBS),
    }
    if kind.short_names:
        entry["shortNames"] = list(kind.short_names)
    if kind.categories:
        entry["categories"] = list(kind.categories)
    return entry


def _subresource(kind: Kind, subresource: str) -> Obj:
    return {
        "name": f"{kind.plural}/{subresource}",
        "singularName": "",
        "namespaced": kind.namespaced,
        "kind": "Binding" if subresource == "binding" else kind.kind,
        "verbs": list(_SUBRESOURCE_VERBS[subresource]),
    }


def core_resources() -> Obj:
    resources = [
        {
            "name": "bindings",
            "singularName": "binding",
            "namespaced": True,
            "kind": "Binding",
            "verbs": ["create"],
        }
    ]
    for kind in sorted(KINDS, key=lambda k: k.plural):
        resources.append(_resource(kind))
        resources.extend(_subresource(kind, sub) for sub in kind.subresources)
    return {"kind": "APIResourceList", "groupVersion": API_VERSION, "resources": resources}


def openapi_v3_core() -> Obj:
    paths: Obj = {}
    for kind in KINDS:
        scope = "/namespaces/{namespace}" if kind.namespaced else ""
        parameters = [
            {"name": name, "in": "query", "schema": {"type": "string"}} for name in _PATCH_PARAMETERS
        ]
        paths[f"/api/v1{scope}/{kind.plural}/{{name}}"] = {
            "patch": {
                "operationId": f"patchCoreV1{'Namespaced' if kind.namespaced else ''}{kind.kind}",
                "parameters": parameters,
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {"group": "", "version": API_VERSION, "kind": kind.kind},
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": SERVER_VERSION["git"]},
        "paths": paths,
        "components": {"schemas": {}},
    }


def openapi_v3_index() -> Obj:
    digest = hashlib.sha512(json.dumps(openapi_v3_core(), sort_keys=True).encode()).hexdigest().upper()
    return {"paths": {"api/v1": {"serverRelativeURL": f"{OPENAPI_V3_CORE}?hash={digest}"}}}
