"""Images for upgrade and rollback on the lab: a second tag of the serving image, and one that exits at start.

Both are built on the head from the lab's serving image (``docker build``, offline: the base is local) and
reach the other hosts as a tarball of their small parts only: ``docker save`` of the new images less every
member of 64 MiB or more (the base image's layers). ``docker load`` takes a layer it already has from its
own store, so every host ends with the same image IDs after moving kilobytes instead of 2.8 GB each.
Used by tests/integration/test_e2e.py and benchmarks/upgrade.py.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Mapping, Sequence

from gpufleet.lab.core import Lab

UPGRADE_SUFFIX = "-2"  # a second tag: the same program, another image ID (a label differs)
BROKEN_SUFFIX = (
    "-broken"  # vLLM exits at start: what an image built for a newer driver looks like to gpufleet
)
BROKEN_MESSAGE = "gpufleet lab: this image exits at start"
ARCHIVE = "/var/tmp/gpufleet-upgrade-images.tar"

_SMALL_PARTS = (
    "import sys, tarfile\n"
    "src = tarfile.open(fileobj=sys.stdin.buffer, mode='r|')\n"
    f"with tarfile.open({ARCHIVE!r}, 'w') as out:\n"
    "    for member in src:\n"
    "        if member.size < 64 << 20:\n"
    "            out.addfile(member, src.extractfile(member) if member.isfile() else None)\n"
)


def dockerfiles(base: str) -> dict[str, list[str]]:
    """The two images made from ``base``: tag -> Dockerfile lines."""
    vllm = "/opt/vllm/bin/vllm"
    script = f"echo '#!/bin/sh' > {vllm} && echo 'echo {BROKEN_MESSAGE} >&2; exit 1' >> {vllm}"
    return {
        base + UPGRADE_SUFFIX: [f"FROM {base}", "LABEL org.gpufleet.lab.upgrade=2"],
        base + BROKEN_SUFFIX: [f"FROM {base}", f"RUN {script}"],
    }


def build_script(images: Mapping[str, Sequence[str]]) -> str:
    """The shell script the head runs: build each image, save the new parts to :data:`ARCHIVE`."""
    lines = ["set -e", "d=$(mktemp -d -p /var/tmp)"]
    for number, (tag, dockerfile) in enumerate(images.items()):
        lines.append(f"printf '%s\\n' {shlex.join(dockerfile)} > \"$d/{number}\"")
        lines.append(
            f'DOCKER_BUILDKIT=0 docker build -q -f "$d/{number}" -t {shlex.quote(tag)} "$d" >/dev/null'
        )
    lines.append('rm -rf "$d"')
    lines.append(f"docker save {shlex.join(images)} | python3 -c {shlex.quote(_SMALL_PARTS)}")
    return "\n".join(lines)


def image_id(lab: Lab, host: str, image: str) -> str:
    return lab.ssh(host, ["docker", "image", "inspect", "--format", "{{.Id}}", image]).stdout.strip()


def make_images(lab: Lab, base: str) -> dict[str, str]:
    """Build the upgrade and broken images on the head, load them on every other host: tag -> image ID
    (``base`` included), the same on every host. RuntimeError says which host failed and why."""
    hosts = [host.hostname for host in lab.state().hosts]
    head, others = hosts[0], hosts[1:]
    images = dockerfiles(base)
    made = lab.ssh(head, ["bash", "-c", build_script(images)], timeout=900)
    if made.returncode != 0:
        raise RuntimeError(f"{head}: building {', '.join(images)} failed: {made.stdout}{made.stderr}")
    for host in others:
        sender = subprocess.Popen([*lab.ssh_argv(head), f"cat {ARCHIVE}"], stdout=subprocess.PIPE)
        loaded = subprocess.run(
            [*lab.ssh_argv(host), "docker load"], stdin=sender.stdout, capture_output=True, text=True,
            timeout=600, check=False,
        )  # fmt: skip
        sender.wait(timeout=60)
        if loaded.returncode != 0 or sender.returncode != 0:
            raise RuntimeError(f"{host}: docker load of {ARCHIVE} from {head} failed: {loaded.stderr}")
    lab.ssh(head, ["rm", "-f", ARCHIVE])
    ids = {tag: image_id(lab, head, tag) for tag in (base, *images)}
    for host in others:
        theirs = {tag: image_id(lab, host, tag) for tag in ids}
        if theirs != ids:
            raise RuntimeError(f"{host}: image IDs {theirs} differ from the head's {ids}")
    return ids
