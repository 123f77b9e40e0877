"""image_distribution on three real lab hosts with real dockerd (Debian's docker.io, installed from .debs
because the session lab is offline): plain, gzip and zstd docker-archives sent once into the cluster and
chained between nodes, verified by sha256 before docker load and by image ID after; the default (auto)
lets the control node head the chain; with the relay port firewalled from the control node auto falls
back to fanout; idempotence; a corrupted archive refused before anything is copied; the direct strategy."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import RunningLab
from test_model_fetch import changed_counts, install_debs, said, task_results

from gpufleet.bundle import build, sha256_file
from gpufleet.bundle.images import tar_layer, write_docker_archive

pytestmark = [pytest.mark.lab, pytest.mark.slow]
COMPRESSIONS = ("none", "gzip", "zstd")


def install_docker(lab: RunningLab) -> None:
    """Debian's docker.io (and zstd) on every host of the lab, unless a module before this one installed them
    on these very hosts (the session lab is reset only by the modules that deploy)."""
    probe = "test -x /usr/sbin/dockerd && command -v zstd"
    if not all(lab.ssh(host, probe).returncode == 0 for host in lab.hosts):
        install_debs(lab, {"docker.io": "", "zstd": ""})


@pytest.fixture(scope="module")
def docker_on_hosts(lab: RunningLab) -> None:
    install_docker(lab)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle of three small images, one per compression, each a distinct image ID."""
    work = tmp_path_factory.mktemp("images")
    images = []
    for compression in COMPRESSIONS:
        archive = work / f"{compression}.tar"
        layer = tar_layer({f"data/{compression}.bin": compression.encode() * 65536})  # distinct per image
        write_docker_archive(archive, f"gpufleet/test-{compression}:1", [layer], ["sh"])
        images.append(
            {
                "name": f"gpufleet/test-{compression}",
                "tag": "1",
                "compression": compression,
                "source": {"kind": "docker-archive", "path": str(archive), "sha256": sha256_file(archive)},
            }
        )
    manifest = work / "manifest.yml"
    manifest.write_text(yaml.safe_dump({"schema_version": 1, "name": "images", "images": images}))
    build(manifest, work / "bundle")
    return work / "bundle"


def run_role(
    lab: RunningLab, tmp: Path, bundle: Path, *extra: str, relay_all: bool = True
) -> subprocess.CompletedProcess[str]:
    """The role on every lab host. The test archives are small: relay_all relays them all the same
    (image_distribution_chain_min_bytes=0), since the relay is what most of these tests are about."""
    playbook = tmp / "image_distribution.yml"
    playbook.write_text(
        "- hosts: gpu_nodes\n  gather_facts: false\n  roles:\n    - role: image_distribution\n"
    )
    relay = ("-e", "image_distribution_chain_min_bytes=0") if relay_all else ()
    return lab.playbook(playbook, "-e", f"gpufleet_bundle_dir={bundle}", *relay, *extra)


def image_ids(lab: RunningLab, host: str) -> set[str]:
    out = lab.ssh(host, "docker image ls --no-trunc --format '{{.Repository}} {{.ID}}'").stdout
    return {line.split()[1] for line in out.splitlines() if line.startswith("gpufleet/test-")}


@pytest.fixture(scope="module")
def first_run(
    lab: RunningLab, docker_on_hosts: None, bundle: Path, tmp_path_factory: pytest.TempPathFactory
) -> subprocess.CompletedProcess[str]:
    return run_role(lab, tmp_path_factory.mktemp("pb"), bundle)


def test_every_host_gets_every_image_with_its_id(
    lab: RunningLab, first_run: subprocess.CompletedProcess[str], bundle: Path
) -> None:
    assert first_run.returncode == 0, first_run.stdout[-4000:]
    expected = {image["id"] for image in yaml.safe_load((bundle / "bundle.lock.yml").read_text())["images"]}
    for host in lab.hosts:
        assert image_ids(lab, host) == expected, host
        assert lab.ssh(host, "ls -A /var/tmp/gpufleet-images").stdout.strip() == "", (
            "staged archives left behind"
        )
        # every receiver of the chain has exited (pgrep's own line excluded by the [.])
        left = lab.ssh(host, "pgrep --full --list-full 'gpufleet_relay[.]py' || true").stdout.strip()
        assert left == "", (host, left)


