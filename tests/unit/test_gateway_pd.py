"""The gateway role's P/D services (issue 39): a service with ``pd`` gets its vllm-router in P/D mode, the
fleet's key as a systemd credential its launcher turns into OPENAI_API_KEY, and its port locked to root and
HAProxy's user; any change of it restarts it (no live /add_worker), and the role waits for every prefill and
decode worker in the router's own view.

Rendered and evaluated by Ansible's own templating from the role's defaults and vars; the launcher run as its
unit runs it; the lock run with the real iptables in a network namespace of its own (root only; the host's
firewall is never touched). That a P/D router answers through the edge is the lab's to show.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import REPO
from .role_templates import RoleTemplates

ROLE = REPO / "roles" / "gateway"
LAUNCHER = ROLE / "files" / "gpufleet_router.py"
LOCK = ROLE / "files" / "gpufleet-router-lock"
WHEEL_NAME = "vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl"
# The pinned wheel: make demo's lab bundle in the checkout, else the lab bundle the lab tests keep for every
# checkout (tests/integration/conftest.py, lab_bundle: ~/.cache/gpufleet/lab-bundle)
WHEELS = (
    REPO / "dist" / "lab-bundle" / "gateway" / WHEEL_NAME,
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "gpufleet/lab-bundle/gateway"
    / WHEEL_NAME,
)
KEY = "Gw5" * 21 + "k"  # 64 characters, as the fleet's key file holds
KEY_FILE = "/etc/gpufleet/gateway/api.key"  # where the P/D routers' key lives on the gateway host (0600)
PREFILL = ["http://10.0.0.1:8100"]
DECODE = ["http://10.0.0.2:8100", "http://10.0.0.3:8100"]
HEALTH = [  # the router's own arguments after the workers and the policies
    "--health-check-interval-secs",
    "1",
    "--health-failure-threshold",
    "2",
    "--cb-timeout-duration-secs",
    "10",
]


def regular(name: str = "tiny", **more: Any) -> dict[str, Any]:
    workers = ["http://10.0.0.1:8100", "http://10.0.0.2:8100"]
    return {"name": name, "port": 8200, "metrics_port": 29200, "workers": workers, **more}


def pd_service(name: str = "chat", **pd: Any) -> dict[str, Any]:
    return {
        "name": name,
        "port": 8201,
        "metrics_port": 29201,
        "workers": PREFILL + DECODE,
        "pd": {"prefill": PREFILL, "decode": DECODE, **pd},
    }


class Role(RoleTemplates):
    """The gateway role's templates and variables on the gateway host."""

    def __init__(self, key_file: Path | None = None) -> None:
        super().__init__(
            "gateway",
            **{
                "__gateway_wheel": {
                    "path": "/bundle/gateway/vllm_router.whl",
                    "sha256": "85c96bea" + "0" * 56,
                }
            },
            gateway_api_key_file=str(key_file or "/nonexistent"),
        )

    def config(self, service: dict[str, Any], **variables: Any) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.render("router.json.j2", item=service, **variables))
        return loaded

    def dropin(self, service: dict[str, Any], **variables: Any) -> str:
        return str(self.render("gpufleet-router-pd.conf.j2", item=service, **variables))


@pytest.fixture
def role() -> Role:
    return Role()


def task(stage: str, name_start: str) -> dict[str, Any]:
    tasks = yaml.safe_load((ROLE / "tasks" / f"{stage}.yml").read_text(encoding="utf-8"))
    (found,) = [t for t in tasks if str(t.get("name", "")).startswith(name_start)]
    return dict(found)


# ----- router.json.j2: the router's arguments ---------------------------------------------------------------


def test_a_regular_router_renders_exactly_as_before(role: Role) -> None:
    """Byte for byte what the template wrote before P/D: a regular router is not restarted by the upgrade."""
    service = regular()
    args = ["--host", "127.0.0.1", "--port", "8200", "--worker-urls", *service["workers"]]
    args += [
        "--policy",
        "round_robin",
        *HEALTH,
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        "29200",
    ]
    before = {
        "path": "/opt/gpufleet/router/85c96bea0000",
        "service": {k: service[k] for k in ("name", "port", "metrics_port", "workers")},
        "args": args,
    }

    assert role.render("router.json.j2", item=service) == json.dumps(before, indent=2, sort_keys=True) + "\n"
    assert role.render("router.json.j2", item=service | {"pd": None}) == role.render(
        "router.json.j2", item=service
    )


