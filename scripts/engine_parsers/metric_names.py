"""Record the Prometheus metric names an engine release defines, for the metric-name check.

Reads every ``.py`` file of an installed engine package (the parser check's virtualenv, or an unpacked
wheel) and writes one line per metric name it spells out (``vllm:...`` or ``sglang:...`` string
literals), with the first file and line that names it:

    vllm:external_prefix_cache_queries	vllm/v1/metrics/loggers.py:686

to ``scripts/engine_parsers/metric_names/<engine>-<version>.txt``. tests/metrics/test_metrics_engine_names.py
checks the scraper's dialect tables against the record of the version the shipped configs pin.

    python scripts/engine_parsers/metric_names.py ENGINE VERSION PACKAGE_DIR
    (PACKAGE_DIR: the directory holding the engine's package, e.g. a virtualenv's site-packages)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "metric_names"
HEADER = "# {engine} {version}: every metric name its sources spell out, with the first file:line naming it\n"


def names(engine: str, package_dir: Path) -> dict[str, str]:
    """name -> ``path:line`` (relative to package_dir) of the first place it is spelled out."""
    literal = re.compile(rf"[\"']({engine}:[a-z0-9_]+)[\"']")
    found: dict[str, str] = {}
    root = package_dir / engine
    for path in sorted(root.rglob("*.py")):
        if "test" in path.relative_to(root).parts[:-1]:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for match in literal.finditer(line):
                found.setdefault(match.group(1), f"{path.relative_to(package_dir)}:{number}")
    return found


def record_path(engine: str, version: str) -> Path:
    return RECORDS / f"{engine}-{version}.txt"


def read_record(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, _, where = line.partition("\t")
            out[name] = where
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("vllm", "sglang"):
        print("usage: metric_names.py vllm|sglang VERSION PACKAGE_DIR", file=sys.stderr)
        return 2
    engine, version, package_dir = argv[0], argv[1], Path(argv[2])
    if not (package_dir / engine).is_dir():
        print(f"{package_dir}: holds no {engine}/ package", file=sys.stderr)
        return 2
    found = names(engine, package_dir)
    out = record_path(engine, version)
    out.parent.mkdir(exist_ok=True)
    lines = [HEADER.format(engine=engine, version=version)]
    lines += [f"{name}\t{where}\n" for name, where in sorted(found.items())]
    out.write_text("".join(lines), encoding="utf-8")
    print(f"{out}: {len(found)} names")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
