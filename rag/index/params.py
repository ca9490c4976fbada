"""Build parameters of an index kind: each backend declares the ones it takes, with their
bounds, next to its constructor (`VectorIndex.param_schema`); `check` holds a request's
parameters against that before anything is allocated. An hnsw `initial_capacity` or a faiss
`m` in the millions would otherwise allocate gigabytes in the API process."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rag.errors import Invalid


@dataclass(frozen=True)
class Param:
    kind: type[int] | type[float] | type[bool] | type[str]
    low: float | None = None
    high: float | None = None
    nullable: bool = False  # None means "the backend's own default"
    doc: str = ""
    choices: tuple[str, ...] = ()  # for str: the values it takes

    def check(self, index_kind: str, name: str, value: object) -> None:
        where = f"{index_kind} parameter {name!r}"
        if value is None:
            if not self.nullable:
                raise Invalid(f"{where} must not be null")
            return
        if self.kind is str:
            if value not in self.choices:
                raise Invalid(f"{where} must be one of {', '.join(self.choices)}")
            return
        if self.kind is bool:
            if not isinstance(value, bool):
                raise Invalid(f"{where} must be true or false")
            return
        # JSON has one number type: a bool is not one, and an int parameter takes no 1.5.
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or (self.kind is int and isinstance(value, float) and not value.is_integer())
        ):
            raise Invalid(f"{where} must be {'an integer' if self.kind is int else 'a number'}")
        number = float(value)
        if (self.low is not None and number < self.low) or (
            self.high is not None and number > self.high
        ):
            raise Invalid(f"{where} must be between {_n(self.low)} and {_n(self.high)}")


Schema = Mapping[str, Param]


def check(index_kind: str, schema: Schema, params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` if the kind takes them all within bounds (ints as ints), else Invalid."""
    unknown = sorted(set(params) - set(schema))
    if unknown:
        takes = ", ".join(sorted(schema)) or "no parameters"
        raise Invalid(
            f"{index_kind} takes {takes}; unknown: {', '.join(repr(u)[:66] for u in unknown[:8])}"
        )
    out: dict[str, Any] = {}
    for name, value in params.items():
        spec = schema[name]
        spec.check(index_kind, name, value)
        out[name] = int(value) if spec.kind is int and value is not None else value
    return out


def json_schema(schema: Schema) -> dict[str, Any]:
    """The parameters as a JSON Schema object (for /openapi.json)."""
    properties: dict[str, Any] = {}
    for name, p in schema.items():
        if p.kind is str:
            one: dict[str, Any] = {"type": "string", "enum": list(p.choices)}
        elif p.kind is bool:
            one = {"type": "boolean"}
        else:
            one = {"type": "integer" if p.kind is int else "number"}
            if p.low is not None:
                one["minimum"] = p.low
            if p.high is not None:
                one["maximum"] = p.high
        if p.doc:
            one["description"] = p.doc
        properties[name] = {"anyOf": [one, {"type": "null"}]} if p.nullable else one
    return {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
        "maxProperties": len(properties),
    }


def _n(bound: float | None) -> str:
    if bound is None:
        return "unbounded"
    return str(int(bound)) if float(bound).is_integer() else str(bound)
