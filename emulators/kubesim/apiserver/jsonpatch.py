"""JSON patch (RFC 6902) through the `jsonpatch` library, with the real server's error codes: a
malformed patch document is a 400, an operation that cannot apply (missing path, failed `test`) a
422."""

from __future__ import annotations

from typing import Any

import jsonpatch
import jsonpointer

from kubesim.apiserver.errors import ApiError, bad_request


def apply_json_patch(document: Any, operations: Any) -> Any:
    if not isinstance(operations, list) or not all(isinstance(op, dict) for op in operations):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    try:
        return jsonpatch.apply_patch(document, operations)
    except jsonpatch.InvalidJsonPatch as err:
        raise bad_request(str(err)) from None
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as err:
        raise ApiError(422, "Invalid", str(err)) from None
