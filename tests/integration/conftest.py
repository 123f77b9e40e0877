"""Fixtures for tests that need real hosts: a gpufleet lab (systemd-nspawn hosts with SSH) per session.

    def test_something(lab: RunningLab) -> None:
        result = lab.playbook("site.yml", "--limit", "ray_head")   # ansible-playbook against the lab
        assert result.returncode == 0, result.stdout
        assert lab.ssh("node2", "systemctl is-active docker").stdout.strip() == "active"

``lab`` is one OFFLINE lab of three hosts for the whole session (node1 = ray_head, node2 + node3 =
ray_workers): hosts reach each other and this machine (``lab.inventory.bridge_ip``), nothing else, so no
test can send traffic beyond loopback and the lab. Its name is ``pytest-<pid>`` so that two pytest runs
on one machine never share hosts; labs of runs that died are removed at the next session start. Tests
that need other hosts make their own ``Lab`` (see test_lab_cycle.py) and must ``down()`` it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from gpufleet.lab import Lab, LabInventory
from gpufleet.lab.demo import DIST, build_lab_bundle
from gpufleet.lab.state import load as load_lab_state
from gpufleet.lab.system import cache_dir, file_lock, missing_prerequisites, state_root
from gpufleet.runner.arguments import strategy_env
from gpufleet.runner.transport import transport_crash

REPO = Path(__file__).resolve().parents[2]
if (
    str(REPO) not in sys.path
):  # tests.monitoring_assets: the dashboards' and rules' queries, shared with tests/unit
    sys.path.insert(0, str(REPO))
VENV_BIN = Path(sys.executable).parent
SESSION_LAB_NODES = 3
OWNED_LAB = re.compile(r"^pytest(?:-[a-z]+)?-(\d+)$")  # pytest-<pid>, pytest-<purpose>-<pid>


def lab_name(purpose: str = "") -> str:
    """A lab name owned by this pytest process (cleaned up by a later session if this one dies)."""
    return f"pytest-{purpose}-{os.getpid()}" if purpose else f"pytest-{os.getpid()}"


def skip_unless_lab_possible() -> None:
    """Skip where the lab cannot run (not root, packages missing); fail instead where CI is set.

    In CI (``CI`` set, as CI systems do, or ``GPUFLEET_REQUIRE_LAB=1``) a skipped lab test would let the
    suite pass without the lab tests having run.
    """
    problems = missing_prerequisites()
    if not problems:
        return
    reason = "the lab cannot run here: " + " ".join(problems)
    if os.environ.get("CI") or os.environ.get("GPUFLEET_REQUIRE_LAB"):
        pytest.fail(f"{reason} (CI or GPUFLEET_REQUIRE_LAB is set: lab tests must run)", pytrace=False)
    pytest.skip(reason)


def remove_orphaned_labs() -> None:
    """Labs named by a pytest process that no longer exists: a crashed or killed earlier run."""
    root = state_root()
    for directory in root.iterdir() if root.is_dir() else []:
        match = OWNED_LAB.match(directory.name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            Lab(directory.name).down()


def ansible_env() -> dict[str, str]:
    """Environment for ansible-playbook / molecule from this venv, with the repository's ansible.cfg.

    The strategy is the runner's (``strategy_env``: mitogen's unless GPUFLEET_ANSIBLE_STRATEGY=linear), so
    the roles are tested as ``gpufleet deploy`` runs them, at about 60 % of the CPU of Ansible's own
    (measured: the docker scenario, 184 CPU-s under linear, 115 under mitogen_linear). Ansible's own
    strategy, which a plain ``ansible-playbook site.yml`` uses, keeps a scenario of its own (test_molecule).
    """
    env = dict(os.environ)
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_NOCOLOR="1",
        PY_COLORS="0",
    )
    env.update(strategy_env(os.environ))
    return env


def run_playbook(
    argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` (an ansible-playbook command) from the repository, stdout and stderr together in ``.stdout``.

    Run once more when its output shows a known crash of the connection layer, as ``gpufleet deploy`` runs
    such a stage again (gpufleet.runner.transport): a test of a role or playbook should not fail on
    mitogen-hq/mitogen#1314, which struck one CI run of 40 minutes' worth of playbooks."""
    for _ in range(2):
        result = subprocess.run(
            list(argv),
            cwd=REPO,
            env=dict(env) if env is not None else ansible_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode == 0 or transport_crash(result.stdout) is None:
            break
    return result


@dataclass
class RunningLab:
    """A lab that is up: its ``Lab`` handle, where its hosts are, and helpers to reach them."""

    lab: Lab
    inventory: LabInventory

    @property
    def hosts(self) -> list[str]:
        return [host.name for host in self.inventory.hosts]

    def ssh(
        self, host: str, command: str | Sequence[str], timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on ``host`` as root; never raises on a non-zero exit (check returncode)."""
        return self.lab.ssh(host, command, timeout=timeout)

    def playbook(
        self, playbook: str | Path, *args: str, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        """ansible-playbook ``playbook`` (relative to the repository) against this lab's inventory.

        Output (stdout and stderr together) is in ``.stdout``; assert on ``.returncode`` yourself.
        """
        argv = [
            str(VENV_BIN / "ansible-playbook"),
            "-i",
            str(self.inventory.inventory),
            str(REPO / playbook),
            *args,
        ]
        return run_playbook(argv, timeout=timeout)


# ----- the suite's order ----------------------------------------------------------------------------------
# `make test` runs pytest on both cores (pytest-xdist, --dist loadfile --no-loadscope-reorder): every
# file goes whole to one worker, in collection order, and a worker takes the next file when it is nearly
# done with its own. Starting with the two longest files (the deployed labs, 13-18 minutes each of a busy
# machine), one on each worker, lets both work through every other file after them; a long file taken last
# would leave one worker idle at the end. This hook, although in this folder, orders the whole session's
# items (tests/unit and tests/test_lint.py too); a conftest.py in tests/ would make ruff take every
# `from conftest import` for a first-party import.
# Longest first, from `--durations=0` of `make test` on the 2-core machine (2026-12-04,
# benchmarks/results/suite-time.md): the two deployed-lab files, one on each worker, each on its worker's
# session lab (the linters first on the second worker: a lint failure shows in a minute); every other file
# goes to whichever worker is nearly done first.
SLOWEST_FIRST = (
    "tests/integration/test_e2e.py",  # one deployed lab (one instance) for every test in it (~800 s)
    "tests/test_lint.py",  # the linters (~60 s): early, so that a lint failure shows early
    "tests/integration/test_services.py",  # services on the other worker's lab (~1,100 s)
    "tests/integration/test_molecule.py",  # the roles' scenarios, in two files (~350 s and ~300 s)
    "tests/integration/test_molecule_driver_artifacts.py",
    "tests/integration/test_image_distribution.py",
    "tests/integration/test_relay_trust.py",
    "tests/integration/test_model_fetch.py",
    "tests/integration/test_lab_docker.py",
    "tests/integration/test_cancel.py",
    "tests/integration/test_collection.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files named in SLOWEST_FIRST first, in that order; then the others as collected."""
    rank = {path: index for index, path in enumerate(SLOWEST_FIRST)}
    # a stable sort: the files not named, and every file's own tests, keep their order
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))


