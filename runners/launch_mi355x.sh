#!/usr/bin/env bash
# Run one matrix cell on a MI355X node through Slurm: cell from the environment, results in RESULT_DIR,
# exit status of the cell. Site settings come from configs/runners.yaml (key "mi355x"); see docs/slurm.md.
set -euo pipefail
# shellcheck source=runners/lib/launch.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/launch.sh"
as_launch mi355x amd
