"""The JSON Schemas of both row shapes: generated from the models, shipped in ``schemas/``, and the
check every exported row passes (``python -m agentsweep.export.schema`` rewrites the shipped files
after a model changes; a test fails while they differ)."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Literal

from jsonschema import Draft202012Validator

from agentsweep.export.models import FLAT_SCHEMA, NESTED_SCHEMA, FlatRow, NestedRow

Shape = Literal["flat", "nested"]
SCHEMA_DIR = Path(__file__).parent / "schemas"
SCHEMA_FILES: dict[Shape, str] = {
    "flat": f"{FLAT_SCHEMA}.schema.json",
    "nested": f"{NESTED_SCHEMA}.schema.json",
}


def generated(shape: Shape) -> dict[str, Any]:
    """The schema of a shape as the models define it (the dump uses the aliases: ``p99.9_ttft``)."""
    model = FlatRow if shape == "flat" else NestedRow
    schema = model.model_json_schema(by_alias=True, mode="serialization")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://agentsweep/schemas/{SCHEMA_FILES[shape]}",
        **schema,
    }


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def shipped(shape: Shape) -> dict[str, Any]:
    """The schema file shipped with the package."""
    loaded: dict[str, Any] = json.loads((SCHEMA_DIR / SCHEMA_FILES[shape]).read_text(encoding="utf-8"))
    return loaded


@functools.cache
def validator(shape: Shape) -> Draft202012Validator:
    return Draft202012Validator(shipped(shape))


def problems(row: dict[str, Any], shape: Shape) -> list[str]:
    """Where a row breaks the shipped schema of its shape, one line each (empty: it validates)."""
    return [
        f"{'/'.join(map(str, err.absolute_path)) or '(row)'}: {err.message}"
        for err in sorted(validator(shape).iter_errors(row), key=lambda e: list(map(str, e.absolute_path)))
    ]


def main() -> int:
    SCHEMA_DIR.mkdir(exist_ok=True)
    for shape, name in SCHEMA_FILES.items():
        (SCHEMA_DIR / name).write_text(render(generated(shape)), encoding="utf-8")
        print(f"wrote {SCHEMA_DIR / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