def test_a_pd_router_gets_each_worker_by_its_role_and_no_worker_urls(role: Role) -> None:
    config = role.config(pd_service())

    assert config["args"] == [
        "--host",
        "127.0.0.1",
        "--port",
        "8201",
        "--vllm-pd-disaggregation",
        "--prefill",
        PREFILL[0],
        "--decode",
        DECODE[0],
        "--decode",
        DECODE[1],
        "--policy",
        "round_robin",
        "--prefill-policy",
        "round_robin",
        "--decode-policy",
        "round_robin",
        "--kv-connector",
        "nixl",
        *HEALTH,
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        "29201",
    ]
    assert config["service"]["workers"] == PREFILL + DECODE
    assert config["service"]["pd"] == {"prefill": PREFILL, "decode": DECODE}


@pytest.mark.parametrize(
    ("service", "gateway_policy", "expected"),
    [
        (pd_service(), "random", ("random", "random")),
        (pd_service() | {"policy": "power_of_two"}, "random", ("power_of_two", "power_of_two")),
        (pd_service(decode_policy="cache_aware"), "round_robin", ("round_robin", "cache_aware")),
        (pd_service(prefill_policy="random", decode_policy=None), "round_robin", ("random", "round_robin")),
    ],
)
def test_each_roles_policy_defaults_to_the_services(
    role: Role, service: dict[str, Any], gateway_policy: str, expected: tuple[str, str]
) -> None:
    args = role.config(service, gateway_policy=gateway_policy)["args"]

    found = (args[args.index("--prefill-policy") + 1], args[args.index("--decode-policy") + 1])
    assert found == expected


