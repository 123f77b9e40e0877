"""The relay on three lab hosts (issue 13, items 5 and 6): verified staging, repair, named causes, no leak.

Before: the relay untarred a model stream straight into the model directory; an injected *.safetensors
survived a re-deploy with changed=0; a receiver whose staging file system was full was reported as
"Connection reset ... open TCP port 18432 or set fanout"; the relay took the first connection unauthenticated.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import REPO, RunningLab
from test_model_fetch import REPO_ID, changed_counts, said

from gpufleet.bundle import build
from gpufleet.bundle.lfs import make_lfs_repo
from gpufleet.lab.tiny_model import write_tiny_model

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("relay-bundle")
    model = write_tiny_model(work / "tiny-model")
    _bare, commit = make_lfs_repo(model, work / "remote", REPO_ID)
    manifest = work / "manifest.yml"
    source = {"kind": "git-lfs", "url": str(work / "remote" / f"{REPO_ID}.git")}
    manifest.write_text(
        yaml.safe_dump(
            {
                "schema_version": 1,
                "name": "m",
                "model": {"repo": REPO_ID, "revision": commit, "source": source},
            }
        )
    )
    build(manifest, work / "bundle")
    return work / "bundle"


def run(
    lab: RunningLab, tmp: Path, bundle: Path, model_dir: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    playbook = tmp / "model_fetch.yml"
    playbook.write_text("- hosts: gpu_nodes\n  gather_facts: false\n  roles:\n    - role: model_fetch\n")
    return lab.playbook(
        playbook,
        "-e", f"gpufleet_model_repo={REPO_ID}", "-e", f"gpufleet_model_dir={model_dir}",
        "-e", f"gpufleet_bundle_dir={bundle}", "-vv", *extra,
    )  # fmt: skip


@pytest.mark.parametrize("strategy", ["chain", "fanout"])
def test_an_injected_safetensors_is_removed_by_the_next_run_not_trusted(
    lab: RunningLab, bundle: Path, tmp_path: Path, strategy: str
) -> None:
    model_dir = f"/opt/models/trust-{strategy}"
    first = run(lab, tmp_path, bundle, model_dir, "-e", f"model_fetch_strategy={strategy}")
    assert first.returncode == 0, first.stdout[-3000:]
    lab.ssh("node2", f"head -c 4096 /dev/urandom > {model_dir}/evil.safetensors")
    repaired = run(lab, tmp_path, bundle, model_dir, "-e", f"model_fetch_strategy={strategy}")
    assert repaired.returncode == 0, repaired.stdout[-3000:]
    assert changed_counts(repaired.stdout)["node2"] > 0
    listing = lab.ssh(
        "node2", f"ls -A {model_dir}; test -e {model_dir}.gpufleet-incoming && echo STAGING"
    ).stdout
    assert "evil.safetensors" not in listing and "STAGING" not in listing, listing
    assert "model.safetensors" in listing
    again = run(lab, tmp_path, bundle, model_dir, "-e", f"model_fetch_strategy={strategy}")
    assert again.returncode == 0 and set(changed_counts(again.stdout).values()) == {0}, again.stdout[-3000:]
    # the token never appears in the output, even at -vv, nor in any process's argv on a node
    tokens = re.findall(
        r"(?<![A-Za-z0-9])[A-Za-z0-9]{48}(?![A-Za-z0-9])", repaired.stdout
    )  # the token's shape
    assert "--token-file" in repaired.stdout and not tokens, tokens
    assert lab.ssh("node2", "ls -A /run/gpufleet").stdout.strip() == ""  # token files removed


@pytest.fixture
def small_staging(lab: RunningLab) -> Iterator[str]:
    """node3's model file system is a 256 KiB tmpfs: the 1.3 MB tiny model does not fit."""
    lab.ssh("node3", "mkdir -p /opt/small && mount -t tmpfs -o size=256k gpufleet-small /opt/small")
    try:
        yield "/opt/small/model"
    finally:
        lab.ssh("node3", "umount -l /opt/small; rmdir /opt/small")
        for host in ("node1", "node2"):
            lab.ssh(host, "rm -rf /opt/small")


@pytest.mark.parametrize("strategy", ["chain", "fanout"])
def test_a_full_staging_disk_is_named_not_blamed_on_the_port(
    lab: RunningLab, bundle: Path, tmp_path: Path, small_staging: str, strategy: str
) -> None:
    result = run(lab, tmp_path, bundle, small_staging, "-e", f"model_fetch_strategy={strategy}")
    assert result.returncode != 0
    out = " ".join(result.stdout.split())
    assert "node3: disk full writing /opt/small/model.gpufleet-incoming" in out, result.stdout[-4000:]
    assert "bytes free in /opt/small/model.gpufleet-incoming" in out
    assert "(disk_full)" in out
    assert not said(result.stdout, "open TCP port 18433 on the nodes' cluster network")
    marker = lab.ssh(
        "node3", f"cat {small_staging}/.gpufleet-model.json 2>/dev/null || echo none"
    ).stdout.strip()
    assert marker == "none"
    # no receiver is left waiting: the nodes behind node3 never get a sender, and one left alive held port
    # 18433 for 5 minutes, so the user's next run failed with "node2 refused this sender's token"
    left = {host: relays(lab, host) for host in lab.hosts}
    assert not any(left.values()), left


def relays(lab: RunningLab, host: str) -> str:
    """The relay processes on a host (pgrep's own line excluded)."""
    return lab.ssh(host, "pgrep --full --list-full 'gpufleet_relay[.]py' || true").stdout.strip()


def test_a_receiver_an_earlier_run_left_waiting_does_not_turn_the_next_run_away(
    lab: RunningLab, bundle: Path, tmp_path: Path
) -> None:
    """A receiver of a canceled run, with its old token, on node2's relay port: the next run ends it first."""
    relay = REPO / "roles" / "relay" / "files" / "gpufleet_relay.py"
    copy = "mkdir -p /root/stale && cat > /root/stale/gpufleet_relay.py"
    lab.lab.ssh("node2", copy, stdin=relay.read_text())
    stale = (
        "umask 077; head -c 36 /dev/urandom | base64 > /root/stale/old.token; setsid nohup "
        f"/usr/bin/python3 /root/stale/gpufleet_relay.py recv --listen {lab.inventory.ips['node2']}:18433 "
        "--accept-timeout 300 --timeout 300 --token-file /root/stale/old.token --name node2 "
        "--untar /root/stale/incoming >/dev/null 2>&1 < /dev/null &"
    )
    lab.ssh("node2", stale)
    time.sleep(1)
    assert "--untar /root/stale/incoming" in relays(lab, "node2")
    model_dir = "/opt/models/trust-stale"
    for host in lab.hosts:
        lab.ssh(host, f"rm -rf {model_dir}")
    result = run(lab, tmp_path, bundle, model_dir, "-e", "model_fetch_strategy=fanout")
    assert result.returncode == 0, result.stdout[-4000:]
    assert not any(relays(lab, host) for host in lab.hosts)
