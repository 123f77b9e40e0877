"""A real dockerd runs in every host of the session lab and starts containers from a loaded tarball.

Debian's docker.io is installed from .debs downloaded on the control node (what a fresh host's apt resolves,
from the Debian mirror only, cached) and copied over SSH, so this works on an offline lab; the image is a
`docker save` archive built without a registry (busybox_image.py). No pull ever happens. The install is the
one test_image_distribution.py makes (:func:`test_image_distribution.install_docker`): on a lab that module
already equipped, nothing is installed twice.
"""

from __future__ import annotations

import subprocess

import pytest
from busybox_image import IMAGE_REF, build_busybox_image
from conftest import RunningLab
from test_image_distribution import install_docker

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(600)]

HOSTS = ("node1", "node2", "node3")


@pytest.fixture(scope="module")
def docker_hosts(lab: RunningLab) -> RunningLab:
    """The session lab with docker.io on every host and the busybox archive loaded into each dockerd."""
    assert lab.hosts == list(HOSTS), lab.hosts
    install_docker(lab)
    archive = build_busybox_image(lab.lab.state().suite).read_bytes()
    for host in lab.hosts:
        argv = [*lab.lab.ssh_argv(host), "docker load"]
        loaded = subprocess.run(argv, input=archive, capture_output=True, timeout=120, check=False)
        assert loaded.returncode == 0, (host, loaded.stderr.decode())
    return lab


@pytest.mark.parametrize("host", HOSTS)
def test_dockerd_stores_images_on_overlay2(docker_hosts: RunningLab, host: str) -> None:
    driver = docker_hosts.ssh(host, "docker info --format '{{.Driver}}'")
    assert driver.stdout.strip() == "overlay2", driver.stderr


@pytest.mark.parametrize("host", HOSTS)
def test_container_runs_from_the_loaded_image(docker_hosts: RunningLab, host: str) -> None:
    result = docker_hosts.ssh(host, f"docker run --rm --pull never {IMAGE_REF} echo hello from {host}")
    assert result.stdout.strip() == f"hello from {host}", result.stderr
