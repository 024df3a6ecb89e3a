"""Timestamps as the real server stores them: it decodes every `metav1.Time` field from any RFC 3339
form (`+02:00`, fractions, lower-case `t`/`z`) and writes it back in UTC, whole seconds
(`2026-03-01T10:00:00Z`); `metav1.MicroTime` fields keep microseconds. A time it cannot parse
fails the whole request. Clients send other forms: the official Python client writes its
datetimes with `+00:00`, which kubectl's age columns would otherwise show as `<unknown>`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from kubesim.apiserver.errors import ApiError

#: `metav1.Time` fields of the kinds served, by JSON name.
TIME_FIELDS = frozenset(
    {
        "creationTimestamp",
        "deletionTimestamp",
        "firstTimestamp",
        "lastTimestamp",
        "lastHeartbeatTime",
        "lastTransitionTime",
        "lastProbeTime",
        "startTime",
        "startedAt",
        "finishedAt",
        "time",  # managedFields
    }
)
#: `metav1.MicroTime` fields.
MICRO_TIME_FIELDS = frozenset({"eventTime", "lastObservedTime", "acquireTime", "renewTime"})
#: Maps whose keys are the user's, not field names: never read as times.
_USER_MAPS = frozenset({"labels", "annotations", "data", "binaryData", "nodeSelector"})
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\d[Tt]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)")


def encode_times(obj: dict[str, Any], kind: str) -> None:
    """Rewrite every time field of `obj` in place as the server writes it; 400 naming the field when
    one is not an RFC 3339 time."""
    _walk(obj, "", kind)


def _walk(value: Any, path: str, kind: str) -> None:
    if isinstance(value, list):
        for index, item in enumerate(value):
            _walk(item, f"{path}[{index}]", kind)
        return
    if not isinstance(value, dict):
        return
    for key, item in value.items():
        where = f"{path}.{key}" if path else key
        if key in TIME_FIELDS or key in MICRO_TIME_FIELDS:
            value[key] = _encode(item, where, kind, micro=key in MICRO_TIME_FIELDS)
        elif key not in _USER_MAPS:
            _walk(item, where, kind)


def _encode(text: Any, where: str, kind: str, *, micro: bool) -> str:
    moment = _parse(text)
    if moment is None:
        raise ApiError(
            400,
            "BadRequest",
            f'{kind} in version "v1" cannot be handled as a {kind}: '
            f'{where}: parsing time "{text}": not an RFC 3339 time',
        )
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def _parse(text: Any) -> datetime | None:
    if not isinstance(text, str) or _RFC3339.fullmatch(text) is None:
        return None
    try:
        return datetime.fromisoformat(text.upper()).astimezone(UTC)
    except ValueError:  # the right shape, but no such date or time (month 13, 25 o'clock)
        return None
