"""A real dockerd runs in every host (of a lab of its own) and starts containers from a loaded tarball.

Debian's docker.io is installed from .debs fetched on the control node (exactly the packages the host's
apt asks for, from the Debian mirror only) and copied over SSH, so this works on an offline lab; the
image is a `docker save` archive built without a registry (busybox_image.py). No pull ever happens.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from busybox_image import IMAGE_REF, build_busybox_image
from conftest import RunningLab, lab_name, skip_unless_lab_possible

from gpufleet.lab import Lab
from gpufleet.lab.system import cache_dir, file_lock

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(600)]

HOSTS = ("node1", "node2", "node3")
# One line of `apt-get install --print-uris`: 'URL' FILE SIZE MD5Sum:HEX
URI = re.compile(r"^'(?P<url>http://deb\.debian\.org/\S+)' (?P<file>\S+) \d+ MD5Sum:(?P<md5>[0-9a-f]{32})$")
REMOTE = "/var/cache/gpufleet-test"

INSTALL_PLAYBOOK = """\
- name: Install Debian's docker.io from copied packages and load the test image
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Copy the packages and the image archive
      ansible.builtin.copy:
        src: "{{ item }}"
        dest: "%(remote)s/"
        mode: "0644"
      loop: "{{ gpufleet_test_files }}"
    - name: Install docker.io from the copied packages (no repository, works offline)
      ansible.builtin.command:
        argv: "{{ ['apt-get', 'install', '-y', '-q', '--no-install-recommends'] + gpufleet_test_debs }}"
        creates: /usr/sbin/dockerd
      environment:
        DEBIAN_FRONTEND: noninteractive
    - name: Start docker
      ansible.builtin.systemd_service:
        name: docker.service
        state: started
    - name: Load the image archive
      ansible.builtin.command:
        argv: [docker, load, --input, "%(remote)s/image.tar"]
      changed_when: true
"""


def _fetch(url: str, dest: Path, md5: str) -> None:
    """Download one package from the Debian mirror into the cache unless a good copy is there."""
    if dest.exists() and hashlib.md5(dest.read_bytes()).hexdigest() == md5:  # apt's own checksum
        return
    partial = dest.with_suffix(".partial")
    with urllib.request.urlopen(url, timeout=120) as response, partial.open("wb") as out:
        shutil.copyfileobj(response, out)
    assert hashlib.md5(partial.read_bytes()).hexdigest() == md5, f"{url}: checksum mismatch"
    partial.rename(dest)


def docker_debs(lab: RunningLab) -> list[Path]:
    """The .debs docker.io needs on these hosts, as the host's own apt resolves them, cached locally."""
    answer = lab.ssh("node1", "apt-get install --print-uris -qq --no-install-recommends docker.io")
    entries = [match for line in answer.stdout.splitlines() if (match := URI.match(line))]
    assert entries, f"apt on node1 named no packages for docker.io: {answer.stdout} {answer.stderr}"
    folder = cache_dir() / "test-debs" / lab.lab.state().suite
    folder.mkdir(parents=True, exist_ok=True)
    with file_lock(folder / ".lock"):
        for entry in entries:
            _fetch(entry["url"], folder / entry["file"], entry["md5"])
    return [folder / entry["file"] for entry in entries]


@pytest.fixture(scope="module")
def docker_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningLab]:
    """A lab of its own (the session lab's hosts must stay docker-free for the docker role's tests)."""
    skip_unless_lab_possible()
    handle = Lab(lab_name("docker"), nodes=len(HOSTS), offline=True)
    try:
        lab = RunningLab(handle, handle.up())
        _install_docker(lab, tmp_path_factory.mktemp("docker"))
        yield lab
    finally:
        handle.down()


def _install_docker(lab: RunningLab, staging: Path) -> None:
    debs = docker_debs(lab)
    shutil.copy(build_busybox_image(lab.lab.state().suite), staging / "image.tar")
    playbook = staging / "install_docker.yml"
    playbook.write_text(INSTALL_PLAYBOOK % {"remote": REMOTE})
    extra = {
        "gpufleet_test_files": [str(path) for path in (*debs, staging / "image.tar")],
        "gpufleet_test_debs": [f"{REMOTE}/{deb.name}" for deb in debs],
    }
    result = lab.playbook(playbook, "--extra-vars", json.dumps(extra))
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("host", HOSTS)
def test_dockerd_stores_images_on_overlay2(docker_hosts: RunningLab, host: str) -> None:
    driver = docker_hosts.ssh(host, "docker info --format '{{.Driver}}'")
    assert driver.stdout.strip() == "overlay2", driver.stderr


@pytest.mark.parametrize("host", HOSTS)
def test_container_runs_from_the_loaded_image(docker_hosts: RunningLab, host: str) -> None:
    result = docker_hosts.ssh(host, f"docker run --rm --pull never {IMAGE_REF} echo hello from {host}")
    assert result.stdout.strip() == f"hello from {host}", result.stderr
