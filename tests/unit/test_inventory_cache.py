"""read_inventory keeps Ansible's reading of an inventory, keyed by everything that reading depends on.

The cache exists for speed (``gpufleet plan -i`` under 0.3 s: ansible-core's import alone costs about
0.5 s of CPU); these tests make sure it never answers with a stale or a different inventory.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.fleet import inventory, inventory_cache
from gpufleet.fleet.inventory import read_inventory
from gpufleet.fleet.schema import BlockSize
from gpufleet.planner.model import BLOCK_SIZES

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def prod(tmp_path: Path) -> Path:
    copy = tmp_path / "prod"
    shutil.copytree(REPO / "inventories" / "prod", copy)
    return copy


def no_ansible(path: Path) -> None:
    raise AssertionError(f"{path} was read through Ansible, not from the cache")


def test_a_second_read_comes_from_the_cache_and_equals_ansibles(
    prod: Path, private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = read_inventory(prod)
    files = list((private_cache / "inventory").iterdir())
    assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert stat.S_IMODE((private_cache / "inventory").stat().st_mode) == 0o700
    monkeypatch.setattr(inventory, "_load_with_ansible", no_ansible)
    assert read_inventory(prod) == first


def test_any_change_to_a_file_ansible_reads_is_read_again(
    prod: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = read_inventory(prod)
    group_vars = prod / "group_vars" / "all.yml"
    group_vars.write_text(group_vars.read_text() + "gpufleet_extra_for_the_test: 7\n")
    second = read_inventory(prod)
    assert second != first
    assert all(host.variables["gpufleet_extra_for_the_test"] == 7 for host in second.hosts)
    # A new host_vars file changes the key (re-reading it here would meet ansible-core's own in-process
    # cache of the vars directories, which a fresh command does not have).
    key = inventory_cache.cache_key(prod)
    (prod / "host_vars").mkdir()
    (prod / "host_vars" / f"{second.hosts[0].name}.yml").write_text("gpufleet_extra_for_the_test: 8\n")
    assert inventory_cache.cache_key(prod) not in (None, key)


def test_the_ansible_environment_is_part_of_the_key(prod: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read_inventory(prod)
    monkeypatch.setenv("ANSIBLE_INVENTORY_IGNORE", "hosts.yml")
    monkeypatch.setattr(inventory, "_load_with_ansible", no_ansible)
    with pytest.raises(AssertionError, match="read through Ansible"):
        read_inventory(prod)


@pytest.mark.parametrize(
    "line",
    [
        "gpufleet_extra: \"{{ lookup('env', 'HOME') }}\"\n",
        "gpufleet_extra: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\n",
    ],
    ids=["template", "vault"],
)
def test_templates_and_vaults_are_always_read_through_ansible(prod: Path, line: str) -> None:
    (prod / "group_vars" / "all.yml").write_text((prod / "group_vars" / "all.yml").read_text() + line)
    assert inventory_cache.cache_key(prod) is None


def test_an_executable_inventory_script_is_not_cached(prod: Path) -> None:
    script = prod / "dynamic.sh"
    script.write_text("#!/bin/sh\necho '{}'\n")
    script.chmod(0o755)
    assert inventory_cache.cache_key(prod) is None


def test_gpufleet_no_cache_turns_it_off(prod: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_NO_CACHE", "1")
    assert inventory_cache.cache_key(prod) is None


def test_a_corrupt_cache_file_is_read_through_ansible_again(prod: Path, private_cache: Path) -> None:
    first = read_inventory(prod)
    (cached,) = (private_cache / "inventory").iterdir()
    cached.write_text('{"hosts": [')
    assert read_inventory(prod) == first
    assert cached.read_text().startswith('{"hosts": [{')


def test_plan_with_a_cached_inventory_does_not_import_ansible(prod: Path, private_cache: Path) -> None:
    env = os.environ | {"GPUFLEET_CACHE_DIR": str(private_cache)}
    code = (
        "import sys; from gpufleet.cli import main; main(sys.argv[1:]); "
        "print(sorted(m for m in sys.modules if m.startswith('ansible.')))"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, "plan", "-i", str(prod), "--json"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        for _ in range(2)
    ]
    assert "'ansible.constants'" in runs[0].stdout
    # Only the light, configuration-free part of ansible-core (module_utils: the argument-spec validator that
    # checks role values, ~75 ms): not its configuration, loader, templating or plugins (~0.5 s of CPU).
    imported = runs[1].stdout.splitlines()[-1]
    heavy = ["ansible.constants", "ansible.config", "ansible.inventory", "ansible.parsing"]
    heavy.append("ansible.template")
    assert imported.startswith("['") and not any(f"'{name}" in imported for name in heavy), runs[1].stderr
    assert all(
        name.startswith(("ansible.module_utils", "ansible._vendor", "ansible.release"))
        for name in imported.strip("[]").replace("'", "").split(", ")
    ), imported
    assert runs[0].stdout.split("\n[")[0] == runs[1].stdout.split("\n[")[0]


def test_block_sizes_are_one_list() -> None:
    assert tuple(BlockSize.__args__) == BLOCK_SIZES  # type: ignore[attr-defined]


@pytest.mark.parametrize("cached", [False, True])
def test_the_secrets_written_beside_an_inventory_are_no_hosts(
    prod: Path, cached: bool, tmp_path: Path
) -> None:
    """gpufleet.apikey and gpufleet.grafana-password live beside the inventory: Ansible's ini plugin read each
    as a host named after the secret (found by review: the password listed in `ungrouped`). gpufleet's reader
    skips them whatever the ansible.cfg; so does Ansible with gpufleet's ansible.cfg."""
    (prod / "gpufleet.apikey").write_text("K" * 64 + "\n", encoding="utf-8")
    (prod / "gpufleet.grafana-password").write_text("P" * 32 + "\n", encoding="utf-8")
    plain_cfg = tmp_path / "plain.cfg"
    plain_cfg.write_text("[defaults]\n", encoding="utf-8")
    env = os.environ | {"ANSIBLE_CONFIG": str(plain_cfg)} | ({} if cached else {"GPUFLEET_NO_CACHE": "1"})
    script = "import sys; from gpufleet.fleet.inventory import read_inventory; from pathlib import Path; "
    script += "print(' '.join(h.name for h in read_inventory(Path(sys.argv[1])).hosts))"

    read = subprocess.run(
        [sys.executable, "-c", script, str(prod)], env=env, capture_output=True, text=True, check=False
    )
    listed = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(prod), "--list"],
        env=env | {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
        capture_output=True,
        text=True,
        check=True,
    )

    assert read.stdout.split() == ["gpu-head-01", "gpu-worker-01"], read.stderr
    assert "K" * 64 not in listed.stdout and "P" * 32 not in listed.stdout