@pytest.fixture(scope="module")
def router_args(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The pinned wheel's own argument parser (vllm_router/router_args.py: plain Python, no Rust)."""
    found = next((path for path in WHEELS if path.is_file()), None)
    if found is None:
        pytest.skip(f"{WHEEL_NAME} is in no lab bundle yet (make demo or the lab tests build one)")
    folder = tmp_path_factory.mktemp("wheel")
    with zipfile.ZipFile(found) as wheel:
        wheel.extract("vllm_router/router_args.py", folder)
    spec = importlib.util.spec_from_file_location(
        "gateway_router_args", folder / "vllm_router/router_args.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.RouterArgs


def parsed(router_args: Any, args: list[str]) -> Any:
    parser = argparse.ArgumentParser()
    router_args.add_cli_args(parser, use_router_prefix=False)
    result = router_args.from_cli_args(parser.parse_args(args), use_router_prefix=False)
    result._validate_router_args()  # what the launcher runs before it starts the router
    return result


def test_the_pinned_router_reads_a_pd_routers_arguments_as_meant(role: Role, router_args: Any) -> None:
    read = parsed(router_args, role.config(pd_service(decode_policy="power_of_two"))["args"])

    assert read.vllm_pd_disaggregation is True
    assert read.prefill_urls == [(PREFILL[0], None)]
    assert read.decode_urls == DECODE
    assert read.worker_urls == []
    assert (read.prefill_policy, read.decode_policy, read.kv_connector) == (
        "round_robin",
        "power_of_two",
        "nixl",
    )


def test_the_pinned_router_reads_a_regular_routers_arguments_as_before(role: Role, router_args: Any) -> None:
    read = parsed(router_args, role.config(regular())["args"])

    assert read.vllm_pd_disaggregation is False
    assert read.worker_urls == regular()["workers"]


# ----- the key: on the host root-only, a credential of the P/D router, nowhere else ------------------------


def dropin_lines(text: str) -> dict[str, str]:
    lines = [line for line in text.splitlines() if line and not line.startswith(("#", "["))]
    return dict(line.split("=", 1) for line in lines)


def test_a_pd_routers_drop_in_loads_the_key_and_locks_its_port(role: Role) -> None:
    lines = dropin_lines(role.dropin(pd_service()))
    chain = lines["ExecStopPost"].split()[-1]

    lock = "+/usr/local/libexec/gpufleet-router-lock"
    assert lines == {
        "LoadCredential": f"key:{KEY_FILE}",
        "ExecStartPre": f"{lock} start /usr/sbin/iptables {chain} 127.0.0.1 8201 haproxy",
        "ExecStopPost": f"{lock} stop /usr/sbin/iptables {chain}",
    }
    assert chain.startswith("GPUFLEET-PD-") and len(chain + "-IN") <= 28  # iptables' longest chain name


def test_each_pd_router_has_a_chain_of_its_own(role: Role) -> None:
    chains = {dropin_lines(role.dropin(pd_service(name)))["ExecStopPost"].split()[-1] for name in ("a", "b")}
    assert len(chains) == 2


def test_the_key_the_role_copies_is_the_one_the_drop_in_loads(role: Role) -> None:
    copy = task("routers", "Copy the API key for the P/D routers")
    args = copy["ansible.builtin.copy"]

    assert role.value(args["dest"]) == KEY_FILE
    assert (args["owner"], args["mode"], copy["no_log"], copy["diff"]) == ("root", "0600", True, False)
    assert copy["when"] == "__gateway_pd_names | length > 0"
    removed = task("routers", "Remove the API key from the host when no P/D router needs it")
    assert (removed["ansible.builtin.file"]["state"], removed["when"]) == (
        "absent",
        "__gateway_pd_names | length == 0",
    )


@pytest.mark.parametrize(
    "template",
    ["router.json.j2", "gpufleet-router@.service.j2", "gpufleet-router-pd.conf.j2", "haproxy.cfg.j2"],
)
def test_the_key_is_in_no_rendered_file(tmp_path: Path, template: str) -> None:
    key_file = tmp_path / "gpufleet.apikey"
    key_file.write_text(KEY + "\n", encoding="utf-8")
    role = Role(key_file)
    text = role.render(template, item=pd_service(), gateway_services=[pd_service()])

    assert KEY not in text
    assert "Environment=OPENAI" not in text and "OPENAI_API_KEY=" not in text


def test_a_regular_router_gets_no_key_and_no_drop_in(role: Role) -> None:
    services = [regular(), regular("other", pd=None)]

    assert role.value("{{ __gateway_pd_names }}", gateway_services=services) == []
    assert role.value("{{ __gateway_pd_names }}", gateway_services=[*services, pd_service()]) == ["chat"]


# ----- the launcher: the credential becomes OPENAI_API_KEY in the router's own process ---------------------


@pytest.fixture(scope="module")
def launcher() -> Any:
    spec = importlib.util.spec_from_file_location("gpufleet_router_launcher", LAUNCHER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def credentials(tmp_path: Path, content: str) -> dict[str, str]:
    folder = tmp_path / "credentials"
    folder.mkdir()
    (folder / "key").write_text(content, encoding="utf-8")
    return {"CREDENTIALS_DIRECTORY": str(folder)}


def test_the_launcher_reads_the_credential_without_its_newline(launcher: Any, tmp_path: Path) -> None:
    assert launcher.load_key(credentials(tmp_path, KEY + "\n")) == KEY


@pytest.mark.parametrize("env", [{}, {"CREDENTIALS_DIRECTORY": "/nonexistent"}])
def test_without_a_credential_there_is_no_key(launcher: Any, env: dict[str, str]) -> None:
    assert launcher.load_key(env) is None


def test_an_empty_credential_is_refused(launcher: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is empty; expected the fleet's API key"):
        launcher.load_key(credentials(tmp_path, "\n"))


def test_the_router_gets_the_key_as_openai_api_key(launcher: Any, tmp_path: Path) -> None:
    env = credentials(tmp_path, KEY)

    assert launcher.router_environment(["--vllm-pd-disaggregation"], env) == {"OPENAI_API_KEY": KEY}
    assert launcher.router_environment(["--worker-urls", "http://a:1"], {}) == {}


def test_a_pd_router_without_a_key_is_refused_without_naming_one(launcher: Any) -> None:
    with pytest.raises(ValueError, match="found no credential 'key' and no OPENAI_API_KEY") as error:
        launcher.router_environment(["--vllm-pd-disaggregation"], {})
    assert launcher.router_environment(["--vllm-pd-disaggregation"], {"OPENAI_API_KEY": KEY}) == {}
    assert KEY not in str(error.value)


FAKE_ROUTER = {  # a TEST DOUBLE of the wheel's two modules: the real router needs replicas (the lab runs it)
    "vllm_router/__init__.py": "",
    "vllm_router/router_args.py": """
        class RouterArgs:
            @staticmethod
            def add_cli_args(parser, use_router_prefix=False):
                parser.add_argument("--vllm-pd-disaggregation", action="store_true")

            @staticmethod
            def from_cli_args(namespace, use_router_prefix=False):
                args = RouterArgs()
                args.pd = namespace.vllm_pd_disaggregation
                return args

            def _validate_router_args(self):
                pass
    """,
    "vllm_router/router.py": """
        import json, os

        class Router:
            def __init__(self, args):
                self.args = args

            @classmethod
            def from_args(cls, args):
                return cls(args)

            def start(self):
                seen = {"pd": self.args.pd, "key": os.environ.get("OPENAI_API_KEY")}
                with open(os.environ["FAKE_ROUTER_SEEN"], "w") as handle:
                    json.dump(seen, handle)
    """,
}


def run_launcher(tmp_path: Path, args: list[str], **env: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """The launcher as the unit runs it (python3 -s LAUNCHER CONFIG), on the fake router's files."""
    wheel = tmp_path / "wheel"
    for name, text in FAKE_ROUTER.items():
        (wheel / name).parent.mkdir(parents=True, exist_ok=True)
        (wheel / name).write_text(textwrap.dedent(text), encoding="utf-8")
    config = tmp_path / "router.json"
    config.write_text(json.dumps({"path": str(wheel), "service": {}, "args": args}), encoding="utf-8")
    seen = tmp_path / "seen.json"
    clean = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "CREDENTIALS_DIRECTORY")}
    done = subprocess.run(
        [sys.executable, "-s", str(LAUNCHER), str(config)],
        env=clean | env | {"FAKE_ROUTER_SEEN": str(seen)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done, json.loads(seen.read_text(encoding="utf-8")) if seen.exists() else None


def test_the_launcher_starts_a_pd_router_with_the_credentials_key(tmp_path: Path) -> None:
    done, seen = run_launcher(tmp_path, ["--vllm-pd-disaggregation"], **credentials(tmp_path, KEY + "\n"))

    assert done.returncode == 0, done.stderr
    assert seen == {"pd": True, "key": KEY}
    assert KEY not in done.stdout + done.stderr


def test_the_launcher_does_not_start_a_pd_router_without_a_key(tmp_path: Path) -> None:
    done, seen = run_launcher(tmp_path, ["--vllm-pd-disaggregation"])

    assert (done.returncode, seen) == (2, None)
    assert "found no credential 'key'" in done.stderr


def test_the_launcher_starts_a_regular_router_without_a_key(tmp_path: Path) -> None:
    done, seen = run_launcher(tmp_path, [])

    assert done.returncode == 0, done.stderr
    assert seen == {"pd": False, "key": None}


# ----- the port lock: real iptables, in a network namespace of its own -------------------------------------

NETNS_PROBE = r"""
import encodings.idna  # imported before a child turns into a user who may not read Python's own files
import json, os, socket, subprocess, sys

host, port, steps = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
if not host.startswith("127."):
    subprocess.run(["ip", "addr", "add", host + "/32", "dev", "lo"], check=True)
listener = socket.create_server((host, port))
out = {"codes": [subprocess.run(step, capture_output=True).returncode for step in steps]}


def reaches(uid):
    pid = os.fork()
    if pid == 0:
        os.setgid(uid)
        os.setuid(uid)
        try:
            socket.create_connection((host, port), timeout=5).close()
            os._exit(0)
        except OSError:
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


out["reaches"] = {str(uid): reaches(uid) for uid in (0, 1, 65534)}
out["rules"] = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True).stdout.splitlines()
print(json.dumps(out))
"""
IPTABLES = shutil.which("iptables") or "/usr/sbin/iptables"
CHAIN = "GPUFLEET-PD-0123456789ab"
NOBODY, DAEMON = (
    "65534",
    "1",
)  # the edge's user in these tests is nobody; daemon stands for any other local user


def in_own_netns(steps: list[list[str]], host: str = "127.0.0.1", port: int = 8201) -> Any:
    """The steps (commands) run in a new network namespace, with its own iptables and a listener on host:port;
    then whether root, daemon and nobody can connect to it, and the rules left."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not Path(IPTABLES).exists():
        pytest.skip("needs root, unshare and iptables (a network namespace of its own)")
    done = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", NETNS_PROBE, host, str(port), json.dumps(steps)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def start(port: int = 8201, host: str = "127.0.0.1", edge: str = "nobody") -> list[str]:
    return [str(LOCK), "start", IPTABLES, CHAIN, host, str(port), edge]


STOP = [str(LOCK), "stop", IPTABLES, CHAIN]


def test_the_lock_lets_only_root_and_the_edges_user_open_the_port() -> None:
    found = in_own_netns([start(), start()])  # a second start changes nothing

    assert found["codes"] == [0, 0]
    assert found["reaches"] == {"0": True, DAEMON: False, NOBODY: True}
    assert [rule for rule in found["rules"] if rule.endswith(f"-j {CHAIN}")] == [f"-A OUTPUT -j {CHAIN}"]


def test_without_the_edges_user_only_root_opens_the_port() -> None:
    found = in_own_netns([start(edge="no-such-user")])

    assert found["codes"] == [0]
    assert found["reaches"] == {"0": True, DAEMON: False, NOBODY: False}


def test_a_start_on_another_port_leaves_no_rule_for_the_old_one() -> None:
    found = in_own_netns([start(port=9999), start()])

    assert found["reaches"] == {"0": True, DAEMON: False, NOBODY: True}
    assert not [rule for rule in found["rules"] if "9999" in rule]


def test_a_stop_removes_every_jump_and_the_chain_and_a_second_stop_nothing() -> None:
    copied = [IPTABLES, "-w", "-I", "OUTPUT", "1", "-j", CHAIN]  # a second jump to the chain, as by hand
    found = in_own_netns([start(), copied, STOP, STOP])

    assert found["codes"] == [0, 0, 0, 0]
    assert found["reaches"] == {"0": True, DAEMON: True, NOBODY: True}
    assert not [rule for rule in found["rules"] if CHAIN in rule]


def test_a_non_loopback_address_is_also_closed_to_other_hosts() -> None:
    found = in_own_netns([start(host="10.99.0.1")], host="10.99.0.1")

    assert found["reaches"] == {"0": True, DAEMON: False, NOBODY: True}
    assert (
        f"-A {CHAIN}-IN -d 10.99.0.1/32 ! -i lo -p tcp -m tcp --dport 8201 -j REJECT --reject-with tcp-reset"
        in found["rules"]
    )
    assert f"-A INPUT -j {CHAIN}-IN" in found["rules"]
    assert not [
        rule
        for rule in in_own_netns([start(host="10.99.0.1"), STOP], host="10.99.0.1")["rules"]
        if CHAIN in rule
    ]


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["start", "iptables", CHAIN],
        ["start", "iptables", CHAIN, "127.0.0.1", "80x", "nobody"],
        ["lock", "a", "b"],
    ],
)
def test_the_lock_refuses_what_it_does_not_understand(args: list[str]) -> None:
    done = subprocess.run([str(LOCK), *args], capture_output=True, text=True, timeout=30, check=False)

    assert done.returncode == 2 and done.stderr.startswith("usage: gpufleet-router-lock")


# ----- the role's variables: no live change of a P/D router, its drop-in gone with it, its wait ------------


def slurped(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A slurp loop's registered result: each service's configuration as the host holds it."""
    return {
        "results": [
            {"item": {"name": name}, "content": base64.b64encode(json.dumps(config).encode()).decode()}
            for name, config in results.items()
        ]
    }


def live(role: Role, before: list[dict[str, Any]], after: list[dict[str, Any]]) -> tuple[Any, Any]:
    variables = {
        "gateway_services": after,
        "__gateway_configs_before": slurped({s["name"]: role.config(s) for s in before}),
        "__gateway_configs_after": slurped({s["name"]: role.config(s) for s in after}),
    }
    return role.value("{{ __gateway_live }}", **variables), role.value(
        "{{ __gateway_live_changes }}", **variables
    )


def test_a_change_of_workers_only_is_live_for_a_regular_router_and_a_restart_for_a_pd_router(
    role: Role,
) -> None:
    """A decode replica replaced by another: the P/D router's other arguments stay the same, yet it has no
    /add_worker for the new one (400), so it restarts."""
    added = "http://10.0.0.4:8100"
    before = [regular(), pd_service()]
    replaced = [DECODE[0], added]
    after = [
        regular() | {"workers": [*regular()["workers"], added]},
        pd_service() | {"workers": [*PREFILL, *replaced], "pd": {"prefill": PREFILL, "decode": replaced}},
    ]

    names, changes = live(role, before, after)

    assert names == ["tiny"]
    assert changes == [{"service": "tiny", "port": 8200, "action": "add", "worker": added}]


def test_a_service_turning_pd_is_restarted_not_changed_live(role: Role) -> None:
    service = regular("chat") | {"port": 8201, "metrics_port": 29201, "workers": PREFILL + DECODE}

    assert live(role, [service], [pd_service()]) == ([], [])
    assert live(role, [pd_service()], [service])[0] == []


def leaving(role: Role, services: list[dict[str, Any]], held: dict[str, list[str]]) -> Any:
    top = "/etc/systemd/system"
    return role.value(
        "{{ __gateway_pd_leaving }}",
        gateway_services=services,
        __gateway_dropin_dirs={
            "files": [{"path": f"{top}/gpufleet-router@{name}.service.d"} for name in held]
        },
        __gateway_dropin_files={
            "files": [
                {"path": f"{top}/gpufleet-router@{name}.service.d/{entry}"}
                for name, entries in held.items()
                for entry in entries
            ]
        },
    )


def test_the_drop_ins_of_services_gone_or_no_longer_pd_are_removed(role: Role) -> None:
    held = {
        "chat": ["pd.conf"],
        "gone": ["pd.conf"],
        "tiny": ["pd.conf", "override.conf"],
        "mine": ["x.conf"],
    }
    found = leaving(role, [pd_service(), regular()], held)

    top = "/etc/systemd/system"
    assert found == [
        {"name": "gone", "path": f"{top}/gpufleet-router@gone.service.d"},
        {"name": "tiny", "path": f"{top}/gpufleet-router@tiny.service.d/pd.conf"},  # another drop-in stays
    ]


def test_leaving_routers_stop_before_their_drop_in_goes() -> None:
    """The drop-in's ExecStopPost removes the port lock: systemd runs it only while the drop-in is loaded."""
    tasks = [t["name"] for t in yaml.safe_load((ROLE / "tasks" / "routers.yml").read_text(encoding="utf-8"))]
    stop = tasks.index(
        "Stop the routers leaving P/D mode (their drop-in's ExecStopPost removes their port lock)"
    )
    remove = tasks.index("Remove their drop-ins (with the directory when it holds nothing else)")
    reload = tasks.index("Reload systemd when a P/D router's drop-in was written or removed")
    restart = [i for i, name in enumerate(tasks) if name.startswith("Restart the routers")]
    assert stop < remove < reload < restart[0]


METRICS = """# HELP vllm_router_worker_health Worker health
vllm_router_worker_health{worker="http://10.0.0.1:8100"} 1
vllm_router_worker_health{worker="http://10.0.0.2:8100"} 0
vllm_router_worker_health{worker="http://10.0.0.3:8100"} 1
vllm_router_pd_requests_total{route="x"} 1
"""


def test_the_wait_names_each_pd_worker_its_router_finds_unhealthy(role: Role) -> None:
    check = task("wait", "Check that every P/D router finds each of its prefill and decode workers healthy")
    result = {"item": pd_service(), "status": 200, "content": METRICS}
    skipped = {"item": pd_service("other"), "skipped": True}

    unhealthy = role.value(check["vars"]["__unhealthy"], __gateway_pd_health={"results": [result, skipped]})

    assert unhealthy == {"chat": ["http://10.0.0.2:8100"]}
    healthy = METRICS.replace("} 0", "} 1")
    assert (
        role.value(
            check["vars"]["__unhealthy"], __gateway_pd_health={"results": [result | {"content": healthy}]}
        )
        == {}
    )
    message = check["ansible.builtin.assert"]["fail_msg"]
    assert "gateway_services: found" in message and "expected" in message and "Fix:" in message


def test_the_wait_reads_the_health_gauge_of_a_worker_only_when_it_is_1(role: Role) -> None:
    pattern = role.value("{{ __gateway_healthy_worker }}")
    found = role.value(
        "{{ text | regex_findall(pattern) }}",
        text=METRICS + 'vllm_router_worker_health{a="b",worker="http://x:1"} 1.0\n',
        pattern=pattern,
    )

    assert found == ["http://10.0.0.1:8100", "http://10.0.0.3:8100", "http://x:1"]


@pytest.mark.parametrize(
    ("service", "bad"),
    [
        (pd_service(), []),
        (pd_service(decode=[]), ["chat"]),
        (pd_service(decode=[*DECODE, PREFILL[0]]), ["chat"]),  # a worker in both roles
        (pd_service() | {"workers": PREFILL}, ["chat"]),  # workers not every replica of both roles
        (pd_service(prefill=["http://10.0.0.1:8100/v1"]), ["chat"]),  # not a base URL
    ],
)
def test_preflight_refuses_a_pd_service_whose_workers_do_not_add_up(
    role: Role, service: dict[str, Any], bad: list[str]
) -> None:
    check = task("preflight", "Check the P/D services")

    assert role.value(check["vars"]["__bad"], gateway_services=[regular(), service]) == bad


def test_the_wait_asks_again_until_every_pd_worker_is_healthy(role: Role) -> None:
    until = task("wait", "Ask each P/D router's exporter until")["until"]
    healthy = METRICS.replace("} 0", "} 1")

    def done(status: int, content: str) -> Any:
        answer = {"status": status, "content": content}
        return role.value("{{ " + until + " }}", item=pd_service(), __gateway_pd_health=answer)

    assert [done(200, METRICS), done(200, healthy), done(-1, healthy)] == [False, True, False]


def restarts(role: Role, item: dict[str, Any], **registered: Any) -> bool:
    """Whether routers.yml restarts the router of this configuration result (its when: conditions)."""
    restart = task("routers", "Restart the routers whose configuration")
    variables: dict[str, Any] = {
        "ansible_check_mode": False,
        "gateway_services": [regular(), pd_service()],
        "__gateway_configs_before": slurped({}),
        "__gateway_configs_after": slurped({}),
        **registered,
    }
    return all(role.value("{{ " + condition + " }}", item=item, **variables) for condition in restart["when"])


@pytest.mark.parametrize(
    "registered",
    [
        {"__gateway_pd_key": {"changed": True}},
        {"__gateway_lock_copy": {"changed": True}},
        {"__gateway_dropins": {"results": [{"item": pd_service(), "changed": True}]}},
    ],
)
def test_a_pd_router_restarts_when_its_key_lock_or_drop_in_changed_and_a_regular_one_does_not(
    role: Role, registered: dict[str, Any]
) -> None:
    assert restarts(role, {"item": pd_service(), "changed": False}, **registered)
    assert not restarts(role, {"item": regular(), "changed": False}, **registered)
    assert not restarts(role, {"item": pd_service(), "changed": False})


@pytest.mark.parametrize(
    ("entry", "restarted"),
    [
        ({"ansible_facts": {"getent_passwd": {"haproxy": None}}}, True),  # the routers started before HAProxy
        ({"ansible_facts": {"getent_passwd": {"haproxy": ["x", "108", "113"]}}}, False),
        ({"skipped": True}, False),  # no P/D router
        (None, False),  # the edge stage run alone (--tags gateway_edge)
    ],
)
def test_pd_routers_restart_once_haproxys_user_exists_if_it_did_not_when_they_started(
    role: Role, entry: dict[str, Any] | None, restarted: bool
) -> None:
    (block,) = yaml.safe_load((ROLE / "tasks" / "edge.yml").read_text(encoding="utf-8"))[:1]
    (restart,) = [t for t in block["block"] if t["name"].startswith("Restart the P/D routers")]
    variables = {"ansible_check_mode": False} | ({"__gateway_edge_user_entry": entry} if entry else {})

    assert all(role.value("{{ " + c + " }}", **variables) for c in restart["when"]) is restarted