def test_auto_lets_the_control_node_head_the_chain(
    lab: RunningLab, first_run: subprocess.CompletedProcess[str]
) -> None:
    """The lab's control node reaches the nodes' cluster network: every node, the seed too, is a receiver of
    a chain the control node sends into, three times (one per image); nothing is copied over SSH."""
    assert first_run.returncode == 0
    ip = lab.inventory.hosts[0].ip
    reported = f"image_distribution strategy: chain (auto: the control node reached node1 at {ip}:18432)"
    assert said(first_run.stdout, reported), first_run.stdout[-3000:]
    receivers = task_results(first_run.stdout, "Start a receiver on each node of the chain")
    assert receivers == {host: ["changed"] * len(COMPRESSIONS) for host in lab.hosts}, receivers
    senders = task_results(first_run.stdout, "Send from the control node into the head of the chain")
    assert senders == {"node1 -> localhost": ["ok"] * len(COMPRESSIONS)}, senders
    assert "Copy the archive from the control node" not in first_run.stdout


def test_second_run_changes_nothing(
    lab: RunningLab, first_run: subprocess.CompletedProcess[str], bundle: Path, tmp_path: Path
) -> None:
    second = run_role(lab, tmp_path, bundle)
    assert second.returncode == 0, second.stdout[-3000:]
    assert set(changed_counts(second.stdout).values()) == {0}, second.stdout[-3000:]
    # every task, not the fast path's one check: the report names no strategy, since none runs
    every_task = run_role(lab, tmp_path, bundle, "-e", "gpufleet_fast_rerun=false")
    assert every_task.returncode == 0, every_task.stdout[-3000:]
    assert set(changed_counts(every_task.stdout).values()) == {0}, every_task.stdout[-3000:]
    reported = "image_distribution strategy: none (auto; every node has every image, nothing to send)"
    assert said(every_task.stdout, reported), every_task.stdout[-3000:]


