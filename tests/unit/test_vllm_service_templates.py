"""The vllm_service role's files, rendered by Ansible's own templating from the role's defaults and vars.

The API key must reach `vllm serve` (vLLM reads VLLM_API_KEY; requests without the key then get 401) through
a root-only environment file, and nowhere else: not in the world-readable --config file, not on a command
line (`ps`), not in the unit. The lab tests (test_e2e.py, molecule/vllm_service) see the 401 after minutes
of deployment; this sees a dropped key in a second.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import REPO
from .role_templates import RoleTemplates

ROLE = REPO / "roles" / "vllm_service"
KEY = "Zk3" * 21 + "q"  # 64 characters, as tasks/api_key.yml generates
ENV_FILE = "/etc/gpufleet/instances/default/vllm.env"  # where the key lives on the node (vars/main.yml, 0600)


class Role(RoleTemplates):
    """The role's templates and variables as the head node of a two-node fleet sees them."""

    def __init__(self) -> None:
        super().__init__(
            "vllm_service",
            groups={"ray_head": ["node1"], "ray_workers": ["node2"]},
            hostvars={"node1": {"gpufleet_node_ip": "10.0.0.1"}, "node2": {"gpufleet_node_ip": "10.0.0.2"}},
            gpufleet_node_ip="10.0.0.1",
            gpufleet_model_dir="/opt/models/tiny",
            **{"__vllm_service_api_key": KEY},  # a literal key: a keyword would be name-mangled
        )


@pytest.fixture
def role() -> Role:
    return Role()


def start_command(script: str) -> str:
    """The `start)` branch's command that runs `vllm serve`, its continuation lines joined."""
    start = script[script.index("  start)") : script.index(";;")]
    command = start[start.index('exec "$DOCKER" exec') :]
    assert "vllm serve" in command, start
    return command


def test_the_env_file_gives_vllm_the_key(role: Role) -> None:
    lines = role.render("vllm.env.j2").splitlines()

    assert [line for line in lines if line.startswith("VLLM_API_KEY")] == [f"VLLM_API_KEY={KEY}"]


def test_extra_environment_does_not_replace_the_key(role: Role) -> None:
    lines = role.render("vllm.env.j2", vllm_service_env={"VLLM_CPU_KVCACHE_SPACE": "4"}).splitlines()

    assert f"VLLM_API_KEY={KEY}" in lines
    assert "VLLM_CPU_KVCACHE_SPACE=4" in lines


def test_vllm_serve_starts_with_the_env_file(role: Role) -> None:
    command = start_command(role.render("gpufleet-vllm.sh.j2"))

    assert f"--env-file {ENV_FILE} " in command
    assert command.index("--env-file") < command.index("vllm serve")


def test_the_role_writes_the_env_file_root_only_and_never_logs_it() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "configure.yml").read_text(encoding="utf-8"))
    (task,) = [task for task in tasks if task.get("ansible.builtin.template", {}).get("src") == "vllm.env.j2"]
    template = task["ansible.builtin.template"]

    assert (template["dest"], template["owner"], template["mode"]) == (
        "{{ __vllm_service_env_file }}",
        "root",
        "0600",
    )
    assert (task["no_log"], task["diff"]) == (True, False)


def test_the_env_file_the_role_writes_is_the_one_the_script_reads(role: Role) -> None:
    assert role.value("{{ __vllm_service_env_file }}") == ENV_FILE


@pytest.mark.parametrize(
    "template", ["vllm.yaml.j2", "gpufleet-vllm.sh.j2", "vllm@.service.j2", "vllm-instance.conf.j2"]
)
def test_the_key_is_nowhere_else(role: Role, template: str) -> None:
    text = role.render(template, vllm_service_extra_args=["--uvicorn-log-level", "warning"])

    assert KEY not in text
    assert "api-key" not in text.replace("The API key", "")