def test_each_file_is_read_once_for_the_key_and_the_duplicate_check(
    prod: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One scan of the inventory's files feeds the cache key and the duplicate-key check (issue 34: each
    file was read twice before Ansible read it)."""
    reads: list[Path] = []
    read_bytes = Path.read_bytes

    def counted(path: Path) -> bytes:
        if path.is_relative_to(prod):
            reads.append(path)
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", counted)
    monkeypatch.setattr(inventory, "_load_with_ansible", lambda path: ([], []))  # Ansible reads on its own

    read_inventory(prod)

    files = sorted(path for path in prod.rglob("*") if path.is_file())
    assert files and sorted(reads) == files


def test_a_runs_extra_vars_are_no_inventory_variables(prod: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside ansible-playbook (the placement lookup, the validate action) Ansible's VariableManager adds the
    run's -e values: status's gpufleet_status_promql was read as an unknown inventory variable, and a reading
    cached by the inventory's files alone would have kept it for the next `gpufleet validate`."""
    from ansible import context
    from ansible.module_utils.common.collections import ImmutableDict

    monkeypatch.setenv("GPUFLEET_NO_CACHE", "1")
    monkeypatch.setattr(
        context, "CLIARGS", ImmutableDict(extra_vars=('{"gpufleet_status_promql": {"a": "up"}}',))
    )
    raw = read_inventory(prod)
    assert raw.hosts and raw.problems == ()
    assert all("gpufleet_status_promql" not in host.variables for host in raw.hosts)