@pytest.fixture(scope="session")
def lab() -> Iterator[RunningLab]:
    """One offline lab of three hosts for the session; torn down at the end, whatever the tests did."""
    skip_unless_lab_possible()
    remove_orphaned_labs()
    handle = Lab(lab_name(), nodes=SESSION_LAB_NODES, offline=True)
    try:
        yield RunningLab(handle, handle.up())
    finally:
        handle.down()


@pytest.fixture(scope="session")
def lab_bundle() -> Path:
    """The lab bundle (what ``make demo`` deploys), kept in ~/.cache/gpufleet/lab-bundle for every checkout.

    A fresh clone re-checks it against this checkout's lab manifest (seconds: the verified-file cache) instead
    of copying 2.1 GiB again; one worker builds it while another waits. A bundle that no longer verifies
    (a file the manifest dropped) is built again from nothing.
    """
    bundle, console = cache_dir().parent / "lab-bundle", Console(stderr=True)
    bundle.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(bundle.with_suffix(".lock")):
        try:
            return build_lab_bundle(bundle, DIST / "lab-demo", console)
        except RuntimeError as problem:
            console.print(f"lab bundle: {problem}; building it again from nothing")
            shutil.rmtree(bundle)
            return build_lab_bundle(bundle, DIST / "lab-demo", console)