# Issue 34 step 1: every vLLM instance has an id, and everything of it is named by it.
@pytest.mark.parametrize("instance", ["default", "qwen-7b"])
def test_everything_of_an_instance_is_named_by_its_id(role: Role, instance: str) -> None:
    def value(expression: str) -> Any:
        return role.value(expression, vllm_service_instance_id=instance)

    assert value("{{ __vllm_service_config_file }}") == f"/etc/gpufleet/instances/{instance}/vllm.yaml"
    assert value("{{ __vllm_service_env_file }}") == f"/etc/gpufleet/instances/{instance}/vllm.env"
    assert value("{{ __vllm_service_ctl }}") == f"/etc/gpufleet/instances/{instance}/ctl"
    assert value("{{ __vllm_service_unit }}") == f"gpufleet-vllm@{instance}.service"
    assert value("{{ __vllm_service_template_file }}") == "/etc/systemd/system/gpufleet-vllm@.service"
    assert value("{{ __vllm_service_dropin_file }}") == (
        f"/etc/systemd/system/gpufleet-vllm@{instance}.service.d/gpufleet.conf"
    )
    assert value("{{ __vllm_service_stamp }}") == f"vllm_service@{instance}"
    assert value("{{ __vllm_service_revision_root }}") == f"/var/lib/gpufleet/revisions/{instance}"
    script = role.render("gpufleet-vllm.sh.j2", vllm_service_instance_id=instance)
    assert f"UNIT=gpufleet-vllm@{instance}.service\n" in script
    assert f"MARK=GPUFLEET_VLLM_SERVICE=gpufleet-vllm@{instance}\n" in script
    assert f"--config /etc/gpufleet/instances/{instance}/vllm.yaml" in start_command(script)


def test_only_the_default_instance_takes_over_the_files_of_the_release_before_instances(role: Role) -> None:
    legacy = [
        "/etc/gpufleet/vllm.yaml",
        "/etc/gpufleet/vllm.env",
        "/usr/local/libexec/gpufleet-vllm",
        "/etc/systemd/system/gpufleet-vllm.service",
    ]
    files = role.value("{{ __vllm_service_revision_files }}")
    assert (
        files[-4:] == legacy
    )  # a revision records them (absent), so a rollback across the migration is whole
    assert role.value("{{ __vllm_service_legacy_files }}", vllm_service_instance_id="other") == []
    assert not set(legacy) & set(
        role.value("{{ __vllm_service_revision_files }}", vllm_service_instance_id="other")
    )


def test_the_template_unit_runs_each_instance_from_its_own_directory(role: Role) -> None:
    unit = role.render("vllm@.service.j2")
    assert "ExecStart=/etc/gpufleet/instances/%i/ctl start\n" in unit
    assert "ExecStopPost=/etc/gpufleet/instances/%i/ctl stop\n" in unit
    dropin = role.render("vllm-instance.conf.j2", vllm_service_restart_sec=7)
    assert "Requires=gpufleet-ray.service\n" in dropin
    assert "PartOf=gpufleet-ray.service\n" in dropin
    assert "RestartSec=7\n" in dropin


@pytest.mark.parametrize("instance", ["../etc", "Default", "a b", ""])
def test_an_id_that_could_leave_its_directory_is_never_used(role: Role, instance: str) -> None:
    with pytest.raises(Exception, match="vllm_service_instance_id: found"):
        role.value("{{ __vllm_service_config_dir }}", vllm_service_instance_id=instance)


IMAGE_ID = "sha256:" + "c" * 64
OWN = {
    "vllm_service_instance_id": "tiny-0",
    "vllm_service_nodes": ["node1"],
    "vllm_service_executor": "mp",
    "vllm_service_own_container": True,
    "__vllm_service_image_id": IMAGE_ID,
}


def own_start(script: str) -> str:
    """The `start)` branch of an instance in its own container, its continuation lines joined."""
    start = script[script.index("  start)") : script.index(";;")]
    return start.replace("\\\n", " ")


def test_a_replica_runs_its_image_by_id_in_a_container_of_its_own(role: Role) -> None:
    """A replica of a service (vllm_service_own_container): its unit's control script replaces its own
    container with `docker run` of the image by ID, the model and the instance's directory mounted read-only,
    the key through the root-only env file; stop stops that container only. Its image ID is written into the
    script, so an image change is a change of the replica's files (it rolls, and a revision restores it)."""
    script = role.render("gpufleet-vllm.sh.j2", **OWN)
    start = own_start(script)
    assert "CONTAINER=gpufleet-vllm-tiny-0\n" in script
    assert '"$DOCKER" run --rm --name "$CONTAINER" --init --pull=never --network=host' in start
    assert f"--entrypoint vllm {IMAGE_ID}" in start and "docker exec" not in start and '" exec ' not in start
    assert "--volume=/opt/models/tiny:/opt/models/tiny:ro" in start
    assert "--volume=/etc/gpufleet/instances/tiny-0:/etc/gpufleet/instances/tiny-0:ro" in start
    assert "--env-file /etc/gpufleet/instances/tiny-0/vllm.env" in start and KEY not in script
    assert "serve --config /etc/gpufleet/instances/tiny-0/vllm.yaml" in start
    stop = script[script.index("  stop)") :]
    stop = stop[: stop.index(";;")]
    # its processes signalled from the host's /proc, then the container removed
    assert stop.index("processes stop || true") < stop.index("\n    removed\n")
    other = role.render("gpufleet-vllm.sh.j2", **(OWN | {"__vllm_service_image_id": "sha256:" + "d" * 64}))
    assert other != script
    env = role.render("vllm.env.j2", **OWN)
    assert f"VLLM_API_KEY={KEY}\n" in env and "VLLM_HOST_IP=10.0.0.1\n" in env


