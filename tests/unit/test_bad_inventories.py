"""Bad inventories end in one line naming where, what, expected and the fix: no traceback, no wrong "valid".

Each case was a traceback or a wrong acceptance before (issue 13, "bad input"): non-UTF-8 or binary bytes,
group_vars holding a list, a vault value without a password, an invalid IP in ansible_host, a directory
without a hosts file (blamed on "syntax"), host_vars for a host the inventory does not have (ignored).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet.cli import main
from gpufleet.fleet.inventory import own_prefixes
from gpufleet.fleet.validate import role_variables

REPO = Path(__file__).resolve().parents[2]
VAULTED = """vllm_service_max_num_seqs: !vault |
  $ANSIBLE_VAULT;1.1;AES256
  61626364656667
"""


def prod(tmp_path: Path) -> Path:
    inventory = tmp_path / "inv"
    shutil.copytree(REPO / "inventories" / "prod", inventory)
    group_vars = inventory / "group_vars" / "gpu_nodes.yml"
    config = REPO / "models" / "Qwen2.5-1.5B-Instruct" / "config.json"
    group_vars.write_text(
        group_vars.read_text().replace("../../models/Qwen2.5-1.5B-Instruct/config.json", str(config))
    )
    return inventory


def append(relpath: str, data: bytes) -> Callable[[Path], None]:
    def change(inventory: Path) -> None:
        with (inventory / relpath).open("ab") as handle:
            handle.write(data)

    return change


def write(relpath: str, data: bytes) -> Callable[[Path], None]:
    def change(inventory: Path) -> None:
        (inventory / relpath).parent.mkdir(parents=True, exist_ok=True)
        (inventory / relpath).write_bytes(data)

    return change


def replace(relpath: str, old: str, new: str) -> Callable[[Path], None]:
    def change(inventory: Path) -> None:
        path = inventory / relpath
        path.write_text(path.read_text().replace(old, new))

    return change


def remove(relpath: str) -> Callable[[Path], None]:
    return lambda inventory: (inventory / relpath).unlink()


CASES = {
    "latin-1 bytes in hosts": (append("hosts.yml", b"# caf\xe9\n"), "hosts.yml: -i: found bytes that"),
    "NUL in group_vars": (append("group_vars/all.yml", b"x: \x00\n"), "all.yml: -i: found character"),
    "binary file beside hosts": (write("notes.bin", bytes(range(256))), "notes.bin: -i: found bytes"),
    "group_vars is a list": (write("group_vars/gpu_nodes.yml", b"---\n- a\n"), "expected a YAML mapping"),
    "vault without password": (
        append("group_vars/gpu_nodes.yml", VAULTED.encode()),
        "found a vault-encrypted",
    ),
    # every role's namespace is gpufleet's (the prefixes come from the argument specs, as validation's do)
    "vault without password, monitoring": (
        append(
            "group_vars/gpu_nodes.yml",
            VAULTED.replace("vllm_service_max_num_seqs", "monitoring_scrape_interval").encode(),
        ),
        "monitoring_scrape_interval: found a vault-encrypted",
    ),
    "vault without password, gateway": (
        append(
            "group_vars/gpu_nodes.yml",
            VAULTED.replace("vllm_service_max_num_seqs", "gateway_edge_port").encode(),
        ),
        "gateway_edge_port: found a vault-encrypted",
    ),
    # the relay is an internal role: image_distribution and model_fetch set its inputs, an inventory does not
    "an internal role's input": (
        append("group_vars/gpu_nodes.yml", b"relay_port: 18500\n"),
        "relay_port: found an input of the internal relay role",
    ),
    "ansible_host not an IP": (
        replace("hosts.yml", "ansible_host: 192.0.2.10", "ansible_host: 999.0.2.10"),
        "ansible_host: found '999.0.2.10'; expected an IP address or a host name",
    ),
    "ansible_host with a space": (
        replace("hosts.yml", "ansible_host: 192.0.2.10", "ansible_host: my host"),
        "ansible_host: found 'my host'",
    ),
    "no hosts file": (remove("hosts.yml"), "found no hosts file in the directory"),
    "host_vars for no host": (
        write("host_vars/gpu-wroker-01.yml", b"gpufleet_nic: eth1\n"),
        "found variables for host 'gpu-wroker-01', which no group of the inventory has",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_inventory_is_one_line_per_problem(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    change, expected = CASES[case]
    inventory = prod(tmp_path)
    change(inventory)
    code = main(["validate", "-i", str(inventory)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err
    problem = next(line for line in err.splitlines() if expected in line)
    assert ": found " in problem and "; expected " in problem and ". Fix: " in problem, problem


def test_a_vaulted_secret_gpufleet_does_not_read_is_left_to_ansible(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = prod(tmp_path)
    append(
        "group_vars/all.yml", VAULTED.replace("vllm_service_max_num_seqs", "ansible_become_password").encode()
    )(inventory)
    assert main(["validate", "-i", str(inventory)]) == 0, capsys.readouterr().err


def test_the_unchanged_copy_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The cases above fail because of their one change, not because of the copy."""
    assert main(["validate", "-i", str(prod(tmp_path))]) == 0, capsys.readouterr().err


def test_the_variables_gpufleet_reads_are_the_namespaces_validation_checks() -> None:
    """One source for both: every role with argument specs (the vaulted-`monitoring_*` bug was a hand-kept
    list here that had drifted from them)."""
    roles = set(role_variables().values())
    assert set(own_prefixes()) == {"gpufleet_", "ansible_host", *(f"{role}_" for role in roles)}
    assert {"monitoring_", "gateway_", "vllm_service_", "docker_"} <= set(own_prefixes())