@pytest.fixture(scope="session")
def ansible_playbook(lab: RunningLab) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``ansible_playbook(path, *args) -> CompletedProcess``: run a playbook against the session lab."""
    return lab.playbook


@pytest.fixture
def own_lab() -> Iterator[list[Lab]]:
    """Labs a test creates itself: append each ``Lab`` and it is torn down after the test, pass or fail."""
    skip_unless_lab_possible()
    labs: list[Lab] = []
    try:
        yield labs
    finally:
        for handle in labs:
            handle.down()


MOLECULE_ACTIONS = ("check", "converge", "idempotence", "verify", "destroy")


FAILURE_MARKS = re.compile(r"^(?:fatal:|failed:|ERROR!|Traceback|.*FAILED!)", re.MULTILINE)


def what_failed(out: str, most: int = 3, lines: int = 30) -> str:
    """The first ``most`` failures in an Ansible/Molecule output, ``lines`` lines each, for an assertion's
    message: a failure early in a long run (CI's stop 48: a failed destroy) is not in the output's tail."""
    found = []
    for match in list(FAILURE_MARKS.finditer(out))[:most]:
        found.append("\n".join(out[match.start() :].splitlines()[:lines]))
    return "".join(f"--- failure {n} of the output ---\n{text}\n" for n, text in enumerate(found, 1))


def run_molecule(scenario: str, extra_env: dict[str, str] | None = None, timeout: int = 1800) -> str:
    """``molecule test -s SCENARIO`` on a lab owned by this pytest process; returns Molecule's output.

    Asserts that Molecule succeeded, that every action of the sequence (and prepare, where the scenario
    has one) ran successfully, that a second check on converged hosts changed nothing, and that destroy
    left no lab behind.
    """
    skip_unless_lab_possible()
    name = lab_name("molecule")
    env = ansible_env() | (extra_env or {}) | {"GPUFLEET_MOLECULE_LAB": name}
    del env["ANSIBLE_CONFIG"]  # Molecule writes and uses its own ansible.cfg (molecule/shared/base.yml)
    result = subprocess.run(
        [str(VENV_BIN / "molecule"), "test", "--scenario-name", scenario],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    out = result.stdout
    tail = what_failed(out) + out[-8000:]
    assert result.returncode == 0, tail
    step = rf"{re.escape(scenario)} (?:➜|>) "  # "➜" on a terminal, ">" elsewhere
    actions = [*MOLECULE_ACTIONS, *(["prepare"] if re.search(step + r"prepare\]?:? Executing", out) else [])]
    # Molecule's closing DETAILS list says "<scenario> > idempotence: Executed: Successful" even when the
    # idempotence step failed (seen with Molecule 26.10): only the live "[<scenario> > <action>]" lines count.
    for action in actions:
        assert re.search(r"\[" + step + action + r"\] Executed: Successful", out), tail
    assert "Executed: Failed" not in out, tail
    assert "Idempotence test failed" not in out, tail
    checks = [match.end() for match in re.finditer(step + r"check\]?:? Executing", out)]
    if len(checks) > 1:  # the second check runs on converged hosts: nothing may change
        last = out[checks[-1] :]
        changed = re.findall(r"changed=(\d+)", last[: last.index("Executed")])
        assert changed and set(changed) == {"0"}, last[-3000:]
    assert load_lab_state(name) is None, f"destroy left the lab {name} up"
    return out


# ----- the wheel, installed in a fresh venv outside the checkout (test_install.py, test_e2e.py) ------------


def shared_between_workers(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder every pytest-xdist worker of this run finds at the same place (the run's base temporary
    folder; the session's own one in a run without workers). Hold ``file_lock(folder.with_suffix(".lock"))``
    while filling it."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name


@pytest.fixture(scope="session")
def gpufleet_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout now (the product as pip would install it); built once per run,
    whichever worker asks first (test_install.py and test_e2e.py run on different ones)."""
    out = shared_between_workers(tmp_path_factory, "wheel")
    with file_lock(out.with_suffix(".lock")):
        if not list(out.glob("gpufleet-*.whl")):
            out.mkdir(exist_ok=True)
            subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(REPO)],
                check=True, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
    (built,) = out.glob("gpufleet-*.whl")
    return built


@pytest.fixture(scope="session")
def installed_gpufleet(gpufleet_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel and its dependencies (from the index); its bin directory. Made once
    per run, like the wheel."""
    venv = shared_between_workers(tmp_path_factory, "venv")
    done = venv / ".installed"
    with file_lock(venv.with_suffix(".lock")):
        if not done.exists():
            shutil.rmtree(venv, ignore_errors=True)  # a worker that died halfway
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            subprocess.run(
                [str(venv / "bin/pip"), "install", "--quiet", str(gpufleet_wheel)],
                check=True, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            done.touch()
    return venv / "bin"


def run_installed(
    bin_dir: Path, *args: str, cwd: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``gpufleet ARGS`` from the installed wheel, with no way back to the checkout (no GPUFLEET_HOME)."""
    return subprocess.run(
        [str(bin_dir / "gpufleet"), *args],
        cwd=cwd, env=installed_env(bin_dir), capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def installed_env(bin_dir: Path) -> dict[str, str]:
    """The environment for the installed wheel's ``gpufleet``: its bin directory first on PATH, and nothing
    that leads back to the checkout (GPUFLEET_HOME, PYTHONPATH, VIRTUAL_ENV)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GPUFLEET_HOME", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    return env
