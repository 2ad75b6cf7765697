"""The releases the shipped configs pin, held together: each entry's image tag is the version the
parser check installs (scripts/engine_parsers/pinned.py), that version has a record of the metric names
its sources define (scripts/engine_parsers/metric_names/), and every name the scraper's dialect tables
read is in that record or declared as an older release's (dialects.OLDER_NAMES).

Moving a key to a new release (docs/first-run.md) fails here until the parser check's version, the
metric-name record and the dialect agree with the new tag."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
from agentsweep.config.loader import read_config_file
from agentsweep.errors import ConfigError
from agentsweep.metrics import dialects

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "engine_parsers"
CONFIG = REPO / "configs" / "agentic.yaml"
NAME = re.compile(r"^(vllm|sglang):[a-z0-9_]+$")
_SAMPLE_SUFFIXES = ("_total", "_count", "_sum", "_bucket", "_created")


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"engine_parsers_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PINNED = _script("pinned")
METRIC_NAMES = _script("metric_names")


def _base(name: str) -> str:
    """A family's name as both engines define it and the dialect reads it (sample suffixes off)."""
    for suffix in _SAMPLE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def dialect_names() -> dict[str, set[str]]:
    """Every metric name the dialect tables spell out, by engine (string constants of the module)."""
    tree = ast.parse(Path(dialects.__file__).read_text(encoding="utf-8"))
    found: dict[str, set[str]] = {"vllm": set(), "sglang": set()}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.match(node.value):
            found[node.value.split(":", 1)[0]].add(node.value)
    return found


def release_problems(config: Path) -> list[str]:
    """What keeps the config's pinned releases apart from the parser check, the records and the dialect."""
    try:
        versions = PINNED.pinned_versions(config)
    except ConfigError as err:
        return [str(err)]
    problems = []
    for key, entry in read_config_file(config).entries.items():
        engine, image = entry.get("engine"), str(entry.get("image", ""))
        if engine in versions and PINNED.image_version(image) != versions[engine]:
            problems.append(f"{key}: image {image} is not the parser check's {engine} {versions[engine]}")
    used = dialect_names()
    for engine, version in sorted(versions.items()):
        record = METRIC_NAMES.record_path(engine, version)
        if not record.is_file():
            problems.append(
                f"no metric-name record for {engine} {version}: run scripts/engine_parsers/metric_names.py "
                f"{engine} {version} SITE_PACKAGES"
            )
            continue
        defined = {_base(name) for name in METRIC_NAMES.read_record(record)}
        for name in sorted(used[engine]):
            if _base(name) not in defined and name not in dialects.OLDER_NAMES:
                problems.append(f"the dialect reads {name}, which {engine} {version} does not define")
    return problems


def test_the_shipped_releases_agree_with_the_parser_check_and_the_metric_names() -> None:
    assert release_problems(CONFIG) == []


def test_every_real_engine_entry_pins_the_parser_checks_version() -> None:
    versions = PINNED.pinned_versions(CONFIG)
    assert set(versions) == {"vllm", "sglang"}
    entries = read_config_file(CONFIG).entries.values()
    for entry in entries:
        if entry["engine"] in versions:
            assert PINNED.image_version(entry["image"]) == versions[entry["engine"]], entry["image"]


def test_one_entry_moved_alone_to_a_new_tag_is_caught(tmp_path: Path) -> None:
    moved = tmp_path / "agentic.yaml"
    text = CONFIG.read_text()
    moved.write_text(text.replace("image: lmsysorg/sglang:v0.5.23", "image: lmsysorg/sglang:v0.5.24", 1))
    assert moved.read_text() != text
    (problem,) = release_problems(moved)
    # Only one SGLang entry ships: its move is a whole-engine move, caught by the missing record.
    assert problem.startswith("no metric-name record for sglang 0.5.24")
    moved.write_text(text.replace("image: vllm/vllm-openai:v0.33.0", "image: vllm/vllm-openai:v0.34.0", 1))
    (problem,) = release_problems(moved)
    assert (
        "the vllm entries pin different versions" in problem and "0.34.0" in problem and "0.33.0" in problem
    )


def test_a_name_the_pinned_release_does_not_define_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dialects, "OLDER_NAMES", {})
    problems = release_problems(CONFIG)
    assert "the dialect reads vllm:gpu_prefix_cache_hits, which vllm 0.33.0 does not define" in problems
    # The CPU tier's block counters named in the issue are not in 0.33.0 and not read.
    assert not any("kv_offload_cpu_block" in name for name in dialect_names()["vllm"])
    record = METRIC_NAMES.read_record(METRIC_NAMES.record_path("vllm", "0.33.0"))
    assert not [name for name in record if "cpu_block" in name or "block_eviction" in name]
    assert record["vllm:external_prefix_cache_queries"] == "vllm/v1/metrics/loggers.py:686"