def test_a_replica_on_one_device_runs_vllms_own_in_process_executor(role: Role) -> None:
    """One device needs no executor: a replica at TP 1 renders no distributed-executor-backend (vLLM runs its
    worker in its engine's process, one process less); two devices of its node take mp; the one instance
    before services keeps the mp executor it always had (its node settings too)."""
    backend = "{{ __vllm_service_backend }}"
    assert role.value(backend, **OWN) == "uni"
    assert role.value(backend, **OWN, vllm_service_tensor_parallel_size=2) == "mp"
    replica_only = ("vllm_service_nodes", "vllm_service_own_container")
    one_instance = {k: v for k, v in OWN.items() if k not in replica_only}
    assert role.value(backend, **one_instance) == "mp"


def test_a_replicas_vllm_caches_outlive_its_container(role: Role) -> None:
    """Its container is removed on every stop (`docker run --rm`): vLLM's caches (torch.compile's artifacts,
    the model inspection) and Triton's live in a directory of the instance on the node, mounted read-write,
    so a restarted replica does not compile again; the node's container keeps its own (it is not removed)."""
    start = own_start(role.render("gpufleet-vllm.sh.j2", **OWN))
    cache = "/var/cache/gpufleet/vllm/tiny-0"
    assert f"--volume={cache}:{cache} " in start
    env = role.render("vllm.env.j2", **OWN)
    assert f"VLLM_CACHE_ROOT={cache}\n" in env and f"TRITON_CACHE_DIR={cache}/triton\n" in env
    shared = {**OWN, "vllm_service_own_container": False}
    assert "VLLM_CACHE_ROOT" not in role.render("vllm.env.j2", **shared)


def test_a_replica_in_its_own_container_does_not_restart_with_the_nodes_container(role: Role) -> None:
    own = role.render("vllm-instance.conf.j2", **OWN)
    assert "Requires=docker.service\n" in own and "PartOf" not in own and "gpufleet-ray" not in own
    assert "SuccessExitStatus=143\n" in own  # docker run's status after the SIGTERM of a stop
    shared = role.render("vllm-instance.conf.j2", vllm_service_own_container=False)
    assert "PartOf=gpufleet-ray.service\n" in shared


def test_a_replicas_container_takes_the_node_containers_flags_and_their_defaults(role: Role) -> None:
    """Without ray_cluster's inputs the flags are ray_cluster's defaults (this role repeats them); with them,
    the node's container's flags (the lab refuses memlock, for instance)."""
    ray = yaml.safe_load((REPO / "roles/ray_cluster/defaults/main.yml").read_text(encoding="utf-8"))
    names = ("ray_cluster_shm_size", "ray_cluster_ipc_host", "ray_cluster_privileged", "ray_cluster_ulimits")
    names += ("ray_cluster_volumes", "ray_cluster_docker_args")
    defaults = {name: ray[name] for name in names}
    flags = "{{ __vllm_service_run_flags }}"
    assert role.value(flags, **OWN) == role.value(flags, **OWN, **defaults)
    lab = role.value(
        flags, **OWN, ray_cluster_ulimits=["stack=1:1"], ray_cluster_ipc_host=True, gpufleet_gpu=False
    )
    assert lab[:2] == ["--ipc=host", "--ulimit=stack=1:1"], lab
    assert "--gpus=all" in role.value(flags, **OWN)  # a GPU node by default


FAKE_DOCKER = """#!/bin/sh
# a docker CLI double: the node's container runs with the test's process as its init (its process table
# is this machine's); the replica's own container is not there
case "$1 $*" in
  "inspect "*" gpufleet-ray") echo "true $GPUFLEET_TEST_INIT"; exit 0 ;;
  "rm "*) exit 0 ;;
esac
exit 1
"""


def ctl_beside_a_docker_double(role: Role, tmp_path: Path, instance: str, **more: Any) -> Path:
    """The control script of replica ``instance`` (stop timeout 5 s; ``more`` variables last), its docker the
    double above."""
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    script = tmp_path / "ctl"
    variables = OWN | {"vllm_service_instance_id": instance, "vllm_service_docker": str(docker)} | more
    script.write_text(role.render("gpufleet-vllm.sh.j2", **variables, vllm_service_stop_timeout=5))
    script.chmod(0o755)
    return script


