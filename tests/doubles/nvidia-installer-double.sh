#!/bin/sh
# TEST DOUBLE of NVIDIA's driver installer (NVIDIA-Linux-x86_64-<version>.run). The real one builds and loads
# a kernel module for a GPU, which cannot exist on the lab's hosts; the real path is run on the GPU machine
# (roles/nvidia_driver/README.md, Testing). This double:
#   - takes the driver version from its own file name, as the real .run embeds it;
#   - rejects options nvidia-installer does not know, and runs that would stop to ask questions;
#   - records every call in $STATE/calls.log (one line of arguments per call);
#   - writes, under $STATE only (nothing in /proc, /usr or /dev), what the real installer makes visible:
#     a module version file in /proc/driver/nvidia/version's format, an nvidia-smi that answers the two
#     queries the role asks, and an nvidia-persistenced that daemonises.
# The role reads these only when a test points nvidia_driver_detect_* and nvidia_driver_persistenced_path here.
set -eu
STATE=${GPUFLEET_DOUBLE_STATE:-/var/lib/gpufleet-test-double/nvidia-driver}
name=$(basename "$0")
version=${name#NVIDIA-Linux-x86_64-}
version=${version%.run}
case "$version" in
  [0-9]*.[0-9]*) ;;
  *) echo "ERROR: cannot tell the driver version from the file name '$name'" >&2; exit 1 ;;
esac

silent=no; ui_none=no; no_questions=no
for arg in "$@"; do
  case "$arg" in
    -s|--silent) silent=yes ;;
    --ui=none) ui_none=yes ;;
    --ui=*) ;;
    -q|--no-questions) no_questions=yes ;;
    -a|--accept-license|-Z|--disable-nouveau|--no-disable-nouveau|-z|--no-nouveau-check|--no-x-check) ;;
    --dkms|--no-dkms|--no-cc-version-check|--no-drm|--install-libglvnd|--no-opengl-files|--no-wine-files) ;;
    --no-kernel-module-source|--no-nvidia-modprobe|--no-distro-scripts|--skip-module-load|--no-check-for-alternate-installs) ;;
    --kernel-module-type=open|--kernel-module-type=proprietary|-M=open|-M=proprietary) ;;
    --log-file-name=?*|--tmpdir=?*|--kernel-source-path=?*|--kernel-name=?*|--module-signing-secret-key=?*|--module-signing-public-key=?*) ;;
    *) echo "ERROR: Unrecognized option: '$arg'; see '$name --advanced-options' for a list of options." >&2; exit 1 ;;
  esac
done
if [ "$silent" = no ] && { [ "$ui_none" = no ] || [ "$no_questions" = no ]; }; then
  echo "ERROR: without --silent (or --ui=none --no-questions) the installer would wait for answers" >&2
  exit 1
fi

case "$version" in
  525.*) cuda=12.0 ;; 530.*) cuda=12.1 ;; 535.*) cuda=12.2 ;; 545.*) cuda=12.3 ;; 550.*) cuda=12.4 ;;
  555.*) cuda=12.5 ;; 560.*) cuda=12.6 ;; 565.*) cuda=12.7 ;; 570.*) cuda=12.8 ;; 575.*) cuda=12.9 ;;
  580.*) cuda=13.0 ;; *) cuda=12.0 ;;
esac

mkdir -p "$STATE/bin"
printf '%s\n' "$*" >>"$STATE/calls.log"
printf 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  (gpufleet test double)\nGCC version:  none\n' \
  "$version" >"$STATE/proc-version"
cat >"$STATE/bin/nvidia-smi" <<SMI
#!/bin/sh
# nvidia-smi of the gpufleet TEST DOUBLE for driver $version (one fake GPU)
case "\${1:-}" in
  --query-gpu=driver_version) echo "$version" ;;
  "") printf '| NVIDIA-SMI %s      Driver Version: %s      CUDA Version: %s     |\n' "$version" "$version" "$cuda" ;;
  *) echo "test double: unsupported nvidia-smi arguments: \$*" >&2; exit 2 ;;
esac
SMI
cat >"$STATE/bin/nvidia-persistenced" <<'PERSIST'
#!/bin/sh
# nvidia-persistenced of the gpufleet TEST DOUBLE: daemonises like the real one, holds no GPU.
sleep infinity </dev/null >/dev/null 2>&1 &
exit 0
PERSIST
chmod 0755 "$STATE/bin/nvidia-smi" "$STATE/bin/nvidia-persistenced"
exit 0
