"""The release before vLLM instances (issue 34 step 1), for test_e2e.py's migration tests: this repository at
its last commit before instances, taken from git history (``git archive``), and its serve and verify stages
run from that tree (its playbooks, roles, plugins and Python package) against the end-to-end lab.

What that release leaves on a node is the layout this release migrates: one ``gpufleet-vllm.service``, its
files in /etc/gpufleet and /usr/local/libexec, the stamp ``vllm_service.json``, and its revisions at the top
of /var/lib/gpufleet/revisions.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import VENV_BIN, RunningLab, ansible_env

# main before issue 34 step 1 (instances): the release a running fleet upgrades from
PREVIOUS_RELEASE = "db4a947f018a2f1982f9708eb3e6addae1718698"

LEGACY_UNIT = "gpufleet-vllm.service"
LEGACY_FILES = (
    "/etc/gpufleet/vllm.yaml",
    "/etc/gpufleet/vllm.env",
    "/usr/local/libexec/gpufleet-vllm",
    "/etc/systemd/system/gpufleet-vllm.service",
)
INSTANCE_FILES = (
    "/etc/gpufleet/instances/default/vllm.yaml",
    "/etc/gpufleet/instances/default/vllm.env",
    "/etc/gpufleet/instances/default/ctl",
    "/etc/systemd/system/gpufleet-vllm@.service",
    "/etc/systemd/system/gpufleet-vllm@default.service.d/gpufleet.conf",
)
# This release's instance, gone before the release before serves: that release knows nothing of it (the
# instance would hold vLLM's port). Test set-up on the lab's hosts, not a product path. (With the Ray executor
# only the head has the unit: elsewhere there is nothing to disable.)
REMOVE_THE_INSTANCE = (
    "{ systemctl disable --now gpufleet-vllm@default.service || true; }"
    " && rm -rf /etc/gpufleet/instances /etc/systemd/system/gpufleet-vllm@.service"
    " /etc/systemd/system/gpufleet-vllm@default.service.d"
    " /var/lib/gpufleet/converged/vllm_service@default.json /var/lib/gpufleet/revisions/default"
    " && systemctl daemon-reload"
)


def previous_release(repo: Path, into: Path) -> Path:
    """The tree of :data:`PREVIOUS_RELEASE` under ``into``, from ``repo``'s history."""
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", PREVIOUS_RELEASE],
        capture_output=True, timeout=300, check=False,
    )  # fmt: skip
    assert archive.returncode == 0, (
        f"the release before instances is commit {PREVIOUS_RELEASE} of this repository's history, which this "
        f"clone lacks: {archive.stderr.decode(errors='replace')[-2000:]}"
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True, timeout=300)
    return into


def serve_with(tree: Path, lab: RunningLab, inventory: Path, bundle: Path) -> None:
    """The serve and verify stages of the release in ``tree``, as that release's deploy runs them, on every
    host (its own ansible.cfg, roles, plugins and Python package; this checkout's ansible-core)."""
    for host in lab.hosts:
        removed = lab.ssh(host, REMOVE_THE_INSTANCE)
        assert removed.returncode == 0, (host, removed.stdout, removed.stderr)
    env = ansible_env() | {"ANSIBLE_CONFIG": str(tree / "ansible.cfg"), "PYTHONPATH": str(tree / "src")}
    for stage in ("serve.yml", "verify.yml"):
        run = subprocess.run(
            [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(tree / "playbooks" / stage),
             "-e", f"gpufleet_bundle_dir={bundle}"],
            cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200,
            check=False,
        )  # fmt: skip
        assert run.returncode == 0, f"the release before instances, {stage}:\n{run.stdout[-4000:]}"


def present(lab: RunningLab, host: str, paths: tuple[str, ...]) -> list[str]:
    """Those of ``paths`` that exist on ``host``."""
    found = lab.ssh(host, "for f in " + " ".join(paths) + '; do [ -e "$f" ] && echo "$f"; done; true')
    return found.stdout.split()