def run_ctl(script: Path, action: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``script ACTION`` run to its end, its docker double's node container this machine's PID namespace."""
    return subprocess.run(
        [str(script), action],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "GPUFLEET_TEST_INIT": str(os.getpid()), **env},
    )


def spawn(command: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["sh", "-c", command], env={**os.environ, **env}, start_new_session=True, stdout=subprocess.PIPE
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="reads every process's /proc/PID/environ: root")
def test_a_replicas_stop_also_ends_its_vllm_left_in_the_nodes_container_and_nothing_else(
    role: Role, tmp_path: Path
) -> None:
    """A replica upgraded from a release that ran it in the node's container (`docker exec`): its new
    control script's stop (and start) ends the processes of that old run - the sessions of the processes
    marked as this instance - and leaves another instance's and unmarked ones alone. The double's node
    container is this machine's PID namespace; the instance id is unique, so no other process here carries
    its mark."""
    instance = f"t{os.getpid()}"
    script = ctl_beside_a_docker_double(role, tmp_path, instance)
    mark = {"GPUFLEET_VLLM_SERVICE": f"gpufleet-vllm@{instance}"}
    # this instance's old run: its marked server and, in its session, a child without the mark (vLLM's engine)
    mine = spawn("env -u GPUFLEET_VLLM_SERVICE sleep 302 & echo $!; exec sleep 301", **mark)
    other = spawn("exec sleep 303", GPUFLEET_VLLM_SERVICE=f"gpufleet-vllm@{instance}x")
    unmarked = spawn("exec sleep 304")
    assert mine.stdout is not None
    child = int(mine.stdout.readline())
    try:
        done = run_ctl(script, "stop")
        assert done.returncode == 0, done.stderr
        assert mine.wait(timeout=10) is not None
        with pytest.raises(ProcessLookupError):
            for _ in range(20):  # the child is the init's to reap: gone, or a zombie for a moment
                os.kill(child, 0)
                if Path(f"/proc/{child}/stat").read_text().split(") ")[1][0] in "ZX":
                    raise ProcessLookupError
                time.sleep(0.1)
        assert other.poll() is None and unmarked.poll() is None
    finally:
        for process in (mine, other, unmarked):
            process.kill()
            process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, 9)


@pytest.mark.skipif(os.geteuid() != 0, reason="reads every process's /proc/PID/environ: root")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell a bound process")
def test_a_stopped_process_bound_to_one_core_may_exit_on_every_core(role: Role, tmp_path: Path) -> None:
    """vLLM's CPU build binds its workers to one core: stopped there among busy workers, one took minutes to
    exit (its container could not be removed meanwhile). The stop lets every thread of a process it stops run
    on each CPU of the node before it signals it: here a marked process that ignores SIGTERM, bound to CPU 0,
    is unbound while the stop waits out its timeout, then killed."""
    instance = f"b{os.getpid()}"
    script = ctl_beside_a_docker_double(role, tmp_path, instance)
    everywhere = os.sched_getaffinity(0)
    bound = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; while :; do sleep 0.2; done"],
        env={**os.environ, "GPUFLEET_VLLM_SERVICE": f"gpufleet-vllm@{instance}"},
        start_new_session=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(everywhere)}),  # noqa: PLW1509 (no threads here)
    )
    stopping = subprocess.Popen(
        [str(script), "stop"],
        env={**os.environ, "GPUFLEET_TEST_INIT": str(os.getpid())},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert os.sched_getaffinity(bound.pid) == {min(everywhere)}
        seen = set()
        for _ in range(40):  # within the stop's 5 s of SIGTERM, before its SIGKILL
            seen = os.sched_getaffinity(bound.pid)
            if seen == everywhere:
                break
            time.sleep(0.1)
        assert seen == everywhere, seen
        assert stopping.wait(timeout=60) == 0
        assert bound.wait(timeout=10) == -signal.SIGKILL
    finally:
        for process in (bound, stopping):
            process.kill()
            process.wait()


NVIDIA_SMI = """#!/bin/sh
# an nvidia-smi double: one compute process, the test's, holding 1234 MiB
echo "$GPUFLEET_TEST_GPU_PID, 1234, sleep"
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="reads every process's /proc/PID/environ: root")
def test_procs_names_gpu_memory_held_by_a_process_outside_the_service(role: Role, tmp_path: Path) -> None:
    """`procs` of an instance in the node's container: GPU memory that nvidia-smi shows held by a process in
    that container outside the instance's service is listed with its PID, MiB and command (nvidia-smi and
    docker are doubles; the double's node container is this machine's PID namespace)."""
    instance = f"g{os.getpid()}"
    script = ctl_beside_a_docker_double(role, tmp_path, instance, vllm_service_own_container=False)
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(NVIDIA_SMI)
    smi.chmod(0o755)
    holder = spawn("exec sleep 305")
    try:
        done = run_ctl(
            script,
            "procs",
            PATH=f"{smi.parent}:{os.environ['PATH']}",
            GPUFLEET_TEST_GPU_PID=str(holder.pid),
        )
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        assert found["gpu"]["checked"], found["gpu"]
        assert found["gpu"]["outside"] == [
            {"pid": holder.pid, "mib": 1234, "cmd": "sleep 305", "in_container": True}
        ], found["gpu"]
    finally:
        holder.kill()
        holder.wait()


