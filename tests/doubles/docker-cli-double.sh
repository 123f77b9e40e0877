#!/bin/sh
# A stand-in for the docker CLI, named as one: tests/unit/test_revision_module.py runs the gpufleet_revision
# module on this machine, where no dockerd runs. It answers the three calls the module makes, from files in
# $DOCKER_DOUBLE_DIR: `inspect --format {{.Image}} CONTAINER` (container-image), `image inspect ID` (images,
# one ID per line) and `tag ID NAME` (appended to tags). The real CLI is exercised on the lab hosts by
# tests/integration/test_e2e.py (upgrade, a broken image rolled back, gpufleet rollback).
state=${DOCKER_DOUBLE_DIR:?DOCKER_DOUBLE_DIR is not set}
case "$1 $2" in
  "inspect --format")
    cat "$state/container-image" 2>/dev/null || { echo "Error: No such object: $4" >&2; exit 1; } ;;
  "image inspect")
    grep -qx "$3" "$state/images" 2>/dev/null || { echo "Error: No such image: $3" >&2; exit 1; } ;;
  "tag "*)
    echo "$2 $3" >> "$state/tags" ;;
  *)
    echo "docker double: not a call gpufleet_revision makes: $*" >&2; exit 2 ;;
esac
