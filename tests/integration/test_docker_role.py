"""The docker role on a trixie lab host, with REAL Docker binaries from Debian repackaged as static tarballs.

One host, in this order: check mode on the fresh host and refused corrupted tarballs (each must leave the host
as it was), then an upgrade from bookworm's Docker 20.10 to trixie's 26.1 (restart, new version, images kept,
rerun predicted as changed=0 by check mode), then a packaged docker.io refused and, when allowed, removed.
The Molecule scenario (three bookworm hosts, testinfra) runs from test_molecule.py.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import RunningLab, lab_name, skip_unless_lab_possible
from docker_tarball import DockerTarball, build_tarball, write_bundle

from gpufleet.lab import Lab

# Upgrade 20.10 -> 26.1, packaged Docker, check mode and corrupted tarballs on hosts of their own (about 10
# minutes): `make test-all`. The docker Molecule scenario (converge, idempotence, docker load/run on 3
# hosts) runs in `make test`.
pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(1500)]

HOST = "node1"
PREPARE = "molecule/docker/prepare.yml"
CONVERGE = "molecule/docker/converge.yml"
IMAGE = "gpufleet-test/busybox:1"
# What the role may touch on a host; a refused or check-mode run must leave all of it exactly as it was.
WATCHED = " ".join(
    (
        "/usr/local/bin",
        "/opt",
        "/var/cache/gpufleet",
        "/etc/docker",
        "/etc/systemd/system",
        "/etc/modules-load.d",
        "/etc/sysctl.d",
    )
)
SNAPSHOT = f"find {WATCHED} -xdev -printf '%p %s %m %T@ %l\\n' 2>/dev/null | sort; getent group docker; true"


@dataclass(frozen=True)
class Run:
    """One ansible-playbook run: exit code, output, and the PLAY RECAP counters of the host."""

    returncode: int
    output: str

    @property
    def text(self) -> str:
        """The output with line breaks and indentation folded to single spaces (YAML wraps long messages)."""
        return " ".join(self.output.split())

    @property
    def recap(self) -> dict[str, int]:
        match = re.search(rf"^{HOST}\s+:\s+(.*)$", self.output, re.MULTILINE)
        assert match, self.output[-3000:]
        return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}


@dataclass
class DockerLab:
    running: RunningLab
    bundle: Path
    old: DockerTarball
    new: DockerTarball

    def ssh(self, command: str) -> str:
        result = self.running.ssh(HOST, command)
        assert result.returncode == 0, f"{command}: {result.stderr}"
        return result.stdout

    def snapshot(self) -> str:
        return self.ssh(SNAPSHOT)

    def converge(self, version: str, *args: str, **extra: object) -> Run:
        extra_vars = {"docker_test_bundle_dir": str(self.bundle), "docker_version": version, **extra}
        result = self.running.playbook(CONVERGE, "-e", json.dumps(extra_vars), *args)
        return Run(result.returncode, result.stdout)


@pytest.fixture(scope="module")
def docker_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerLab]:
    skip_unless_lab_possible()
    old, new = build_tarball("bookworm"), build_tarball("trixie")
    bundle = write_bundle([old, new], tmp_path_factory.mktemp("docker") / "bundle")
    handle = Lab(lab_name("docker"), nodes=1, suite="trixie", offline=True)
    try:
        running = RunningLab(handle, handle.up())
        prepared = running.playbook(PREPARE, "-e", json.dumps({"docker_test_bundle_dir": str(bundle)}))
        assert prepared.returncode == 0, prepared.stdout[-3000:]
        yield DockerLab(running, bundle, old, new)
    finally:
        handle.down()


def test_check_mode_on_a_fresh_host_reports_and_changes_nothing(docker_lab: DockerLab) -> None:
    before = docker_lab.snapshot()
    run = docker_lab.converge(docker_lab.old.version, "--check")
    assert run.returncode == 0, run.output[-3000:]
    assert run.recap["changed"] > 0
    assert "would unpack docker-20.10.24.tgz" in run.text
    assert docker_lab.snapshot() == before


@pytest.fixture
def corrupted_bundle(docker_lab: DockerLab, tmp_path: Path) -> Path:
    """The test bundle with one byte of the tarball flipped (same size, same lock entry)."""
    bundle = tmp_path / "bundle"
    (bundle / "docker").mkdir(parents=True)
    shutil.copy(docker_lab.bundle / "bundle.lock.yml", bundle / "bundle.lock.yml")
    data = bytearray(docker_lab.old.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bundle / "docker" / docker_lab.old.path.name).write_bytes(bytes(data))
    return bundle


def test_corrupted_tarball_in_the_bundle_is_refused_before_any_change(
    docker_lab: DockerLab, corrupted_bundle: Path
) -> None:
    before = docker_lab.snapshot()
    run = docker_lab.converge(docker_lab.old.version, docker_test_bundle_dir=str(corrupted_bundle))
    assert run.returncode != 0
    assert f"with sha256 {docker_lab.old.sha256}; found sha256" in run.text
    assert "Nothing was changed on the host" in run.text
    assert docker_lab.snapshot() == before


def test_wrong_pinned_sha256_is_refused_before_any_change(docker_lab: DockerLab) -> None:
    before = docker_lab.snapshot()
    run = docker_lab.converge(
        docker_lab.old.version,
        docker_archive_path=str(docker_lab.old.path),
        docker_archive_sha256="0" * 64,
    )
    assert run.returncode != 0
    assert f"with sha256 {'0' * 64}; found sha256 {docker_lab.old.sha256}" in run.text
    assert "Nothing was changed on the host" in run.text
    assert docker_lab.snapshot() == before


@dataclass(frozen=True)
class Upgrade:
    upgrade: Run
    check: Run
    pids_before: str
    pids_after: str
    snapshot_before_check: str
    snapshot_after_check: str


@pytest.fixture(scope="module")
def upgrade(docker_lab: DockerLab) -> Upgrade:
    """20.10 installed and running a container, then 26.1 over it, then a check-mode run (which must predict
    no change: the idempotence of the converged host; Molecule's idempotence step covers a real rerun)."""
    first = docker_lab.converge(docker_lab.old.version)
    assert first.returncode == 0, first.output[-3000:]
    docker_lab.ssh(
        f"docker load --input /root/gpufleet-test-busybox.tar && docker run --detach --name keeper "
        f"--restart always --pull never {IMAGE} sh -c 'while true; do sleep 1; done'"
    )
    pids = "systemctl show --property MainPID --value containerd.service docker.service"
    pids_before = docker_lab.ssh(pids)
    upgraded = docker_lab.converge(docker_lab.new.version)
    assert upgraded.returncode == 0, upgraded.output[-3000:]
    pids_after = docker_lab.ssh(pids)
    snapshot_before_check = docker_lab.snapshot()
    check = docker_lab.converge(docker_lab.new.version, "--check")
    snapshot_after_check = docker_lab.snapshot()
    return Upgrade(upgraded, check, pids_before, pids_after, snapshot_before_check, snapshot_after_check)


def test_upgrade_reports_the_new_version(docker_lab: DockerLab, upgrade: Upgrade) -> None:
    assert "installed Docker: 20.10.24; wanted: 26.1.5" in upgrade.upgrade.text
    server = docker_lab.ssh("docker version --format '{{.Server.Version}}'").strip()
    assert server.split("+")[0] == docker_lab.new.version
    assert docker_lab.ssh("/usr/local/bin/dockerd --version").startswith(
        f"Docker version {docker_lab.new.version}"
    )


def test_upgrade_restarts_containerd_and_docker(upgrade: Upgrade) -> None:
    assert upgrade.upgrade.recap["changed"] > 0
    before, after = upgrade.pids_before.split(), upgrade.pids_after.split()
    assert len(after) == 2
    assert all(old != new for old, new in zip(before, after, strict=True)), (before, after)


def test_upgrade_keeps_images_and_brings_containers_back(docker_lab: DockerLab, upgrade: Upgrade) -> None:
    assert IMAGE in docker_lab.ssh("docker image ls --format '{{.Repository}}:{{.Tag}}'")
    assert docker_lab.ssh("docker inspect --format '{{.State.Running}}' keeper").strip() == "true"


def test_check_mode_on_a_converged_host_changes_nothing(upgrade: Upgrade) -> None:
    assert upgrade.check.returncode == 0, upgrade.check.output[-3000:]
    assert upgrade.check.recap["changed"] == 0, upgrade.check.output[-3000:]
    assert upgrade.snapshot_after_check == upgrade.snapshot_before_check


def _fake_docker_io_deb() -> bytes:
    """TEST DOUBLE of Debian's docker.io: only its dpkg record (what the role looks for), no files."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pkg/DEBIAN").mkdir(parents=True)
        (Path(tmp) / "pkg/DEBIAN/control").write_text(
            "Package: docker.io\nVersion: 26.1.5+dfsg1-9\nArchitecture: amd64\n"
            "Maintainer: gpufleet tests <tests@gpufleet.invalid>\n"
            "Description: TEST DOUBLE of Debian's docker.io (gpufleet tests)\n"
            " Only a dpkg record, so the docker role sees a packaged Docker.\n"
        )
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "--build", f"{tmp}/pkg", f"{tmp}/d.deb"],
            check=True,
            capture_output=True,
        )
        return (Path(tmp) / "d.deb").read_bytes()


@pytest.fixture(scope="module")
def packaged_docker(docker_lab: DockerLab, upgrade: Upgrade) -> DockerLab:
    encoded = base64.b64encode(_fake_docker_io_deb()).decode()
    docker_lab.ssh(f"echo {encoded} | base64 -d > /tmp/docker.io.deb && dpkg -i /tmp/docker.io.deb")
    return docker_lab


def test_packaged_docker_is_refused_with_the_fix(packaged_docker: DockerLab) -> None:
    before = packaged_docker.snapshot()
    run = packaged_docker.converge(packaged_docker.new.version)
    assert run.returncode != 0
    assert "found the distribution package(s) docker.io" in run.text
    assert "docker_remove_packaged: true" in run.text
    assert packaged_docker.snapshot() == before


def test_packaged_docker_is_removed_when_allowed(packaged_docker: DockerLab) -> None:
    run = packaged_docker.converge(packaged_docker.new.version, docker_remove_packaged=True)
    assert run.returncode == 0, run.output[-3000:]
    assert packaged_docker.running.ssh(HOST, "dpkg -s docker.io").returncode != 0
    assert packaged_docker.ssh("docker info --format '{{.ServerVersion}}'").startswith(
        packaged_docker.new.version
    )
