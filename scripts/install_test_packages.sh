#!/usr/bin/env bash
# Install the Debian packages the test suite's tiers need (.ci/apt-packages.txt, one per line, '#'
# starts a comment): only the missing ones, with apt-get (as root, or through sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t packages < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' .ci/apt-packages.txt)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "test-deps: every package of .ci/apt-packages.txt is installed"
  exit 0
fi
sudo=()
if ((EUID != 0)); then
  command -v sudo >/dev/null || { echo "test-deps: run as root (apt-get install ${missing[*]})" >&2; exit 2; }
  sudo=(sudo)
fi
echo "test-deps: installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
