#!/bin/sh
# A stand-in for systemctl, named as one: tests/unit/test_module_utils.py reads a unit's properties through
# plugins/module_utils/gpufleet_units.py on this machine, where systemd is not PID 1 (systemctl answers
# nothing). It writes its arguments to $SYSTEMCTL_DOUBLE_DIR/argv, one a line, and answers `show` with
# $SYSTEMCTL_DOUBLE_DIR/show. Real systemd answers on the lab hosts: the vllm_service role's health gate
# (gpufleet_vllm_wait) in tests/integration/test_e2e.py.
state=${SYSTEMCTL_DOUBLE_DIR:?SYSTEMCTL_DOUBLE_DIR is not set}
printf '%s\n' "$@" > "$state/argv"
[ "$1" = show ] || { echo "systemctl double: not a call gpufleet_units makes: $*" >&2; exit 2; }
cat "$state/show"
