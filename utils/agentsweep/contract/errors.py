"""pydantic validation errors as one line: `<field path>: <what is wrong>` (with a did-you-mean hint).

Shared by the config loader (errors name `<file>:<key>.<field>`) and the cell contract (errors name
`<where>.<field>`), so a bad value reads the same wherever it is caught.
"""

from __future__ import annotations

import difflib
import re
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

# C0 and C1 control characters, DEL, Unicode line/paragraph separators and bidirectional overrides:
# each can break a one-line message, a log, a table or a terminal.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` for a terminal: every control character (``CONTROL``: C0, DEL, C1, line separators,
    bidirectional overrides) written as its escape (``\\x1b``, ``\\r``, ``\\u202e``), so a value read
    from a store, a result or a command line cannot recolour, rewrite or reorder what is printed."""
    return CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def brief(value: Any, width: int = 60) -> str:
    """``repr(value)`` cut to ``width`` characters: error lines stay short whatever the input holds."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def key_text(value: str) -> str:
    """A mapping key as a path part: plain when short and printable, else a shortened repr."""
    return value if len(value) <= 60 and not CONTROL.search(value) else brief(value)


def format_path(parts: typing.Iterable[str | int]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith("["):
            out += part
        else:
            part = key_text(part)
            out += f".{part}" if out else part
    return out


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found:
            return found
    return None


def _model_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            return None
        model = _model_in(model.model_fields[part].annotation)
    return model


def suggest(word: str, choices: typing.Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


_TYPE_WORDS = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def _describe(error: Any, root: type[BaseModel], loc: tuple[str | int, ...]) -> str:
    kind = error["type"]
    value = error.get("input")
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        model = _model_at(root, loc[:-1])
        fields = [f for f in (model.model_fields if model else ()) if f != "label"]
        return f"unknown field{suggest(str(loc[-1]), fields)}"
    if kind == "missing":
        return "required field is missing"
    if kind == "literal_error":
        expected = str(ctx.get("expected", ""))
        allowed = re.findall(r"'([^']*)'", expected) or re.findall(r"-?\d+", expected)
        return f"{brief(value)} is not one of {', '.join(allowed)}{suggest(str(value), allowed)}"
    if kind in _TYPE_WORDS:
        return f"expected {_TYPE_WORDS[kind]}, got {brief(value)}"
    if kind == "finite_number":
        return f"must be a finite number, got {brief(value)}"
    if kind == "greater_than":
        return f"must be > {ctx.get('gt')}, got {brief(value)}"
    if kind == "greater_than_equal":
        return f"must be >= {ctx.get('ge')}, got {brief(value)}"
    if kind == "less_than":
        return f"must be < {ctx.get('lt')}, got {brief(value)}"
    if kind == "less_than_equal":
        return f"must be <= {ctx.get('le')}, got {brief(value)}"
    if kind == "too_short":
        return "must not be empty"
    if kind == "string_too_short":
        return "must not be empty"
    message = str(error.get("msg", "invalid value"))
    return message.removeprefix("Value error, ")


def validation_message(
    err: ValidationError, root: type[BaseModel], labels: typing.Sequence[str] = ()
) -> tuple[str, str]:
    """(field path, what is wrong) for the first error; `labels` names search-space items."""
    error = err.errors()[0]
    # Drop union-branch tags (e.g. "function-after[...]") pydantic puts into locations.
    loc = tuple(p for p in error["loc"] if isinstance(p, int) or "[" not in p)
    shown: list[str | int] = list(loc)
    if len(loc) >= 2 and loc[0] == "search_space" and isinstance(loc[1], int) and loc[1] < len(labels):
        shown[1] = labels[loc[1]]
    return format_path(shown), _describe(error, root, loc)