def test_a_pd_replica_gets_its_kv_connector_and_its_environment(role: Role) -> None:
    """A P/D replica (playbooks/tasks/replica.yml from the placement): --kv-transfer-config in its --config
    file as vLLM takes it (a JSON string), the connector's environment in its env file; none for other
    replicas."""
    connector = {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.2", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601"}
    settings = yaml.safe_load(role.render("vllm.yaml.j2", **OWN, vllm_service_kv_transfer_config=connector))
    assert json.loads(settings["kv-transfer-config"]) == connector
    lines = role.render("vllm.env.j2", **OWN, vllm_service_kv_transfer_env=env).splitlines()
    assert {"VLLM_NIXL_SIDE_CHANNEL_HOST=10.0.0.2", "VLLM_NIXL_SIDE_CHANNEL_PORT=5601"} <= set(lines)
    assert "kv-transfer-config" not in yaml.safe_load(role.render("vllm.yaml.j2", **OWN))
    assert "NIXL" not in role.render("vllm.env.j2", **OWN)


def test_prune_before_the_replicas_start_takes_only_the_instances_on_a_port_placed_now(role: Role) -> None:
    """serve.yml frees the ports that replicas no longer placed hold before the replicas placed now start (a
    service replaced by another on the same node and port); without ports, prune takes every instance not
    kept, never `default` (the one-model form's)."""
    found = {"files": [{"path": f"/etc/gpufleet/instances/{i}"} for i in ("default", "a-0", "b-0", "c-0")]}

    def read(instance: str, port: int) -> dict[str, Any]:
        return {"item": instance, "content": base64.b64encode(f"model: /m\nport: {port}\n".encode()).decode()}

    configs = {"results": [read("b-0", 8100), read("c-0", 8101), {"item": "d-0", "failed": True}]}
    common = {"__vllm_service_instances_found": found, "vllm_service_instances_kept": ["a-0"]}
    assert role.value("{{ __vllm_service_not_kept }}", **common) == ["b-0", "c-0"]
    assert role.value("{{ __vllm_service_pruned }}", **common) == ["b-0", "c-0"]
    early = {**common, "vllm_service_prune_ports": [8100], "__vllm_service_not_kept_configs": configs}
    assert role.value("{{ __vllm_service_pruned }}", **early) == ["b-0"]


def test_admit_and_drain_act_only_on_the_router_the_gateway_configured_for_the_service(role: Role) -> None:
    """A service new in this deploy has no router configuration yet, and the port the placement gives it may
    still be another service's router (a service replaced or removed): admit and drain leave that one
    alone."""
    router = {"url": "http://127.0.0.1:8200", "config": "/etc/gpufleet/gateway/tiny.json"}

    def read(port: int) -> dict[str, Any]:
        config = {"service": {"port": port, "workers": ["http://10.0.0.1:8100"]}}
        return {"content": base64.b64encode(json.dumps(config).encode()).decode()}

    ours = "{{ __vllm_service_router_ours }}"
    assert role.value(ours, vllm_service_router=router, __vllm_service_router_config=read(8200)) is True
    assert role.value(ours, vllm_service_router=router, __vllm_service_router_config=read(8201)) is False
    assert (
        role.value(ours, vllm_service_router=router, __vllm_service_router_config={"failed": True}) is False
    )
    workers = role.value("{{ __vllm_service_router_workers }}", vllm_service_router=router,
                         __vllm_service_router_config=read(8200))  # fmt: skip
    assert workers == ["http://10.0.0.1:8100"]
