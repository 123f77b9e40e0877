#!/bin/sh
# A stand-in for the docker CLI, named as one: tests/unit/test_bundle_relay.py runs the relay's --load sink on
# this machine, where no dockerd runs. Copied into a folder of its own per receiver, it keeps its state there:
# `load` stores stdin in loaded.tar and says what a real docker load says; `rmi REF` appends REF to removed;
# `info --format {{.DockerRootDir}}` names that folder as dockerd's data root.
# With a file `fail` in that folder, `load` reads 64 KiB, then fails as dockerd does on a full disk; with a file
# `slow`, it takes that many seconds after the last byte (as dockerd unpacking); with `broken` it then fails. The real
# docker load is exercised on the lab hosts (tests/integration/test_e2e.py, test_image_distribution.py).
state=$(dirname "$0")
case "$1" in
  load)
    if [ -f "$state/fail" ]; then
      head -c 65536 > /dev/null
      echo "Error processing tar file(exit status 1): write /var/lib/docker/tmp/x: no space left on device"
      exit 1
    fi
    cat > "$state/loaded.tar"
    [ -f "$state/slow" ] && sleep "$(cat "$state/slow")"
    if [ -f "$state/broken" ]; then echo "Error processing tar file(exit status 1): unexpected EOF"; exit 1; fi
    echo "Loaded image: lab/img:1" ;;
  rmi)
    echo "$2" >> "$state/removed" ;;
  info)
    [ "$2 $3" = "--format {{.DockerRootDir}}" ] || { echo "docker double: info $*" >&2; exit 2; }
    echo "$state" ;;
  *)
    echo "docker double: not a call the relay makes: $*" >&2; exit 2 ;;
esac
