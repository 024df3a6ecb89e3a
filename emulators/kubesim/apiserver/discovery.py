"""Discovery documents: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>[/<version>]` and the
OpenAPI v3 index and one doc per group version.

kubectl 1.32 asks for aggregated discovery (`apidiscovery.k8s.io/v2`) first; answering the legacy
documents with `Content-Type: application/json` makes it fall back, as it does with older servers.
The OpenAPI v3 doc carries only what kubectl reads from it: the PATCH operation of each kind with
its `fieldValidation` parameter, which tells kubectl to leave validation to the server.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import partial

from kubesim.apiserver.kinds import API_VERSION, GROUP_VERSIONS, KINDS, VERBS, Kind
from kubesim.apiserver.meta import Obj

SERVER_VERSION = {"major": "1", "minor": "32", "git": "v1.32.0+kubesim"}
_OPENAPI_V3 = "/openapi/v3"
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


def _api_group(group: str) -> Obj:
    versions = [
        {"groupVersion": f"{group}/{version}", "version": version}
        for g, version in GROUP_VERSIONS
        if g == group
    ]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": versions,
        "preferredVersion": versions[0],
    }


def api_groups() -> Obj:
    groups = [_api_group(group) for group in dict.fromkeys(group for group, _ in GROUP_VERSIONS if group)]
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [{k: v for k, v in g.items() if k not in ("kind", "apiVersion")} for g in groups],
    }


def _path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def group_version_document(path: str) -> Callable[[], Obj] | None:
    """The document a discovery or OpenAPI path under a served group version names, else None."""
    for group, version in GROUP_VERSIONS:
        served = _path(group, version)
        if path == "/" + served:
            return partial(resources, group, version)
        if path == f"{_OPENAPI_V3}/{served}":
            return partial(openapi_v3, group, version)
        if group and path == f"/apis/{group}":
            return partial(_api_group, group)
    return None


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


def _kinds_of(group: str, version: str) -> list[Kind]:
    return sorted((k for k in KINDS if (k.group, k.version) == (group, version)), key=lambda k: k.plural)


def resources(group: str, version: str) -> Obj:
    """The APIResourceList of one group version."""
    listed: list[Obj] = []
    if not group:
        listed.append(
            {
                "name": "bindings",
                "singularName": "binding",
                "namespaced": True,
                "kind": "Binding",
                "verbs": ["create"],
            }
        )
    for kind in _kinds_of(group, version):
        listed.append(_resource(kind))
        listed.extend(_subresource(kind, sub) for sub in kind.subresources)
    group_version = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": listed}


def openapi_v3(group: str, version: str) -> Obj:
    """The OpenAPI v3 doc of one group version."""
    paths: Obj = {}
    for kind in _kinds_of(group, version):
        scope = "/namespaces/{namespace}" if kind.namespaced else ""
        parameters = [
            {"name": name, "in": "query", "schema": {"type": "string"}} for name in _PATCH_PARAMETERS
        ]
        operation = (group.partition(".")[0] or "core").capitalize() + version.capitalize()
        paths[f"{kind.prefix}{scope}/{kind.plural}/{{name}}"] = {
            "patch": {
                "operationId": f"patch{operation}{'Namespaced' if kind.namespaced else ''}{kind.kind}",
                "parameters": parameters,
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": kind.kind},
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": SERVER_VERSION["git"]},
        "paths": paths,
        "components": {"schemas": {}},
    }


def openapi_v3_index() -> Obj:
    paths: Obj = {}
    for group, version in GROUP_VERSIONS:
        doc = json.dumps(openapi_v3(group, version), sort_keys=True).encode()
        digest = hashlib.sha512(doc).hexdigest().upper()
        served = _path(group, version)
        paths[served] = {"serverRelativeURL": f"{_OPENAPI_V3}/{served}?hash={digest}"}
    return {"paths": paths}
