"""The column types of a job: the kinds of JSON value a column holds, one type across shards, and a block cast to
it; a mixed column's value as text."""

from __future__ import annotations

import json

import pyarrow as pa

from ..errors import InputError

KINDS_OF = {str: "str", bool: "bool", int: "int", float: "float", list: "list", dict: "dict"}
INT64 = (-(1 << 63), (1 << 63) - 1)


class Kinds:
    """The kinds of JSON value one column holds across a shard, to fix its Arrow type before reading."""

    def __init__(self):
        self.seen: set[str] = set()
        self.nested: set[pa.DataType] = set()

    def add(self, value) -> None:
        if value is None:
            return
        kind = KINDS_OF.get(type(value), "other")
        if kind == "int" and not INT64[0] <= value <= INT64[1]:
            kind = "bigint"
        self.seen.add(kind)
        if kind in ("list", "dict") and len(self.nested) < 64:
            try:
                self.nested.add(pa.array([value]).type)
            except (pa.ArrowException, ValueError, TypeError, OverflowError):
                self.seen.add("other")  # read row by row later; the bad value becomes that row's error

    def arrow_type(self, is_id: bool) -> pa.DataType:
        """One kind keeps its type; numbers that mix int and float are float (ids excepted); any
        other mix is text, each value written as it stands in the file (strings unquoted)."""
        seen = self.seen
        simple = {
            frozenset({"str"}): pa.string(),
            frozenset({"int"}): pa.int64(),
            frozenset({"float"}): pa.float64(),
            frozenset({"bool"}): pa.bool_(),
        }
        if not seen:
            return pa.null()  # no value here: the other shards decide
        if frozenset(seen) in simple:
            return simple[frozenset(seen)]
        if seen == {"int", "float"} and not is_id:
            return pa.float64()
        if len(seen) == 1 and seen <= {"list", "dict"} and self.nested:
            unified = unify(list(self.nested))
            if unified is not None:
                return unified
        return pa.string()


def unify(types: list[pa.DataType]) -> pa.DataType | None:
    """The one type all of `types` fit in, or None."""
    try:
        schema = pa.unify_schemas([pa.schema([("v", t)]) for t in types], promote_options="permissive")
    except (pa.ArrowException, TypeError):
        return None
    return schema.field("v").type


def job_type(column: str, found: dict[str, pa.DataType], is_id: bool = False) -> pa.DataType:
    """The type of a column across shards (shard name -> type there): the common one, numbers widened
    (integers and floats to float64, but ids to text: an id is never rounded), text when the shards
    disagree otherwise; refused only when a value could not be written as text."""
    types = list(dict.fromkeys(found.values()))
    real = [t for t in types if not pa.types.is_null(t)]
    if len(real) <= 1:
        return real[0] if real else pa.string()
    if all(pa.types.is_integer(t) for t in real):
        return pa.int64()
    if all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in real) and not is_id:
        return pa.float64()
    if all(_text_castable(t) for t in real):
        return pa.string()
    unified = unify(real)
    if unified is None:
        shown = "; ".join(f"{name}: {t}" for name, t in list(found.items())[:4])
        raise InputError(
            f"column '{column}' has types that do not combine across shards ({shown})",
            f"give every shard the same type for '{column}'"
            + (", or name another column as input.id" if is_id else ", or leave it out of input.keep"),
        )
    return unified


def _text_castable(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_dictionary(t)
        or pa.types.is_temporal(t)
        or pa.types.is_decimal(t)
    )


def as_text(value) -> str | None:
    """A value of a mixed column as text: strings as they are, anything else as its JSON text."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def cast_columns(table: pa.Table, types: dict[str, pa.DataType]) -> pa.Table:
    """A block of a typed format (Parquet, saved datasets) in the job's column types."""
    for i, name in enumerate(table.column_names):
        want = types.get(name)
        if want is not None and table.column(i).type != want:
            # Integers widened to float64 may round past 2**53: a number column, never an id (see job_type).
            table = table.set_column(i, name, table.column(i).cast(want, safe=not pa.types.is_floating(want)))
    return table