def test_corrupted_archive_is_refused_before_anything_is_copied(
    lab: RunningLab, first_run: subprocess.CompletedProcess[str], bundle: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "bundle"
    shutil.copytree(bundle, broken)
    archive = broken / "images/gpufleet-test-none_1.tar"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x01
    archive.write_bytes(bytes(data))
    lab.ssh("node2", "docker image rm gpufleet/test-none:1")
    result = run_role(lab, tmp_path, broken)
    assert result.returncode != 0
    assert "gpufleet-test-none_1.tar: expected sha256" in result.stdout, result.stdout[-3000:]
    assert "Nothing was copied or loaded" in result.stdout
    assert "gpufleet/test-none" not in lab.ssh("node2", "docker image ls").stdout


def test_check_mode_on_a_node_missing_an_image_reports_it_and_loads_nothing(
    lab: RunningLab, first_run: subprocess.CompletedProcess[str], bundle: Path, tmp_path: Path
) -> None:
    """Check mode (`gpufleet deploy --check`, and Molecule's check step on fresh hosts, `make test-all`) on a
    node that lacks an image: the run succeeds and reports node3 changed, and nothing is copied or loaded."""
    lab.ssh("node3", "docker image rm gpufleet/test-zstd:1")
    result = run_role(lab, tmp_path, bundle, "--check")
    assert result.returncode == 0, result.stdout[-3000:]
    # node1 has every image; node2 may lack the one the corrupted-archive test above refused to load
    assert changed_counts(result.stdout)["node3"] == 1, result.stdout[-3000:]
    assert changed_counts(result.stdout)["node1"] == 0, result.stdout[-3000:]
    assert said(result.stdout, "node3: would load gpufleet/test-zstd:1"), result.stdout[-3000:]
    assert len(image_ids(lab, "node3")) == len(COMPRESSIONS) - 1
    assert lab.ssh("node3", "ls -A /var/tmp/gpufleet-images 2>/dev/null").stdout.strip() == ""


def test_direct_strategy_also_loads_missing_images(
    lab: RunningLab, first_run: subprocess.CompletedProcess[str], bundle: Path, tmp_path: Path
) -> None:
    lab.ssh("node3", "docker image rm gpufleet/test-zstd:1 gpufleet/test-none:1")
    result = run_role(lab, tmp_path, bundle, "-e", "image_distribution_strategy=direct")
    assert result.returncode == 0, result.stdout[-3000:]
    assert len(image_ids(lab, "node3")) == len(COMPRESSIONS)
    assert changed_counts(result.stdout)["node1"] == 0


def test_archives_too_small_to_relay_are_copied_over_ssh_without_a_relay_round(
    lab: RunningLab, first_run: subprocess.CompletedProcess[str], bundle: Path, tmp_path: Path
) -> None:
    """With the default image_distribution_chain_min_bytes (32 MiB) the test's small archives are copied to
    the nodes that lack them, as direct does: no receiver starts and nothing is probed (a relay round costs
    about 25 tasks whatever the size). Only the nodes that lack an image get it, checked by ID."""
    lab.ssh("node2", "docker image rm gpufleet/test-gzip:1 gpufleet/test-none:1")
    lab.ssh("node3", "docker image rm gpufleet/test-zstd:1")
    result = run_role(lab, tmp_path, bundle, relay_all=False)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "Start a receiver on each node of the chain" not in result.stdout
    assert "Listen once on the probed node's relay port" not in result.stdout
    # the report names no strategy that did not run (it said "fanout (... nothing to send)" before)
    reported = (
        "image_distribution strategy: none (auto; no node lacks an image to relay: 3 images under 32 MiB "
        "go by SSH copy to the nodes that lack them)"
    )
    assert said(result.stdout, reported), result.stdout[-3000:]
    copies = task_results(result.stdout, "Copy the archive from the control node to this node")
    assert {host: copies.get(host, []).count("changed") for host in lab.hosts} == {
        "node1": 0,
        "node2": 2,
        "node3": 1,
    }, copies
    expected = {image["id"] for image in yaml.safe_load((bundle / "bundle.lock.yml").read_text())["images"]}
    for host in lab.hosts:
        assert image_ids(lab, host) == expected, host
        assert lab.ssh(host, "ls -A /var/tmp/gpufleet-images").stdout.strip() == ""


@pytest.fixture
def relay_port_blocked_from_control_node(lab: RunningLab) -> Iterator[None]:
    """A real firewall rule on node1 (the seed): drop TCP 18432 from the control node only."""
    netns = lab.lab.state().hosts[0].netns
    rule = ["INPUT", "-p", "tcp", "-s", lab.inventory.bridge_ip, "--dport", "18432", "-j", "DROP"]
    subprocess.run(["ip", "netns", "exec", netns, "iptables", "-I", *rule], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "netns", "exec", netns, "iptables", "-D", *rule], check=True)


def test_auto_falls_back_to_fanout_when_the_control_node_cannot_reach_the_relay_port(
    lab: RunningLab,
    first_run: subprocess.CompletedProcess[str],
    bundle: Path,
    tmp_path: Path,
    relay_port_blocked_from_control_node: None,
) -> None:
    """sshd on node1 still answers the control node, only the relay port is dropped: the probe of that port
    fails, so the archive goes to the seed over SSH and the seed heads the chain to node2."""
    lab.ssh("node2", "docker image rm gpufleet/test-gzip:1")
    result = run_role(lab, tmp_path, bundle)
    assert result.returncode == 0, result.stdout[-3000:]
    reported = "image_distribution strategy: fanout (auto: the control node could not reach node1"
    assert said(result.stdout, reported), result.stdout[-3000:]
    copies = task_results(result.stdout, "Copy the archive from the control node to the seed, once")
    assert copies["node1"].count("changed") == 1, copies
    assert "node2" not in copies or "changed" not in copies["node2"], copies
    assert task_results(result.stdout, "Start a receiver on each node of the chain") == {"node2": ["changed"]}
    assert len(image_ids(lab, "node2")) == len(COMPRESSIONS)
