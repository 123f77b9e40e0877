"""A local lab of real systemd hosts (systemd-nspawn + one network namespace each) for tests and Molecule.

    lab = Lab("pytest", nodes=3)
    inventory = lab.up()          # fresh hosts, SSH ready, Ansible inventory written
    lab.ssh("node2", "systemctl is-system-running")
    lab.reset()                   # fresh hosts again, in seconds
    lab.down()                    # nothing left: no mounts, netns, veths, bridge, cgroups, rules, processes

Several labs run side by side, each with its own name, /24 inside 10.231.0.0/16, bridge and hosts.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypeVar

from gpufleet.lab import host as lab_host
from gpufleet.lab import inventory as lab_inventory
from gpufleet.lab import net as lab_net
from gpufleet.lab import state as lab_state
from gpufleet.lab.inventory import DEFAULT_LAB, SSH_COMMON_ARGS, LabHost, LabInventory
from gpufleet.lab.rootfs import DEFAULT_SUITE, RootFs, ensure_rootfs
from gpufleet.lab.state import HostState, LabState
from gpufleet.lab.system import LabError, file_lock, missing_prerequisites, state_root

__all__ = ["DEFAULT_LAB", "HostStatus", "Lab", "LabError", "LabHost", "LabInventory"]

T = TypeVar("T")
SSH_READY_TIMEOUT = 120.0
INVENTORY_MARK = "# Written by `gpufleet lab up"
# lab name -> the threads deleting what this process's resets of it left behind (Lab.reset, wait=False)
_CLEANERS: dict[str, list[threading.Thread]] = {}


@dataclass(frozen=True)
class HostStatus:
    """One host as `gpufleet lab status` reports it."""

    name: str
    ip: str
    processes: int  # processes in the host's cgroups; 0 = not running
    ssh: bool  # SSH answered
    systemd: str  # `systemctl is-system-running`, or "" when SSH did not answer


def _parallel(func: Callable[[T], object], items: Iterable[T]) -> None:
    """Run ``func`` on every item at once; re-raise the first failure after all have finished."""
    items = list(items)
    with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
        for future in [pool.submit(func, item) for item in items]:
            future.result()


class Lab:
    """A named lab of ``nodes`` hosts: ``up()`` boots it; ``Lab(name)`` also reaches a running lab."""

    def __init__(
        self,
        name: str = DEFAULT_LAB,
        nodes: int = 3,
        suite: str = DEFAULT_SUITE,
        offline: bool = False,
        inventory: Path | None = None,
    ) -> None:
        self.name = lab_state.check_name(name)
        if not 1 <= nodes <= 200:
            raise LabError(f"lab: --nodes: found {nodes}; expected 1 to 200.")
        self.nodes = nodes
        self.suite = suite
        self.offline = offline
        self.inventory_path = inventory

    # ----- lifecycle -------------------------------------------------------------------------------------

    def up(self) -> LabInventory:
        """Boot fresh hosts (replacing any lab of this name, crashed or not) and write the inventory."""
        problems = missing_prerequisites()
        if problems:
            raise LabError("\n".join(problems))
        rootfs = ensure_rootfs(self.suite)
        with self._lock():
            old = lab_state.load(self.name)
            if old is not None:
                _teardown(old)
            state = self._allocate(rootfs)
            _parallel(lambda host: _start_host(state, host), state.hosts)
            _wait_for_ssh(state)
            inventory = _inventory(state)
            lab_inventory.write(inventory)
            if inventory.inventory.parent.parent == lab_state.lab_dir(self.name):
                lab_inventory.link_group_vars(inventory.inventory)
            return inventory

    def down(self) -> bool:
        """Tear the lab down completely; False (not an error) when there was no lab of that name."""
        self.wait_for_cleanup()
        with self._lock():
            state = lab_state.load(self.name)
            if state is not None:
                _teardown(state)
            return state is not None

    def reset(self, *, wait: bool = True) -> LabInventory:
        """Fresh hosts on the same network and inventory: kill, new overlay upper dirs, boot, SSH ready.

        The old upper dirs are deleted in a thread while the hosts boot; ``wait=False`` returns without
        waiting for it (a deployed lab's image layers take tens of seconds to delete). :meth:`down` and
        :meth:`wait_for_cleanup` wait for it, and so does this process at its exit (not a daemon thread).
        """
        with self._lock():
            state = lab_state.load(self.name)
            if state is None:
                raise LabError(f"lab {self.name}: not running. Fix: gpufleet lab up --name {self.name}")
            trash = lab_state.lab_dir(self.name) / f"trash-{time.monotonic_ns()}"
            _parallel(lambda host: _stop_host(state, host, trash), state.hosts)
            cleaner = threading.Thread(target=shutil.rmtree, args=(trash,), kwargs={"ignore_errors": True})
            cleaner.start()
            _CLEANERS.setdefault(self.name, []).append(cleaner)
            _parallel(lambda host: _start_host(state, host), state.hosts)
            _wait_for_ssh(state)
        if wait:
            self.wait_for_cleanup()
        return _inventory(state)

    def power_off(self, host: str) -> None:
        """Take one host away as a machine that lost power goes: its network link gone first, so its address
        stops answering (a connection to it times out; none is refused, no socket of it closes cleanly), then
        every process killed. Its disk stays: :meth:`power_on` boots it again with what it held."""
        with self._lock():
            state = self.state()
            target = _host(state, host)
            spec = target.spec()
            lab_net.delete_host_link(state.index, state.hosts.index(target) + 1, spec.netns)
            lab_host.power_off(spec)

    def power_on(self, host: str) -> None:
        """Boot a host :meth:`power_off` took away, from its own disk, on its address; returns once its SSH
        answers. A host that still runs is refused (LabError): booting it twice would take its network."""
        with self._lock():
            state = self.state()
            target = _host(state, host)
            spec = target.spec()
            if lab_host.processes(spec):
                raise LabError(
                    f"lab {self.name}: {target.hostname}: found it running; expected a host power_off() "
                    f"took away. Fix: Lab({self.name!r}).power_off({target.hostname!r}) first"
                )
            node = state.hosts.index(target) + 1
            lab_net.add_host_link(state.index, node, spec.netns, offline=state.offline)
            lab_host.make_cgroups(spec)
            lab_host.boot(spec)
            _wait_for_ssh(state, [target])

    def wait_for_cleanup(self) -> None:
        """Wait until the upper dirs that this process's resets left to delete are gone."""
        for cleaner in _CLEANERS.pop(self.name, []):
            cleaner.join()

    # ----- inspection and access -------------------------------------------------------------------------

    def state(self) -> LabState:
        state = lab_state.load(self.name)
        if state is None:
            raise LabError(f"lab {self.name}: not running. Fix: gpufleet lab up --name {self.name}")
        return state

    def inventory(self) -> LabInventory:
        """The running lab's inventory (hosts, key, inventory path)."""
        return _inventory(self.state())

    def status(self) -> list[HostStatus]:
        state = self.state()
        result: list[HostStatus] = []

        def probe(host: HostState) -> None:
            procs = len(lab_host.processes(host.spec()))
            answer = None
            with contextlib.suppress(subprocess.TimeoutExpired):  # a hung host is "no SSH", not an error
                answer = self.ssh(host.hostname, "systemctl is-system-running", timeout=10) if procs else None
            ok = answer is not None and answer.returncode in (0, 1) and bool(answer.stdout.strip())
            systemd = answer.stdout.strip() if answer is not None and ok else ""
            result.append(HostStatus(host.hostname, host.ip, procs, ok, systemd))

        _parallel(probe, state.hosts)
        return sorted(result, key=lambda status: state.hosts.index(_host(state, status.name)))

    def ssh_argv(self, host: str) -> list[str]:
        """ssh command line (without the remote command) reaching ``host`` (name, number or IP) as root."""
        state = self.state()
        target = _host(state, host)
        return ["ssh", "-i", str(state.key), *shlex.split(SSH_COMMON_ARGS), "-o", "BatchMode=yes",
                "-o", "ConnectTimeout=5", f"root@{target.ip}"]  # fmt: skip

    def ssh(
        self,
        host: str,
        command: str | Sequence[str],
        *,
        timeout: float = 120,
        check: bool = False,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on ``host`` as root (a list is shell-quoted); output is captured as text."""
        remote = command if isinstance(command, str) else shlex.join(command)
        return subprocess.run(
            [*self.ssh_argv(host), remote],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    # ----- internals -------------------------------------------------------------------------------------

    def _lock(self) -> AbstractContextManager[None]:
        return file_lock(state_root() / f".{self.name}.lock")

    def _allocate(self, rootfs: RootFs) -> LabState:
        """Pick a free /24 and create the bridge under the machine-wide network lock; save state first."""
        with file_lock(state_root() / ".network.lock"):
            index = lab_net.free_index(lab_state.taken_indexes())
            workdir = lab_state.lab_dir(self.name) / "hosts"
            hosts = [
                HostState(
                    hostname=f"node{i}",
                    ip=lab_net.host_ip(index, i),
                    machine=f"gfl{index}-node{i}",
                    netns=f"gfl-{self.name}-node{i}",
                    workdir=workdir / f"node{i}",
                    cgroups=lab_host.cgroup_dirs(self.name, f"node{i}"),
                )
                for i in range(1, self.nodes + 1)
            ]
            fallback = lab_state.lab_dir(self.name) / "inventory" / "hosts.yml"
            inventory = self.inventory_path or lab_inventory.default_inventory_path(self.name, fallback)
            state = LabState(
                name=self.name, index=index, offline=self.offline, suite=self.suite,
                lowerdir=rootfs.lowerdir, key=rootfs.key, inventory=inventory.absolute(), hosts=hosts,
            )  # fmt: skip
            lab_state.save(state)  # before any resource exists, so a crash here is cleaned by the next up
            lab_net.create_bridge(self.name, index, offline=self.offline)
            return state


def _host(state: LabState, wanted: str) -> HostState:
    for i, host in enumerate(state.hosts, start=1):
        if wanted in (host.hostname, host.ip, str(i)):
            return host
    names = ", ".join(host.hostname for host in state.hosts)
    raise LabError(
        f"lab {state.name}: host: found {wanted!r}; expected one of {names} (or its number or IP)."
    )


def _inventory(state: LabState) -> LabInventory:
    return LabInventory(
        name=state.name,
        hosts=tuple(LabHost(host.hostname, host.ip) for host in state.hosts),
        key=state.key,
        inventory=state.inventory,
        bridge_ip=lab_net.bridge_ip(state.index),
        subnet=str(lab_net.subnet(state.index)),
        offline=state.offline,
    )


def _start_host(state: LabState, host: HostState) -> None:
    spec = host.spec()
    index = state.hosts.index(host) + 1
    lab_host.mount_root(spec, state.lowerdir)
    peers = [(peer.hostname, peer.ip) for peer in state.hosts]
    lab_host.write_identity(spec, peers, offline=state.offline)
    lab_net.add_host_link(state.index, index, spec.netns, offline=state.offline)
    lab_host.make_cgroups(spec)
    lab_host.boot(spec)


def _stop_host(state: LabState, host: HostState, trash: Path | None) -> None:
    """Kill and dismantle one host; its work dir goes to ``trash`` (deleted later) or is deleted now."""
    spec = host.spec()
    lab_host.teardown(spec)
    lab_net.delete_host_link(state.index, state.hosts.index(host) + 1, spec.netns)
    if trash is None:
        shutil.rmtree(spec.workdir, ignore_errors=True)
    elif spec.workdir.exists():
        trash.mkdir(parents=True, exist_ok=True)
        spec.workdir.rename(trash / spec.hostname)


def _teardown(state: LabState) -> None:
    _parallel(lambda host: _stop_host(state, host, None), state.hosts)
    with file_lock(state_root() / ".network.lock"):
        lab_net.delete_bridge(state.name, state.index)
    for host in state.hosts:
        lab_host.remove_shared_cgroup_levels(host.spec())
    if state.inventory.is_file() and state.inventory.read_text().startswith(INVENTORY_MARK):
        state.inventory.unlink()
    shutil.rmtree(lab_state.lab_dir(state.name), ignore_errors=True)


def _wait_for_ssh(state: LabState, hosts: Sequence[HostState] | None = None) -> None:
    """Until every host (or each of ``hosts``) answers SSH; LabError naming one that does not."""
    started = time.monotonic()

    def wait(host: HostState) -> None:
        while (waited := time.monotonic() - started) < SSH_READY_TIMEOUT:
            if _port_open(host.ip, 22) and _ssh_true(state, host):
                return
            if waited > 5 and not lab_host.processes(host.spec()):
                _boot_failed(state, host, "stopped before SSH answered")
            time.sleep(0.05)
        _boot_failed(state, host, f"SSH did not answer within {SSH_READY_TIMEOUT:.0f} s")

    _parallel(wait, state.hosts if hosts is None else hosts)


def _boot_failed(state: LabState, host: HostState, what: str) -> NoReturn:
    log = host.workdir / "console.log"
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no console log)"
    raise LabError(
        f"lab {state.name}: {host.hostname} ({host.ip}): {what}. Console log ({log}) ends with:\n{tail}\n"
        f"Fix: read the log above, then `gpufleet lab down --name {state.name}` (or `up` again)."
    )


def _port_open(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.5):
            return True
    except OSError:
        return False


def _ssh_true(state: LabState, host: HostState) -> bool:
    argv = ["ssh", "-i", str(state.key), *shlex.split(SSH_COMMON_ARGS), "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=2", f"root@{host.ip}", "true"]  # fmt: skip
    return subprocess.run(argv, capture_output=True, timeout=10, check=False).returncode == 0
