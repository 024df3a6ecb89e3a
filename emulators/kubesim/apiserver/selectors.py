"""Label and field selectors, parsed and matched with k8s.io/apimachinery's grammar and semantics."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kubesim.apiserver.errors import ApiError, bad_request

# labels.Parse's lexer: these characters end an identifier.
_LABEL_TOKEN = re.compile(r"\s*(!=|==|=|!|\(|\)|,|<|>|[^\s!=,()<>]+)")


@dataclass(frozen=True)
class _Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if not present or not re.fullmatch(r"[+-]?\d+", value):
            return False
        bound = int(next(iter(self.values)))
        return int(value) > bound if self.op == "gt" else int(value) < bound


class LabelSelector:
    """`app=web,tier!=db,env in (a,b),!legacy,gpu` — every requirement must hold."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._requirements = _LabelParser(text).parse()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(requirement.matches(labels) for requirement in self._requirements)


class _LabelParser:
    def __init__(self, text: str) -> None:
        self._tokens = _LABEL_TOKEN.findall(text.strip())
        self._at = 0

    def parse(self) -> list[_Requirement]:
        requirements: list[_Requirement] = []
        while self._peek() is not None:
            requirements.append(self._requirement())
            if self._peek() is not None:
                self._expect(",")
        return requirements

    def _peek(self) -> str | None:
        return self._tokens[self._at] if self._at < len(self._tokens) else None

    def _next(self) -> str:
        token = self._peek()
        if token is None:
            raise _parse_error("end of string", "an identifier")
        self._at += 1
        return token

    def _expect(self, wanted: str) -> None:
        token = self._next()
        if token != wanted:
            raise _parse_error(token, f"'{wanted}'")

    def _identifier(self) -> str:
        token = self._next()
        if token in ("!=", "==", "=", "!", "(", ")", ",", "<", ">"):
            raise _parse_error(token, "an identifier")
        return token

    def _requirement(self) -> _Requirement:
        if self._peek() == "!":
            self._next()
            return _Requirement(self._identifier(), "!")
        key = self._identifier()
        op = self._peek()
        if op is None or op == ",":
            return _Requirement(key, "exists")
        self._next()
        if op in ("=", "=="):
            return _Requirement(key, "=", frozenset([self._value()]))
        if op == "!=":
            return _Requirement(key, "!=", frozenset([self._value()]))
        if op in ("in", "notin"):
            return _Requirement(key, op, self._value_set())
        if op in ("<", ">"):
            bound = self._identifier()
            if not re.fullmatch(r"[+-]?\d+", bound):
                raise _parse_error(bound, "an integer for the '<' and '>' operators")
            return _Requirement(key, "gt" if op == ">" else "lt", frozenset([bound]))
        raise _parse_error(op, "'=', '!=', '==', 'in', 'notin', '<', '>'")

    def _value(self) -> str:
        token = self._peek()
        if token is None or token == ",":
            return ""  # `key=` selects the empty value
        return self._identifier()

    def _value_set(self) -> frozenset[str]:
        self._expect("(")
        values: set[str] = set()
        while True:
            token = self._peek()
            if token == ")":
                self._next()
                return frozenset(values)
            values.add(self._value() if token != "," else "")
            if self._peek() == ",":
                self._next()
            elif self._peek() != ")":
                raise _parse_error(self._peek() or "end of string", "',' or ')'")


def _parse_error(found: str, expected: str) -> ApiError:
    return bad_request(f"unable to parse requirement: found '{found}', expected: {expected}")


# --------------------------------------------------------------------------- field selectors

FieldGetter = Callable[[Mapping[str, object]], str]


@dataclass(frozen=True)
class _FieldTerm:
    field: str
    value: str
    equal: bool


class FieldSelector:
    """`spec.nodeName=n1,status.phase!=Failed`: exact string matches on the kind's selectable fields."""

    def __init__(self, text: str, fields: Mapping[str, FieldGetter]) -> None:
        self.text = text
        self._terms = [_field_term(term) for term in _split_unescaped(text, ",") if term]
        self._fields = fields
        for term in self._terms:
            if term.field not in fields:
                raise bad_request(f"field label not supported: {term.field}")

    def matches(self, obj: Mapping[str, object]) -> bool:
        return all((self._fields[term.field](obj) == term.value) == term.equal for term in self._terms)

    def exact(self, field: str) -> str | None:
        """The value this selector pins `field` to (`metadata.name=x`), if it does."""
        for term in self._terms:
            if term.field == field and term.equal:
                return term.value
        return None


def _split_unescaped(text: str, separator: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    escaped = False
    for char in text:
        if escaped:
            current.append("\\" + char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == separator:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _field_term(term: str) -> _FieldTerm:
    # fields.ParseSelector tries the operators in this order, so `a!=b` is never read as `a!` = `b`.
    for op in ("!=", "==", "="):
        index = _unescaped_index(term, op)
        if index >= 0:
            return _FieldTerm(_unescape(term[:index]), _unescape(term[index + len(op) :]), op != "!=")
    raise bad_request(f"invalid selector: '{term}'; can't understand '{term}'")


def _unescaped_index(text: str, needle: str) -> int:
    at = 0
    while at < len(text):
        if text[at] == "\\":
            at += 2
            continue
        if text.startswith(needle, at):
            return at
        at += 1
    return -1
