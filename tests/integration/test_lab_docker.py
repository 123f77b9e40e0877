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

from gpufleet.lab.upgrade import BROKEN_MESSAGE, BROKEN_SUFFIX, UPGRADE_SUFFIX, image_id, make_images

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


def test_the_upgrade_images_load_on_every_host_with_the_same_ids(docker_hosts: RunningLab) -> None:
    """gpufleet.lab.upgrade's images (the e2e module's upgrade and rollback use them on the serving image),
    made here of the busybox image: one small archive written on the control node, loaded on every host
    (make_images checks each host's IDs against the ones the archive names)."""
    ids = make_images(docker_hosts.lab, IMAGE_REF)
    assert len(set(ids.values())) == 3, ids
    assert ids[IMAGE_REF] == image_id(docker_hosts.lab, "node1", IMAGE_REF)
    broken = f"docker run --rm --pull never --entrypoint /opt/vllm/bin/vllm {IMAGE_REF}{BROKEN_SUFFIX} serve"
    ran = docker_hosts.ssh("node2", broken)
    assert ran.returncode == 1 and ran.stderr.strip() == BROKEN_MESSAGE, (ran.returncode, ran.stderr)
    label = '{{index .Config.Labels "org.gpufleet.lab.upgrade"}}'
    upgraded = docker_hosts.ssh(
        "node3", ["docker", "image", "inspect", "--format", label, IMAGE_REF + UPGRADE_SUFFIX]
    )
    assert upgraded.stdout.strip() == "2", upgraded.stderr
    same = docker_hosts.ssh(
        "node3", f"docker run --rm --pull never {IMAGE_REF}{UPGRADE_SUFFIX} echo upgraded"
    )
    assert same.stdout.strip() == "upgraded", same.stderr
