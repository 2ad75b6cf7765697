#!/usr/bin/env bash
# Task epilog of an engine instance's job step under docker (srun --task-epilog): slurmstepd runs it on
# the node once the step's task is gone. Stopping a step kills its `docker run` client at once, which
# leaves the container running; this removes it, by the name the step was given (AS_DOCKER_CONTAINER).
if [[ -n ${AS_DOCKER_CONTAINER:-} ]]; then
  docker rm --force "$AS_DOCKER_CONTAINER" >/dev/null 2>&1 || true
fi
exit 0
