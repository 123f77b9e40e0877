#!/usr/bin/env python3
"""Distribution benchmarks (run as root on a lab-capable machine; writes nothing outside /tmp and the lab).

1. An artifact (default 1 GiB) from the control node to 1 and to N lab hosts, every link throttled to the
   same rate with tc (each host's download and upload, and the control node's uplink on the lab bridge):
   - naive:  the control node copies to every host over SSH, all at once (what `copy` does per host);
   - fanout: the control node copies to the seed over SSH once, then the seed starts the pipelined chain
             (gpufleet_relay.py) through the other hosts -- the roles' `fanout` strategy;
   - chain:  the control node itself heads the chain (no SSH hop) -- the roles' `chain` strategy, what
             `auto` picks when the control node reaches the cluster network.
   Both chain rows run the relay program the roles ship (roles/relay/files/gpufleet_relay.py),
   copied to every host, as the roles do.
   With --vanish K: one more chain copy to every host, during which host K's network goes away 10 s into
   the stream (``ip link set eth0 down`` in its namespace: no reset, as when a node loses power); the row
   is the time from the cut to the sender's failure, and the failure it names (issue 15: within 30 s).
2. git-lfs pull of a many-object repository from the local LFS server with lfs.concurrenttransfers 8
   (git-lfs's default) vs 64, each download limited per connection (as a CDN limits a connection).

    .venv/bin/python benchmarks/distribution.py [--size-mib 1024] [--nodes 1 3] [--rate-mbit 400]
        [--strategies naive fanout chain] [--skip-lfs] [--skip-distribution]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpufleet.bundle.lfs import LfsServer, make_lfs_repo
from gpufleet.lab import Lab

REPO = Path(__file__).resolve().parents[1]
RELAY = REPO / "roles/relay/files/gpufleet_relay.py"
PORT = 18499
REMOTE = "/var/tmp/bench.bin"
TOKEN = "/var/tmp/relay.token"  # the per-run token the relay requires (0600), on every host and here


def sh(argv: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, check=True, capture_output=True, **kw)  # type: ignore[call-overload]


def throttle(lab: Lab, rate_mbit: int) -> None:
    state = lab.state()
    spec = ["tbf", "rate", f"{rate_mbit}mbit", "burst", "512kb", "latency", "100ms"]
    sh(["tc", "qdisc", "replace", "dev", f"gflbr{state.index}", "root", *spec])  # control node uplink
    for number, host in enumerate(state.hosts, start=1):
        sh(["tc", "qdisc", "replace", "dev", f"gfl{state.index}n{number}", "root", *spec])  # host download
        sh(
            ["ip", "netns", "exec", host.netns, "tc", "qdisc", "replace", "dev", "eth0", "root", *spec]
        )  # upload


def ssh(lab: Lab, host: str, command: str, stdin: Path | None = None) -> None:
    with open(stdin or os.devnull, "rb") as src:
        subprocess.run(
            [*lab.ssh_argv(host), command], stdin=src, check=True, capture_output=True, timeout=3600
        )


def clean(lab: Lab, hosts: list[str]) -> None:
    for host in hosts:
        ssh(lab, host, f"rm -f {REMOTE} {REMOTE}.part")


def check(lab: Lab, hosts: list[str], digest: str) -> None:
    for host in hosts:
        out = subprocess.run(
            [*lab.ssh_argv(host), f"sha256sum {REMOTE}"], capture_output=True, text=True, check=True
        )
        assert out.stdout.split()[0] == digest, host


def naive(lab: Lab, hosts: list[str], artifact: Path) -> float:
    began = time.monotonic()
    with ThreadPoolExecutor(len(hosts)) as pool:
        list(pool.map(lambda h: ssh(lab, h, f"cat > {REMOTE}", artifact), hosts))
    return time.monotonic() - began


def _chain(lab: Lab, ips: dict[str, str], targets: list[str], digest: str) -> list[subprocess.Popen[bytes]]:
    procs = []
    for index, host in enumerate(targets):
        following = targets[index + 1] if index + 1 < len(targets) else ""
        nxt = f" --next {ips[following]}:{PORT} --next-name {following}" if following else ""
        command = (f"python3 /var/tmp/relay.py recv --listen {ips[host]}:{PORT} --out {REMOTE} "
                   f"--sha256 {digest} --timeout 600 --token-file {TOKEN} --name {host}{nxt}")  # fmt: skip
        procs.append(subprocess.Popen([*lab.ssh_argv(host), command], stdout=subprocess.DEVNULL))
    time.sleep(1.0)
    return procs


def fanout(lab: Lab, hosts: list[str], ips: dict[str, str], artifact: Path, digest: str) -> float:
    began = time.monotonic()
    ssh(lab, hosts[0], f"cat > {REMOTE}", artifact)
    if len(hosts) > 1:
        procs = _chain(lab, ips, hosts[1:], digest)
        ssh(
            lab,
            hosts[0],
            f"python3 /var/tmp/relay.py send --to {ips[hosts[1]]}:{PORT} --file {REMOTE} "
            f"--token-file {TOKEN}",
        )
        assert all(proc.wait() == 0 for proc in procs)
    return time.monotonic() - began - (1.0 if len(hosts) > 1 else 0.0)


def send_argv(hosts: list[str], ips: dict[str, str], artifact: Path) -> list[str]:
    """The control node's relay sender into the head of the chain (as the roles' chain strategy runs it)."""
    head = f"{ips[hosts[0]]}:{PORT}"
    return [sys.executable, str(RELAY), "send", "--to", head, "--file", str(artifact), "--token-file", TOKEN]


def chain(lab: Lab, hosts: list[str], ips: dict[str, str], artifact: Path, digest: str) -> float:
    procs = _chain(lab, ips, hosts, digest)
    began = time.monotonic()
    sh(send_argv(hosts, ips, artifact))
    assert all(proc.wait() == 0 for proc in procs)
    return time.monotonic() - began


def vanish(lab: Lab, hosts: list[str], ips: dict[str, str], artifact: Path, digest: str, *, k: int) -> str:
    """Time from host k's network going down mid-stream to the sender's failure, and what it said."""
    procs = _chain(lab, ips, hosts, digest)
    sender = subprocess.Popen(
        [*send_argv(hosts, ips, artifact), "--to-name", hosts[0]],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(10)
    netns = lab.state().hosts[k - 1].netns
    sh(["ip", "netns", "exec", netns, "ip", "link", "set", "eth0", "down"])
    cut = time.monotonic()
    out, _ = sender.communicate(timeout=900)
    seconds = time.monotonic() - cut
    sh(["ip", "netns", "exec", netns, "ip", "link", "set", "eth0", "up"])
    for proc in procs:
        proc.kill()
    said = [line for line in out.splitlines() if line.startswith("{")][-1:]
    return f"{seconds:.1f} s after node{k}'s link went down: exit {sender.returncode}, {said}"


def distribution(args: argparse.Namespace) -> list[str]:
    lab = Lab("relay-bench", nodes=max(args.nodes), offline=True)
    rows = []
    try:
        ips = lab.up().ips
        token = Path(TOKEN)
        token.write_text(os.urandom(24).hex())
        token.chmod(0o600)
        for host in ips:
            ssh(lab, host, "cat > /var/tmp/relay.py", RELAY)
            ssh(lab, host, f"umask 077; cat > {TOKEN}", token)
        throttle(lab, args.rate_mbit)
        with tempfile.TemporaryDirectory() as tmp:
            artifact = Path(tmp) / "artifact.bin"
            with artifact.open("wb") as out:
                for _ in range(args.size_mib):
                    out.write(os.urandom(1 << 20))
            digest = sh(["sha256sum", str(artifact)]).stdout.split()[0].decode()
            for count in args.nodes:
                hosts = list(ips)[:count]
                strategies = {
                    "naive": lambda hosts: naive(lab, hosts, artifact),
                    "fanout": lambda hosts: fanout(lab, hosts, ips, artifact, digest),
                    "chain": lambda hosts: chain(lab, hosts, ips, artifact, digest),
                }
                for name in args.strategies:
                    func = strategies[name]
                    clean(lab, hosts)
                    seconds = func(hosts)
                    check(lab, hosts, digest)
                    link = f"{args.rate_mbit} Mbit/s"
                    rows.append(f"| {args.size_mib} MiB | {count} | {link} | {name} | {seconds:.1f} |")
                    print(rows[-1], flush=True)
            if args.vanish:
                clean(lab, list(ips))
                rows.append(vanish(lab, list(ips), ips, artifact, digest, k=args.vanish))
                print(rows[-1], flush=True)
            clean(lab, list(ips))
    finally:
        lab.down()
    return rows


def lfs_concurrency(args: argparse.Namespace) -> list[str]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        model.mkdir()
        for index in range(args.lfs_objects):
            (model / f"model-{index:05d}-of-{args.lfs_objects:05d}.safetensors").write_bytes(
                os.urandom(args.lfs_object_mib << 20)
            )
        bare, _ = make_lfs_repo(model, Path(tmp) / "remote", "bench/many-shards")
        with LfsServer(bare.parents[1], rate=args.lfs_rate_mib << 20) as server:
            for concurrency in (8, 64):
                clone = Path(tmp) / f"clone-{concurrency}"
                env = {**os.environ, "GIT_LFS_SKIP_SMUDGE": "1"}
                sh(["git", "clone", "--quiet", f"{server.url}/bench/many-shards.git", str(clone)], env=env)
                began = time.monotonic()
                sh(["git", "-C", str(clone), "-c", f"lfs.concurrenttransfers={concurrency}", "lfs", "pull"])
                seconds = time.monotonic() - began
                total = args.lfs_objects * args.lfs_object_mib
                rows.append(f"| {args.lfs_objects} x {args.lfs_object_mib} MiB ({total} MiB) | "
                            f"{args.lfs_rate_mib} MiB/s | {concurrency} | {seconds:.1f} |")  # fmt: skip
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--rate-mbit", type=int, default=400)
    parser.add_argument(
        "--strategies", nargs="+", choices=["naive", "fanout", "chain"], default=["naive", "fanout", "chain"]
    )
    parser.add_argument("--lfs-objects", type=int, default=32)
    parser.add_argument("--lfs-object-mib", type=int, default=8)
    parser.add_argument("--lfs-rate-mib", type=int, default=4, help="per-connection limit of the LFS server")
    parser.add_argument("--skip-distribution", action="store_true")
    parser.add_argument("--skip-lfs", action="store_true")
    parser.add_argument("--vanish", type=int, metavar="K", help="then cut host K's link mid-stream (chain)")
    args = parser.parse_args()
    if not args.skip_lfs:
        print("| model | per-connection limit | lfs.concurrenttransfers | seconds |")
        print("| --- | --- | --- | --- |")
        lfs_concurrency(args)
    if not args.skip_distribution:
        print("| artifact | hosts | link rate | strategy | seconds |\n| --- | --- | --- | --- | --- |")
        distribution(args)


if __name__ == "__main__":
    main()
