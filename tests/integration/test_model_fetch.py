"""model_fetch on three real lab hosts: a ModelScope-like git-lfs remote over HTTP on the lab bridge,
fetched once and chained to the other nodes; idempotence, repair, a corrupt remote object, a resumed fetch,
and the offline path from a bundle.

The session lab is offline: hosts reach only each other and this machine. git and git-lfs, which the
online path needs on the seed, are installed from Debian .debs downloaded here (what the hosts lack).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from conftest import REPO, RunningLab, ansible_env

from gpufleet.bundle import build, sha256_file
from gpufleet.bundle.debian import Apt
from gpufleet.bundle.fetch import BuildContext
from gpufleet.bundle.lfs import LfsServer, lfs_object_path, make_lfs_repo
from gpufleet.lab.tiny_model import write_tiny_model

pytestmark = [pytest.mark.lab, pytest.mark.slow]
REPO_ID = "gpufleet/tiny-qwen2"
MODEL_DIR = "/opt/models/tiny-qwen2"
CACHE = Path.home() / ".cache" / "gpufleet" / "host-debs"
# Test setup, not the product: --force-unsafe-io skips dpkg's fsync of every unpacked file (a lab host is
# thrown away, not crashed; issue 33).
INSTALL_DEBS = (
    "rm -rf /tmp/debs && mkdir /tmp/debs && tar -C /tmp/debs -x && DEBIAN_FRONTEND=noninteractive "
    "dpkg --force-unsafe-io -i /tmp/debs/*.deb >/tmp/debs.log 2>&1 || { tail -20 /tmp/debs.log; exit 1; }"
)
MARKER = f"{MODEL_DIR}/.gpufleet-model.json"


def install_debs(lab: RunningLab, packages: dict[str, str], cache: Path = CACHE) -> None:
    """Install Debian packages on every lab host from .debs downloaded here (the hosts are offline)."""
    debs = cache / "-".join(sorted(packages))  # molecule/image_distribution/prepare.yml reads docker.io-zstd
    if not any(debs.glob("*.deb")):  # downloaded aside, then renamed: a reader never sees half a set
        cache.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(dir=cache, prefix=".download-"))
        status = fresh / "status"
        status.write_text(lab.ssh(lab.hosts[0], "cat /var/lib/dpkg/status", timeout=30).stdout)
        ctx = BuildContext(out=fresh, manifest_dir=fresh)
        Apt(ctx, "http://deb.debian.org/debian", "bookworm", ["main"], status=status).download(
            packages, fresh / "debs", with_dependencies=True
        )
        with contextlib.suppress(OSError):  # another worker's set got there first
            (fresh / "debs").rename(debs)
        shutil.rmtree(fresh, ignore_errors=True)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for deb in sorted(debs.glob("*.deb")):
            tar.add(deb, arcname=deb.name)

    def install(name: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [*lab.lab.ssh_argv(name), INSTALL_DEBS],
            input=archive.getvalue(),
            capture_output=True,
            timeout=600,
            check=False,
        )

    with ThreadPoolExecutor(max_workers=len(lab.hosts)) as pool:  # every host at once, as the roles would
        for name, result in zip(lab.hosts, pool.map(install, lab.hosts), strict=True):
            assert result.returncode == 0, (name, result.stdout.decode() + result.stderr.decode())


@pytest.fixture(scope="module")
def remote_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("lfs-remote")
    model = write_tiny_model(root.parent / "tiny-model")
    _bare, commit = make_lfs_repo(model, root, REPO_ID)
    return root, commit


@pytest.fixture(scope="module")
def server(lab: RunningLab, remote_root: tuple[Path, str]) -> Iterator[LfsServer]:
    with LfsServer(remote_root[0], host=lab.inventory.bridge_ip) as running:
        yield running


@pytest.fixture(scope="module")
def git_on_hosts(lab: RunningLab) -> None:
    install_debs(lab, {"git": "", "git-lfs": ""})


def run_role(
    lab: RunningLab, tmp: Path, *extra: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    playbook = tmp / "model_fetch.yml"
    playbook.write_text(
        "- hosts: gpu_nodes\n  gather_facts: false\n  roles:\n    - role: model_fetch\n", encoding="utf-8"
    )
    return lab.playbook(playbook, "-e", f"gpufleet_model_repo={REPO_ID}", *extra, timeout=timeout)


def online_vars(server: LfsServer, model_dir: str = MODEL_DIR, repo: str = REPO_ID) -> list[str]:
    return ["-e", f"gpufleet_model_dir={model_dir}", "-e", f"model_fetch_url={server.url}/{repo}.git"]


def changed_counts(stdout: str) -> dict[str, int]:
    counts = {}
    for line in stdout.splitlines():
        if ": ok=" in line and "changed=" in line:
            host = line.split()[0]
            counts[host] = int(line.split("changed=")[1].split()[0])
    return counts


def task_results(stdout: str, task: str) -> dict[str, list[str]]:
    """Per host (as Ansible names it, e.g. "node1 -> localhost"), the statuses of every run of a task."""
    results: dict[str, list[str]] = {}
    inside = False
    for line in stdout.splitlines():
        if line.startswith(("TASK [", "PLAY RECAP", "PLAY [")):
            inside = line.startswith("TASK [") and (f" : {task}" in line or f"[{task}" in line)
        elif inside and line.split(":", 1)[0] in ("ok", "changed", "failed", "fatal", "skipping"):
            status, rest = line.split(": [", 1)
            host = rest.split("]", 1)[0]
            results.setdefault(host, []).append(status)
    return {host: statuses for host, statuses in results.items() if set(statuses) != {"skipping"}}


def said(stdout: str, text: str) -> bool:
    """Whether Ansible printed ``text``, however its YAML output wrapped the line."""
    return " ".join(text.split()) in " ".join(stdout.split())


def lfs_object_requests(server: LfsServer) -> list[str]:
    return [
        path for method, path, _ in server.log.requests if method == "GET" and "/info/lfs/objects/" in path
    ]


@pytest.fixture(scope="module")
def first_run(
    lab: RunningLab, server: LfsServer, git_on_hosts: None, tmp_path_factory: pytest.TempPathFactory
) -> subprocess.CompletedProcess[str]:
    server.log.requests.clear()
    return run_role(lab, tmp_path_factory.mktemp("pb"), *online_vars(server))


def test_model_reaches_every_host_intact(
    lab: RunningLab, first_run: subprocess.CompletedProcess[str], remote_root: tuple[Path, str]
) -> None:
    assert first_run.returncode == 0, first_run.stdout[-4000:]
    expected = sha256_file(remote_root[0].parent / "tiny-model" / "model.safetensors")
    for host in lab.hosts:
        out = lab.ssh(host, f"sha256sum {MODEL_DIR}/model.safetensors; cat {MARKER}").stdout
        assert out.startswith(expected), (host, out)
        marker = json.loads(out.split("\n", 1)[1])
        assert (
            marker["revision"] == remote_root[1]
            and marker["files"]["model.safetensors"]["sha256"] == expected
        )


def test_online_auto_is_fanout(first_run: subprocess.CompletedProcess[str]) -> None:
    assert said(first_run.stdout, "model_fetch strategy: fanout (auto; online, the seed fetches)")


def test_remote_is_read_once_not_once_per_node(
    first_run: subprocess.CompletedProcess[str], server: LfsServer
) -> None:
    assert first_run.returncode == 0
    objects = lfs_object_requests(server)
    assert len(objects) == 2, objects  # model.safetensors and tokenizer.json, by the seed only


def test_seed_keeps_the_weights_once_on_disk(
    lab: RunningLab, first_run: subprocess.CompletedProcess[str]
) -> None:
    links = lab.ssh("node1", f"stat -c %h {MODEL_DIR}/model.safetensors").stdout.strip()
    assert links == "2", "the LFS object and the checked-out file should be one inode"


def test_second_run_changes_nothing(
    lab: RunningLab, first_run: subprocess.CompletedProcess[str], server: LfsServer, tmp_path: Path
) -> None:
    second = run_role(lab, tmp_path, *online_vars(server))
    assert second.returncode == 0, second.stdout[-3000:]
    assert set(changed_counts(second.stdout).values()) == {0}, second.stdout[-3000:]


def test_check_mode_on_the_fetched_model_changes_nothing(
    lab: RunningLab, first_run: subprocess.CompletedProcess[str], server: LfsServer, tmp_path: Path
) -> None:
    markers = {host: lab.ssh(host, f"cat {MARKER}").stdout for host in lab.hosts}
    fetched = len(lfs_object_requests(server))
    result = run_role(lab, tmp_path, *online_vars(server), "--check")
    assert result.returncode == 0, result.stdout[-3000:]
    assert set(changed_counts(result.stdout).values()) == {0}, result.stdout[-3000:]
    assert len(lfs_object_requests(server)) == fetched, "check mode downloaded LFS objects"
    assert {host: lab.ssh(host, f"cat {MARKER}").stdout for host in lab.hosts} == markers


def test_check_mode_on_a_fresh_model_dir_reports_and_creates_nothing(
    lab: RunningLab, first_run: subprocess.CompletedProcess[str], server: LfsServer, tmp_path: Path
) -> None:
    fresh = "/opt/models/check-mode"
    fetched = len(lfs_object_requests(server))
    result = run_role(lab, tmp_path, *online_vars(server, fresh), "--check")
    for host in lab.hosts:
        assert lab.ssh(host, f"test -e {fresh}").returncode != 0, f"check mode created {fresh} on {host}"
    assert len(lfs_object_requests(server)) == fetched, "check mode downloaded LFS objects"
    assert result.returncode == 0, result.stdout[-3000:]
    assert sum(changed_counts(result.stdout).values()) > 0, result.stdout[-3000:]
    for host in lab.hosts[1:]:  # the seed fetches; each other node says what it would get from it
        assert said(result.stdout, f"{host}: would receive {REPO_ID}@"), result.stdout[-3000:]


@pytest.mark.parametrize("host", ["node1", "node3"])
def test_corrupted_file_on_a_node_is_detected_and_repaired(
    lab: RunningLab, first_run: subprocess.CompletedProcess[str], server: LfsServer, tmp_path: Path, host: str
) -> None:
    flip = f"printf '\\xff' | dd of={MODEL_DIR}/model.safetensors bs=1 seek=5000 conv=notrunc status=none"
    good = lab.ssh("node2", f"sha256sum {MODEL_DIR}/model.safetensors").stdout.split()[0]
    assert lab.ssh(host, flip).returncode == 0
    result = run_role(lab, tmp_path, *online_vars(server))
    assert result.returncode == 0, result.stdout[-3000:]
    assert changed_counts(result.stdout)[host] > 0
    assert lab.ssh(host, f"sha256sum {MODEL_DIR}/model.safetensors").stdout.split()[0] == good


def test_corrupt_object_on_the_remote_fails_with_a_clear_message(
    lab: RunningLab, remote_root: tuple[Path, str], server: LfsServer, git_on_hosts: None, tmp_path: Path
) -> None:
    root, _ = remote_root
    bad_repo = "gpufleet/tiny-corrupt"
    shutil.copytree(root / f"{REPO_ID}.git", root / f"{bad_repo}.git")
    weights = sha256_file(root.parent / "tiny-model" / "model.safetensors")
    obj = lfs_object_path(root / f"{bad_repo}.git", weights)
    data = bytearray(obj.read_bytes())
    data[4096] ^= 0xFF
    obj.write_bytes(bytes(data))
    result = run_role(
        lab,
        tmp_path,
        "-e",
        "gpufleet_model_dir=/opt/models/corrupt",
        "-e",
        f"model_fetch_url={server.url}/{bad_repo}.git",
    )
    assert result.returncode != 0
    assert "git lfs pull" in result.stdout and "is not marked as present" in result.stdout, result.stdout[
        -3000:
    ]
    assert lab.ssh("node1", "test -e /opt/models/corrupt/.gpufleet-model.json").returncode != 0


def test_interrupted_fetch_resumes(
    lab: RunningLab, remote_root: tuple[Path, str], server: LfsServer, git_on_hosts: None, tmp_path: Path
) -> None:
    model_dir = "/opt/models/resumed"
    server.rate = 100_000  # the weights take ~12 s, the tokenizer ~1 s
    server.log.requests.clear()
    playbook = tmp_path / "model_fetch.yml"
    run_role(lab, tmp_path, "--syntax-check")
    argv = [
        str(Path(REPO / ".venv/bin/ansible-playbook")),
        "-i",
        str(lab.inventory.inventory),
        str(playbook),
        "-e",
        f"gpufleet_model_repo={REPO_ID}",
        *online_vars(server, model_dir),
    ]
    proc = subprocess.Popen(
        argv, cwd=REPO, env=ansible_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(lfs_object_requests(server)) < 2:
        time.sleep(0.2)
    time.sleep(2)
    proc.kill()
    proc.wait()
    lab.ssh("node1", "pkill -f 'git-lfs' ; pkill -f 'lfs pull'; true")
    server.rate = 0
    assert lab.ssh("node1", f"test -e {model_dir}/.gpufleet-model.json").returncode != 0
    before = len(server.log.requests)
    result = run_role(lab, tmp_path, *online_vars(server, model_dir))
    assert result.returncode == 0, result.stdout[-3000:]
    again = [
        path
        for method, path, _ in server.log.requests[before:]
        if "/info/lfs/objects/" in path and method == "GET"
    ]
    tokenizer = sha256_file(remote_root[0].parent / "tiny-model" / "tokenizer.json")
    assert again and not any(path.endswith(tokenizer) for path in again), again


@pytest.mark.parametrize(
    ("strategy", "reported"),
    [
        ("auto", "model_fetch strategy: chain (auto: the control node reached node1"),
        ("fanout", "model_fetch strategy: fanout (set by model_fetch_strategy)"),
    ],
)
def test_offline_from_a_bundle(
    lab: RunningLab, remote_root: tuple[Path, str], tmp_path: Path, strategy: str, reported: str
) -> None:
    """auto: the control node streams the bundle's model through all three nodes (no SSH copy to a seed);
    fanout: node1 gets the files over SSH and heads the chain to node2 and node3."""
    root, commit = remote_root
    manifest = tmp_path / "manifest.yml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "schema_version": 1,
                "name": "lab-model",
                "model": {
                    "repo": REPO_ID,
                    "revision": commit,
                    "source": {"kind": "git-lfs", "url": str(root / f"{REPO_ID}.git")},
                },
            }
        )
    )
    build(manifest, tmp_path / "bundle")
    offline = ("-e", f"gpufleet_model_dir=/opt/models/offline-{strategy}")
    offline += ("-e", f"gpufleet_bundle_dir={tmp_path / 'bundle'}")
    result = run_role(lab, tmp_path, *offline, "-e", f"model_fetch_strategy={strategy}")
    assert result.returncode == 0, result.stdout[-3000:]
    assert said(result.stdout, reported), result.stdout[-3000:]
    receivers = task_results(result.stdout, "Start a receiver on each node of the chain")
    copies = task_results(result.stdout, "Copy the model's files from the bundle")
    if strategy == "auto":
        assert receivers == {host: ["changed"] for host in lab.hosts} and not copies, (receivers, copies)
    else:
        assert receivers == {"node2": ["changed"], "node3": ["changed"]} and list(copies) == ["node1"]
    weights = sha256_file(root.parent / "tiny-model" / "model.safetensors")
    for host in lab.hosts:
        marker = json.loads(lab.ssh(host, f"cat /opt/models/offline-{strategy}/.gpufleet-model.json").stdout)
        assert marker["revision"] == commit, host
        assert marker["files"]["model.safetensors"]["sha256"] == weights, host
    if strategy == "auto":
        # every task again (not the fast path's one check): nothing to send, and the report names no strategy
        # that does not run (it said "fanout (auto; every node has the model, nothing to send)" before)
        again = run_role(lab, tmp_path, *offline, "-e", "gpufleet_fast_rerun=false")
        assert again.returncode == 0, again.stdout[-3000:]
        assert set(changed_counts(again.stdout).values()) == {0}, again.stdout[-3000:]
        reported = "model_fetch strategy: none (auto; every node has the model, nothing to send)"
        assert said(again.stdout, reported), again.stdout[-3000:]
