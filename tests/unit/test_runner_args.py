"""What gpufleet hands ansible-runner: stages, extra vars, the bundle, and an allow-listed environment."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import ansible_mitogen
import ansible_runner
import pytest
import yaml

from gpufleet.runner import STAGES, DeployError, deploy_specs
from gpufleet.runner.arguments import (
    PASSED_ENV,
    RunSpec,
    restrict_env,
    runner_arguments,
    runner_env,
    strategy_env,
)
from gpufleet.runner.plan import select_stages

# Ansible's own strategy: GPUFLEET_ANSIBLE_STRATEGY=linear, and the fallback without mitogen.
LINEAR = {"ANSIBLE_STRATEGY": "linear"}
MITOGEN = {
    "ANSIBLE_STRATEGY": "mitogen_linear",
    "ANSIBLE_STRATEGY_PLUGINS": str(Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"),
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "playbooks").mkdir(parents=True)
    for stage in (*STAGES, "status", "teardown"):
        (root / "playbooks" / f"{stage}.yml").write_text("- hosts: all\n  tasks: []\n", encoding="utf-8")
    (root / "ansible.cfg").write_text("[defaults]\n", encoding="utf-8")
    return root


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.ini"
    path.write_text("[gpu_nodes]\nlocalhost ansible_connection=local\n", encoding="utf-8")
    return path


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    path = tmp_path / "bundle"
    path.mkdir()
    (path / "bundle.lock.yml").write_text("files: []\n", encoding="utf-8")
    return path


def spec_for(project: Path, inventory: Path, **changes: object) -> RunSpec:
    return deploy_specs(inventory, project_dir=project, stages=["serve"], **changes)[0]  # type: ignore[arg-type]


def test_every_stage_runs_in_pipeline_order_by_default() -> None:
    expected = ["preflight", "nodes", "artifacts", "cluster", "serve", "verify", "monitoring"]
    assert select_stages(None) == expected


def test_the_monitoring_stage_runs_only_when_the_inventory_or_the_run_turns_it_on(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    host = {"gpufleet_node_ip": "10.0.0.1", "gpufleet_nic": "eth0"}
    tree = {"all": {"children": {"gpu_nodes": {"children": {"ray_head": {"hosts": {"n1": host}}}}}}}
    inventory.write_text(yaml.safe_dump(tree), encoding="utf-8")

    def stages(**changes: object) -> list[str]:
        return [spec.stage for spec in deploy_specs(inventory, **changes)]  # type: ignore[arg-type]

    assert stages()[-1] == "verify"
    assert stages(extra_vars={"gpufleet_monitoring": True})[-1] == "monitoring"
    assert stages(stages=["monitoring"]) == ["monitoring"]  # asked for by name: its playbook says it is off
    host["gpufleet_monitoring"] = "yes"
    inventory.write_text(yaml.safe_dump(tree), encoding="utf-8")
    assert stages()[-1] == "monitoring"
    assert stages(extra_vars={"gpufleet_monitoring": False})[-1] == "verify"


def test_chosen_stages_run_in_pipeline_order_whatever_order_they_were_given() -> None:
    assert select_stages(["verify", " serve", "cluster"]) == ["cluster", "serve", "verify"]


def test_an_unknown_stage_is_named_with_the_valid_ones() -> None:
    with pytest.raises(DeployError) as error:
        select_stages(["nodes", "serving"])

    assert str(error.value).startswith("stage 'serving': unknown; expected one or more of preflight, nodes,")
    assert "Fix: " in str(error.value)


def test_an_empty_stage_list_is_refused() -> None:
    with pytest.raises(DeployError, match="stages: none given"):
        select_stages(["", " "])


def test_specs_follow_the_stages(project: Path, inventory: Path) -> None:
    specs = deploy_specs(inventory, project_dir=project, stages=["serve", "cluster"])

    assert [(spec.stage, spec.playbook) for spec in specs] == [
        ("cluster", project.resolve() / "playbooks" / "cluster.yml"),
        ("serve", project.resolve() / "playbooks" / "serve.yml"),
    ]


def test_bundle_becomes_the_gpufleet_bundle_dir_extra_var(
    project: Path, inventory: Path, bundle: Path
) -> None:
    spec = spec_for(project, inventory, bundle=bundle, extra_vars={"vllm_service_port": 8001})

    assert spec.extravars == {"vllm_service_port": 8001, "gpufleet_bundle_dir": str(bundle.resolve())}


def test_a_missing_bundle_directory_is_a_one_line_error(
    project: Path, inventory: Path, tmp_path: Path
) -> None:
    with pytest.raises(DeployError) as error:
        spec_for(project, inventory, bundle=tmp_path / "nowhere")

    assert str(error.value).startswith(f"bundle {tmp_path / 'nowhere'}: not a directory. Fix: ")
    assert "\n" not in str(error.value)


def test_a_directory_without_a_bundle_lock_is_not_a_bundle(
    project: Path, inventory: Path, tmp_path: Path
) -> None:
    with pytest.raises(DeployError, match=r"no bundle\.lock\.yml in it"):
        spec_for(project, inventory, bundle=tmp_path)


def test_the_bundle_cannot_also_come_as_an_extra_var(project: Path, inventory: Path, bundle: Path) -> None:
    with pytest.raises(DeployError, match="given both as --bundle and as an extra variable"):
        spec_for(project, inventory, bundle=bundle, extra_vars={"gpufleet_bundle_dir": "/srv/other"})


def test_a_missing_inventory_is_a_one_line_error(project: Path, tmp_path: Path) -> None:
    with pytest.raises(DeployError) as error:
        spec_for(project, tmp_path / "inventories" / "nope")

    assert "no such file or directory. Fix: pass -i" in str(error.value)


def test_a_missing_playbook_stops_before_anything_runs(project: Path, inventory: Path) -> None:
    (project / "playbooks" / "verify.yml").unlink()

    with pytest.raises(DeployError, match=r"verify.yml: missing, so stage 'verify' cannot run"):
        deploy_specs(inventory, project_dir=project)


def test_runner_arguments_are_built_in_one_place(
    project: Path, inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The caller's whole environment, fixed: HOME (allow-listed), PATH, and a variable that must stay out.
    for name in list(os.environ):
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", "/home/operator")
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin")
    monkeypatch.setenv("GPUFLEET_TEST_SECRET", "do-not-pass")
    spec = spec_for(project, inventory, check=True, limit="head", timeout=600)

    def handler(event: object) -> bool:
        return False

    def cancel() -> bool:
        return False

    arguments = runner_arguments(spec, tmp_path / "private", handler, cancel)

    assert arguments == {
        "private_data_dir": str(tmp_path / "private"),
        "project_dir": str(project.resolve()),
        "playbook": str(project.resolve() / "playbooks" / "serve.yml"),
        "inventory": str(inventory.resolve()),
        "extravars": {"mitogen_ssh_compression": False},
        "limit": "head",
        "cmdline": "--check",
        "envvars": {
            "HOME": "/home/operator",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/local/bin:/usr/bin",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_CALLBACK_PLUGINS": "",
            "ANSIBLE_STDOUT_CALLBACK": "default",
            **MITOGEN,
            "ANSIBLE_CONFIG": str(project.resolve() / "ansible.cfg"),
        },
        "json_mode": True,
        "quiet": True,
        "timeout": 600,
        "event_handler": handler,
        "cancel_callback": cancel,
        "settings": {"suppress_ansible_output": True, "suppress_output_file": True, "pexpect_timeout": 1},
    }


def test_mitogens_ssh_compression_is_off_unless_the_caller_turns_it_on(
    project: Path, inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mitogen compresses its SSH stream by default: CPU at both ends over a cluster network (the docker
    tarball's copy to 3 lab nodes, 9.6 s with it, 4.2 s without). The caller's own value wins; Ansible's own
    strategy gets no mitogen variable."""

    def arguments(extravars: dict[str, object]) -> dict[str, object]:
        spec = replace(spec_for(project, inventory), extravars=extravars)
        return runner_arguments(spec, tmp_path / "private", lambda event: False, lambda: False)

    assert arguments({})["extravars"] == {"mitogen_ssh_compression": False}
    assert arguments({"mitogen_ssh_compression": "true", "x": 1})["extravars"] == {
        "mitogen_ssh_compression": "true",
        "x": 1,
    }
    monkeypatch.setenv("GPUFLEET_ANSIBLE_STRATEGY", "linear")
    assert arguments({"x": 1})["extravars"] == {"x": 1}


