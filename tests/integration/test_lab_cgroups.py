"""A lab host's cgroups take its boot shell every time (issue 18: "echo: I/O error" joining cpuset).

The cause, measured: a v1 cpuset cgroup whose ``cpuset.mems`` is empty refuses every task with ENOSPC,
which dash reports as "echo: I/O error". Hosts start in parallel threads and labs in parallel processes,
sharing the ``gpufleet-lab/<lab>`` levels; a thread that read a shared level after another had written its
cpus but before its mems copied the empty mems down. These tests need no booted host: they create the
cgroups exactly as ``gpufleet lab up`` does and join a real process to each.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import lab_name, skip_unless_lab_possible

from gpufleet.lab import host as lab_host

pytestmark = [pytest.mark.lab]


def cpuset_leaf(spec: lab_host.HostSpec) -> Path:
    found = [Path(d) for d in spec.cgroups if any((a / "cpuset.cpus").exists() for a in Path(d).parents)]
    if not found:
        pytest.skip("no cgroup v1 cpuset hierarchy on this machine: the race cannot happen")
    return found[0]


def spec_for(lab: str, host: str) -> lab_host.HostSpec:
    return lab_host.HostSpec(
        host, "127.0.0.1", host, host, Path("/nonexistent"), lab_host.cgroup_dirs(lab, host)
    )


def join_all(spec: lab_host.HostSpec) -> subprocess.CompletedProcess[str]:
    """The boot shell's own join, by a real sh that then exits."""
    script = 'for d in $DIRS; do echo $$ > "$d/cgroup.procs" || exit 97; done'
    env = dict(os.environ, DIRS=" ".join(spec.cgroups))
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, check=False)


def remove(spec: lab_host.HostSpec) -> None:
    for directory in spec.cgroups:
        lab_host._remove_cgroup_tree(Path(directory))
    lab_host.remove_shared_cgroup_levels(spec)


@pytest.fixture
def lab() -> Iterator[str]:
    skip_unless_lab_possible()
    name = lab_name("cgroups")
    yield name
    remove(spec_for(name, "node1"))


def test_a_half_written_shared_level_is_filled_in_not_copied_down(lab: str) -> None:
    """The race's intermediate state, made on purpose: the lab level has cpus but not yet mems."""
    spec = spec_for(lab, "node1")
    leaf = cpuset_leaf(spec)
    lab_level = leaf.parent
    lab_level.mkdir(parents=True)
    for name in ("cpuset.cpus", "cpuset.mems"):  # gpufleet-lab (made just now, or shared): ready
        if not (lab_level.parent / name).read_text().strip():
            (lab_level.parent / name).write_text((lab_level.parent.parent / name).read_text())
    (lab_level / "cpuset.cpus").write_text((lab_level.parent / "cpuset.cpus").read_text())
    assert not (lab_level / "cpuset.mems").read_text().strip()

    lab_host.make_cgroups(spec)

    assert (leaf / "cpuset.mems").read_text().strip(), "the leaf took the half-written level's empty mems"
    joined = join_all(spec)
    assert joined.returncode == 0, joined.stderr


def test_hosts_made_in_parallel_all_take_their_boot_shell(lab: str) -> None:
    """As `lab up` does: every host's cgroups made at once from threads, 8 hosts, 5 rounds."""
    for round_ in range(5):
        specs = [spec_for(f"{lab}{round_}", f"node{i}") for i in range(1, 9)]
        try:
            with ThreadPoolExecutor(max_workers=len(specs)) as pool:
                list(pool.map(lab_host.make_cgroups, specs))
            for spec in specs:
                joined = join_all(spec)
                assert joined.returncode == 0, f"round {round_}, {spec.hostname}: {joined.stderr}"
        finally:
            for spec in specs:
                remove(spec)
