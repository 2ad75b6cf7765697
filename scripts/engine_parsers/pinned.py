"""Print the engine versions the shipped configs pin, one `ENGINE VERSION` line per engine.

The version is read from each entry's image tag (``vllm/vllm-openai:v0.33.0`` -> 0.33.0, a digest
after ``@`` ignored). Every entry of one engine must pin the same version: the parser check installs
one per engine. Bad input: one line, exit 2.

Run with the project's interpreter: ``.venv/bin/python scripts/engine_parsers/pinned.py [CONFIG]``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from agentsweep.config import load_sweep
from agentsweep.config.loader import read_config_file, repo_root
from agentsweep.errors import AgentsweepError, ConfigError

TAG_VERSION = re.compile(r"^v?(\d+\.\d+\.\d+(?:\.post\d+)?)(?:$|[-+])")
PARSED_ENGINES = ("vllm", "sglang")


def image_version(image: str) -> str | None:
    """The release an image tag names (``lmsysorg/sglang:v0.5.23`` -> 0.5.23), else None."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    match = TAG_VERSION.match(last.split(":", 1)[1])
    return match.group(1) if match else None


def pinned_versions(config: Path) -> dict[str, str]:
    """engine -> the one version its shipped entries pin (ConfigError when they disagree or none can be read)."""
    found: dict[str, dict[str, str]] = {}
    for key in read_config_file(config).entries:
        spec = load_sweep(config, key)
        if spec.engine not in PARSED_ENGINES:
            continue
        version = image_version(spec.image)
        if version is None:
            raise ConfigError(f"{config}: {key}.image {spec.image!r} has no version tag (like :v0.33.0)")
        found.setdefault(spec.engine, {})[str(key)] = version
    out: dict[str, str] = {}
    for engine, by_key in found.items():
        versions = sorted(set(by_key.values()))
        if len(versions) > 1:
            listing = ", ".join(f"{k}: {v}" for k, v in sorted(by_key.items()))
            raise ConfigError(f"{config}: the {engine} entries pin different versions ({listing}); pin one")
        out[engine] = versions[0]
    return out


def main(argv: list[str]) -> int:
    root = repo_root() or Path.cwd()
    config = Path(argv[0]) if argv else root / "configs" / "agentic.yaml"
    try:
        versions = pinned_versions(config)
    except AgentsweepError as err:
        print(err.render(), file=sys.stderr)
        return err.exit_code
    for engine, version in sorted(versions.items()):
        print(engine, version)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