def test_runner_env_passes_only_the_allow_list(project: Path, inventory: Path) -> None:
    spec = spec_for(project, inventory)
    environ = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "SSH_AUTH_SOCK": "/run/agent.sock",
        "https_proxy": "http://proxy:3128",
        "AWS_SECRET_ACCESS_KEY": "do-not-pass",
        "ANSIBLE_VAULT_PASSWORD_FILE": "/root/.vault",
        "ANSIBLE_STDOUT_CALLBACK": "yaml",
    }

    env = runner_env(spec, environ)

    assert env == {
        "HOME": "/root",
        "SSH_AUTH_SOCK": "/run/agent.sock",
        "https_proxy": "http://proxy:3128",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CALLBACK_PLUGINS": "",
        "ANSIBLE_STDOUT_CALLBACK": "default",
        **MITOGEN,
        "ANSIBLE_CONFIG": str(project.resolve() / "ansible.cfg"),
    }


def test_without_an_ansible_cfg_none_is_named_and_a_missing_path_falls_back_to_the_default(
    project: Path, inventory: Path
) -> None:
    (project / "ansible.cfg").unlink()
    spec = spec_for(project, inventory)

    env = runner_env(spec, {"HOME": "/root"})

    assert env == {
        "HOME": "/root",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.defpath}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CALLBACK_PLUGINS": "",
        "ANSIBLE_STDOUT_CALLBACK": "default",
        **MITOGEN,
    }


