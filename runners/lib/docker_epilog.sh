#!/usr/bin/env bash
# Task epilog of an engine instance's job step under docker (srun --task-epilog): slurmstepd runs it on
# the node once the step's task is gone. Stopping a step kills its `docker run` client at once, which
# leaves the container running; this ends and removes it, by the name the step was given
# (AS_DOCKER_CONTAINER), at once: slurmstepd kills the epilog too when the step's KillWait is over.
if [[ -n ${AS_DOCKER_CONTAINER:-} ]]; then
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  # shellcheck source=runners/lib/common.sh
  source "$here/common.sh"
  # shellcheck source=runners/lib/container.sh
  source "$here/container.sh"
  as_remove_containers "$AS_DOCKER_CONTAINER"
fi
exit 0
