"""API errors as the real server reports them: an HTTP code and a `Status` body.

Messages follow k8s.io/apimachinery's `errors.New*` constructors, because clients (and people) match on
them: `pods "x" not found`, `Operation cannot be fulfilled on pods "x": ...`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kubesim.apiserver.meta import Obj

#: StatusReason per HTTP code, for errors made from a bare code (fault injection).
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass(frozen=True)
class FieldCause:
    """One field error of an Invalid status (`field.Error`): `spec.containers: Required value`."""

    type: str  # FieldValueRequired, FieldValueInvalid, FieldValueForbidden, FieldValueNotSupported
    field: str
    body: str  # what `field.Error.ErrorBody()` prints, e.g. `Required value`

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"


class ApiError(Exception):
    """Raised anywhere below the HTTP layer; answered as `Status` with `code`."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: Obj | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = tuple(headers)

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:  # an error the registry did not classify has no reason, like StatusReasonUnknown
            body["reason"] = self.reason
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(name: str, kind: str) -> Obj:
    details: Obj = {}
    if name:
        details["name"] = name
    details["kind"] = kind
    return details


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource} "{name}" not found', _details(name, resource))


def unknown_path() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def already_exists(resource: str, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists', _details(name, resource))


def conflict(resource: str, name: str, why: str) -> ApiError:
    message = f'Operation cannot be fulfilled on {resource} "{name}": {why}'
    return ApiError(409, "Conflict", message, _details(name, resource))


def stale(resource: str, name: str) -> ApiError:
    why = "the object has been modified; please apply your changes to the latest version and try again"
    return conflict(resource, name, why)


def invalid(kind: str, name: str, causes: Sequence[FieldCause]) -> ApiError:
    # field.ErrorList.ToAggregate(): one error prints bare, several as "[a, b]".
    listed = str(causes[0]) if len(causes) == 1 else "[" + ", ".join(str(cause) for cause in causes) + "]"
    details = _details(name, kind)
    details["causes"] = [
        {"reason": cause.type, "message": cause.body, "field": cause.field} for cause in causes
    ]
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {listed}', details)


def forbidden(resource: str, name: str, why: str) -> ApiError:
    return ApiError(403, "Forbidden", f'{resource} "{name}" is forbidden: {why}', _details(name, resource))


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}
    )


def unsupported_media_type(content_type: str, accepted: Sequence[str]) -> ApiError:
    message = "the body of the request was in an unknown format - accepted media types include: " + ", ".join(
        accepted
    )
    return ApiError(
        415, "UnsupportedMediaType", message, {"causes": [{"reason": "", "message": content_type}]}
    )


def internal(message: str) -> ApiError:
    return ApiError(
        500, "InternalError", f"Internal error occurred: {message}", {"causes": [{"message": message}]}
    )


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def too_large_resource_version(wanted: int, current: int) -> ApiError:
    """A read at a version the server has not reached (it would wait a few seconds first)."""
    details = {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }
    return ApiError(504, "Timeout", f"Too large resource version: {wanted}, current: {current}", details)


def from_code(code: int, message: str, retry_after_s: int | None = None) -> ApiError:
    """An error made from a bare HTTP code, as fault injection asks for it."""
    details: Obj | None = None
    headers: list[tuple[str, str]] = []
    if retry_after_s is not None:
        details = {"retryAfterSeconds": retry_after_s}
        headers.append(("Retry-After", str(retry_after_s)))
    return ApiError(code, REASONS.get(code, ""), message, details, headers)