def test_named_variables_can_be_passed_through(project: Path, inventory: Path) -> None:
    spec = spec_for(project, inventory, env_passthrough=["ANSIBLE_VAULT_PASSWORD_FILE"])

    env = runner_env(spec, {"ANSIBLE_VAULT_PASSWORD_FILE": "/root/.vault", "OTHER": "x"})

    assert env["ANSIBLE_VAULT_PASSWORD_FILE"] == "/root/.vault"
    assert "OTHER" not in env


def test_the_allow_list_names_no_secret_carrier() -> None:
    assert not [name for name in PASSED_ENV if "KEY" in name or "TOKEN" in name or "PASS" in name]


def test_runner_environment_keeps_nothing_of_the_callers_but_the_allow_list(
    project: Path, inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_TEST_SECRET", "do-not-pass")
    monkeypatch.setenv("ANSIBLE_STDOUT_CALLBACK", "yaml")
    monkeypatch.setenv("ANSIBLE_CALLBACK_PLUGINS", "/somewhere/else")
    monkeypatch.setenv("ANSIBLE_BECOME_PASSWORD_FILE", "/root/become")
    spec = spec_for(project, inventory)
    (tmp_path / "private").mkdir()
    arguments = runner_arguments(spec, tmp_path / "private", lambda event: False, lambda: False)
    # ansible-runner's own preparation, as _run_playbook does it, without starting ansible-playbook.
    config_env = ansible_runner.interface.init_runner(**arguments).config.env

    env = restrict_env(config_env, os.environ, set(arguments["envvars"]))

    assert "GPUFLEET_TEST_SECRET" in config_env  # ansible-runner alone would have passed it
    assert "GPUFLEET_TEST_SECRET" not in env
    assert "ANSIBLE_BECOME_PASSWORD_FILE" not in env
    assert env["ANSIBLE_STDOUT_CALLBACK"] == "awx_display"
    assert env["ORIGINAL_STDOUT_CALLBACK"] == "default"
    assert "/somewhere/else" not in env["ANSIBLE_CALLBACK_PLUGINS"]
    assert env["AWX_ISOLATED_DATA_DIR"].startswith(str(tmp_path / "private"))
    assert env["PATH"].startswith(str(Path(sys.executable).parent))


def test_mitogens_strategy_plugin_is_where_the_env_says() -> None:
    assert (Path(MITOGEN["ANSIBLE_STRATEGY_PLUGINS"]) / "mitogen_linear.py").is_file()


def test_mitogens_strategy_is_the_default_and_ansibles_own_can_be_chosen() -> None:
    assert strategy_env({}) == MITOGEN
    assert strategy_env({"GPUFLEET_ANSIBLE_STRATEGY": ""}) == MITOGEN
    assert strategy_env({"GPUFLEET_ANSIBLE_STRATEGY": "mitogen_linear"}) == MITOGEN
    assert strategy_env({"GPUFLEET_ANSIBLE_STRATEGY": "linear"}) == LINEAR


def test_without_mitogen_installed_ansibles_own_strategy_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ansible_mitogen", None)  # import raises ImportError
    assert strategy_env({}) == LINEAR
    assert strategy_env({"GPUFLEET_ANSIBLE_STRATEGY": "mitogen_linear"}) == LINEAR


def test_an_unknown_strategy_is_refused_before_anything_runs(
    project: Path, inventory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_ANSIBLE_STRATEGY", "free")
    with pytest.raises(DeployError, match="GPUFLEET_ANSIBLE_STRATEGY='free': unknown; expected one of "):
        deploy_specs(inventory, project_dir=project)
