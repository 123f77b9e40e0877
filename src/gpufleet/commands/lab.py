"""``gpufleet lab up|down|reset|status|ssh``: a local lab of real systemd hosts for tests and Molecule."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from gpufleet.commands.output import emit, refuse
from gpufleet.lab import DEFAULT_LAB, Lab, LabError, LabInventory
from gpufleet.lab.core import INVENTORY_MARK
from gpufleet.lab.rootfs import DEFAULT_SUITE, SUITES


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``lab`` and its sub-commands to the ``gpufleet`` parser."""
    lab = subparsers.add_parser(
        "lab",
        help="local lab of systemd hosts (systemd-nspawn) for tests and Molecule",
        description="Boot, reset and tear down a local lab of systemd hosts reachable over SSH.",
    )
    commands = lab.add_subparsers(dest="lab_command", metavar="ACTION", required=True)

    up = commands.add_parser("up", help="boot fresh hosts and write their Ansible inventory")
    _add_name(up)
    up.add_argument("--nodes", type=_node_count, default=3, help="number of hosts (default: 3)")
    up.add_argument(
        "--suite", choices=SUITES, default=DEFAULT_SUITE, help="Debian suite (default: %(default)s)"
    )
    up.add_argument("--offline", action="store_true", help="hosts reach each other and this machine only")
    up.add_argument("--json", action="store_true", help="print the lab (hosts, key, inventory) as JSON")
    up.add_argument(
        "--inventory",
        type=Path,
        help="where to write the inventory (default: inventories/lab/hosts.yml for the default lab, "
        "else the lab's state dir)",
    )
    up.set_defaults(func=_guarded(_up))

    down = _add_name(commands.add_parser("down", help="tear the lab down, leaving nothing behind"))
    down.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    down.set_defaults(func=_guarded(_down))

    reset = _add_name(commands.add_parser("reset", help="replace every host by a fresh one (same addresses)"))
    reset.add_argument("--json", action="store_true", help="print the lab (hosts, key, inventory) as JSON")
    reset.set_defaults(func=_guarded(_reset))

    status = _add_name(commands.add_parser("status", help="list hosts and whether SSH answers"))
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=_guarded(_status))

    ssh = _add_name(commands.add_parser("ssh", help="ssh to a host as root (NODE: name, number or IP)"))
    ssh.add_argument("node")
    ssh.add_argument("remote", nargs=argparse.REMAINDER, help="command to run (default: a login shell)")
    ssh.set_defaults(func=_guarded(_ssh))


def _node_count(text: str) -> int:
    """--nodes: 1 to 200 hosts, refused by argparse (exit 2) before anything is created."""
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= 200 or str(count) != text.strip():
        raise argparse.ArgumentTypeError(
            f"found {text!r}; expected a whole number of hosts from 1 to 200. Fix: e.g. --nodes 3"
        )
    return count


def _add_name(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--name", default=DEFAULT_LAB, help="lab name; labs run side by side (default: %(default)s)"
    )
    return parser


def _guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A LabError is a problem for people: one message and exit 1, never a traceback."""

    @functools.wraps(handler)
    def guarded(args: argparse.Namespace) -> int:
        if os.geteuid() != 0:  # mounts, namespaces, cgroups, iptables and the state dir are root's
            print(
                f"gpufleet lab {args.lab_command}: found uid {os.geteuid()}; expected root. Fix: sudo.",
                file=sys.stderr,
            )
            return 1
        try:
            return handler(args)
        except BrokenPipeError:  # `gpufleet lab up | head -1`: the reader left; the lab is up all the same
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except LabError as exc:
            return refuse(
                str(exc).splitlines(), code=1, as_json=getattr(args, "json", False),
                prefix=f"gpufleet lab {args.lab_command}: ",
            )  # fmt: skip

    return guarded


def _report(inventory: LabInventory, action: str, seconds: float, as_json: bool) -> None:
    if as_json:
        print(json.dumps(inventory.as_dict() | {"seconds": round(seconds, 2)}, indent=2))
        return
    print(
        f"lab {inventory.name}: {action} {len(inventory.hosts)} hosts in {seconds:.1f} s ({inventory.subnet})"
    )
    for host in inventory.hosts:
        print(f"  {host.name:<8} {host.ip}")
    print(f"inventory: {inventory.inventory}")
    print(f"ssh key:   {inventory.key}")


def _up(args: argparse.Namespace) -> int:
    started = time.monotonic()
    target = args.inventory
    if target is not None and Path(target).exists():
        written_by_lab = Path(target).is_file() and Path(target).read_bytes().startswith(
            INVENTORY_MARK.encode()
        )
        if not written_by_lab:
            kind = "a directory" if Path(target).is_dir() else "a file that `gpufleet lab up` did not write"
            raise LabError(
                f"--inventory: {target}: found {kind}; expected a new file or one an earlier "
                "`gpufleet lab up` wrote (lab down removes it). Fix: pass another path, e.g. "
                "--inventory /tmp/lab-hosts.yml"
            )
    lab = Lab(args.name, nodes=args.nodes, suite=args.suite, offline=args.offline, inventory=args.inventory)
    _report(lab.up(), "up", time.monotonic() - started, args.json)
    return 0


def _down(args: argparse.Namespace) -> int:
    was_up = Lab(args.name).down()
    if args.json:
        emit({"ok": True, "name": args.name, "was_up": was_up})
    else:
        print(f"lab {args.name}: {'down' if was_up else 'was not running; nothing to do'}")
    return 0


def _reset(args: argparse.Namespace) -> int:
    started = time.monotonic()
    _report(Lab(args.name).reset(), "reset", time.monotonic() - started, args.json)
    return 0


def _status(args: argparse.Namespace) -> int:
    lab = Lab(args.name)
    hosts = lab.status()
    if args.json:
        print(json.dumps({"name": args.name, "hosts": [asdict(host) for host in hosts]}, indent=2))
    else:
        for host in hosts:
            state = host.systemd if host.ssh else ("running, no SSH" if host.processes else "stopped")
            print(f"{host.name:<8} {host.ip:<15} ssh={'yes' if host.ssh else 'no ':<3} {state}")
    return 0 if all(host.ssh for host in hosts) else 1


def _ssh(args: argparse.Namespace) -> int:
    argv = Lab(args.name).ssh_argv(args.node)
    if sys.stdin.isatty():
        argv.insert(1, "-t")
    os.execvp(argv[0], [*argv, *args.remote])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpufleet.commands.lab``: the same as ``gpufleet lab`` without the other commands."""
    parser = argparse.ArgumentParser(prog="gpufleet")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["lab", *(sys.argv[1:] if argv is None else argv)])
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
