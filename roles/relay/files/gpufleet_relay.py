#!/usr/bin/env python3
"""Pipelined chain copy between cluster nodes (no third-party packages: runs on any node's python3).

Each receiver accepts one authenticated connection, writes the stream to a file (or into ``tar -x`` in a
staging directory) while forwarding the same bytes to the next node, so N nodes receive a file in about the
time of one transfer and every link carries it once. Receiving, writing and forwarding run in separate
threads joined by bounded queues (IN_FLIGHT bytes at most), so a slow disk or a slow next hop does not stall
the upstream link until that buffer is full. The file is hashed as it streams and only renamed into place
when its sha256 matches. With --load the stream goes into ``docker load`` instead of a file (no copy of the
archive on the node's disk, no second read of it): dockerd keeps only layers that match the image's
content-addressed config, the role then checks the loaded image's pinned ID, and a stream whose sha256
differs is refused and the image it loaded removed.
A receiver confirms with one byte (ACK) to its upstream only after its own copy is
in place and its downstream has confirmed, so a sender that exits 0 knows that every node has the data.

Trust: every connection starts with a mutual HMAC-SHA256 challenge over a per-run token that the control
node generates and places in a 0600 file (--token-file; never in argv or logs). A peer without the token
is dropped before a byte of data is read, and the receiver keeps waiting for the real sender.

Diagnoses: a receiver that fails answers its upstream with NAK and one JSON line naming the host, the cause
(disk_full, permission, port_blocked, port_closed, host_down, auth, checksum, network) and the path or port;
every node up the chain passes it on, so the sender reports the real cause, not "connection reset".

  gpufleet_relay.py recv --listen IP:PORT --token-file F (--out FILE --sha256 HEX | --untar DIR
                         | --load DOCKER --sha256 HEX [--zstd]) [--size N]
                         [--next IP:PORT] [--name HOST] [--next-name HOST]
  gpufleet_relay.py send --to IP:PORT --token-file F (--file FILE | --tar-dir DIR) [--to-name HOST]
  gpufleet_relay.py probe --listen IP:PORT    (accept one connection and close it: a reachability test)
Exit codes: 0 done, 2 usage, 3 checksum mismatch, 4 network or timeout, 5 authentication,
6 disk full, 7 permission denied, 8 docker load refused the stream.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import hmac
import json
import os
import queue
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, NoReturn

if TYPE_CHECKING:  # annotations only: nothing here runs, so older node Pythons never evaluate it
    from collections.abc import Callable

    Chunk = bytearray | memoryview

CHUNK = 1 << 20
IN_FLIGHT = 64 << 20  # bytes received but not yet written and forwarded, at most
ACK = b"\x06"
NAK = b"\x15"
HELLO = b"GFR1"
NONCE = 16
HANDSHAKE_TIMEOUT = 10.0
BIND_WAIT = 5.0
DEAD_AFTER = 20.0  # seconds without a TCP acknowledgement from a peer before it counts as gone
EXIT = {"checksum": 3, "auth": 5, "disk_full": 6, "permission": 7, "load": 8}
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NO_WRITE = (errno.EACCES, errno.EPERM, errno.EROFS)


class RelayError(Exception):
    """A failure with its cause, the message the operator reads (host, path or port, fix)."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause
        self.message = message


def address(text: str) -> tuple[str, int]:
    host, _colon, port = text.rpartition(":")
    return host, int(port)


def read_token(path: str) -> bytes:
    try:
        info = os.stat(path)
        with open(path, "rb") as src:
            token = src.read().strip()
    except OSError as exc:
        raise RelayError("auth", f"cannot read the relay token {path}: {exc.strerror}") from None
    if info.st_mode & 0o077:
        raise RelayError(
            "auth", f"the relay token {path} is readable by others (mode {oct(info.st_mode & 0o777)})"
        )
    if len(token) < 16:
        raise RelayError("auth", f"the relay token {path} is shorter than 16 bytes")
    return token


def mac(token: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(token, role + first + second, hashlib.sha256).digest()


def recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        got = conn.recv(size - len(data))
        if not got:
            raise ConnectionError(f"peer closed after {len(data)} of {size} handshake bytes")
        data += got
    return data


def prove_sender(conn: socket.socket, token: bytes) -> None:
    """Receiver side: challenge the peer; raises RelayError('auth') when it does not hold the token."""
    mine = os.urandom(NONCE)
    conn.sendall(HELLO + mine)
    theirs = recv_exact(conn, NONCE)
    if not hmac.compare_digest(recv_exact(conn, 32), mac(token, b"send", mine, theirs)):
        raise RelayError("auth", "the peer did not prove the run's token")
    conn.sendall(mac(token, b"recv", theirs, mine))


def prove_receiver(conn: socket.socket, token: bytes, where: str) -> None:
    """Sender side: answer the challenge and check the receiver's answer (a fake receiver gets no data)."""
    hello = recv_exact(conn, len(HELLO) + NONCE)
    if not hello.startswith(HELLO):
        raise RelayError("auth", f"{where} is not a gpufleet relay (it answered {hello[:4]!r})")
    theirs, mine = hello[len(HELLO) :], os.urandom(NONCE)
    conn.sendall(mine + mac(token, b"send", theirs, mine))
    answer = conn.recv(32)
    if len(answer) < 32 and answer[:1] == NAK:  # refused us: the receiver says why
        raise RelayError("auth", f"{where} refused this sender's token")
    answer += recv_exact(conn, 32 - len(answer)) if 0 < len(answer) < 32 else b""
    if not hmac.compare_digest(answer, mac(token, b"recv", mine, theirs)):
        raise RelayError("auth", f"{where} did not prove the run's token: not the receiver this run started")


def reachable(ip: str, port: int) -> bool:
    """Whether the host answers at all on this port (connected or actively refused)."""
    try:
        socket.create_connection((ip, port), timeout=3).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return True


def unreachable(target: tuple[str, int], name: str, exc: OSError) -> RelayError:
    """Why a connection failed: nothing listens (refused), the port is filtered, or the host is down."""
    ip, port = target
    who = f"{name} ({ip})" if name else ip
    if isinstance(exc, ConnectionRefusedError):
        return RelayError(
            "port_closed",
            f"{who}: TCP port {port} refused the connection: no relay listens there (its receiver did "
            f"not start or already gave up) or a firewall rejects port {port}. Fix: see {who}'s own error; "
            f"open TCP port {port} on the cluster network",
        )
    if reachable(ip, 22):
        return RelayError(
            "port_blocked",
            f"{who}: TCP port {port} does not answer ({exc.strerror or exc}) while the host answers on "
            f"port 22: a firewall drops port {port}. Fix: open TCP port {port} on {who}'s cluster network "
            "address",
        )
    return RelayError(
        "host_down",
        f"{who}: host down or unreachable on the cluster network: neither port {port} nor port 22 answers "
        f"({exc.strerror or exc}). Fix: power on or reconnect {who}, check its cluster network address",
    )


def watch_peer(sock: socket.socket, dead_after: float) -> socket.socket:
    """Fail this connection within ``dead_after`` seconds once its peer vanishes without a reset (powered off,
    cable pulled, network cut), instead of the 300 s socket timeout or TCP's own ~15 minutes.

    While data waits for an acknowledgement, TCP_USER_TIMEOUT ends the connection; while it is idle (a
    receiver waiting for the next node's verdict), keepalive probes do. The peer's kernel answers both, so a
    peer that is only slow or busy (a full disk queue, a loaded CPU) is never taken for a dead one.
    """
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: a platform without these options
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        interval = max(1, int(dead_after / 4))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(dead_after * 1000))
    return sock


def vanished(name: str, peer: str, total: int, dead_after: float) -> RelayError:
    return RelayError(
        "host_down",
        f"{name}: {peer} stopped answering after {total} bytes: no TCP acknowledgement for {dead_after:g} s "
        f"(host down, its relay killed with the host, or its cluster network cut). Fix: check that {peer} is "
        "up and reachable on the cluster network, then run again",
    )


def connect(
    target: tuple[str, int], timeout: float, name: str, dead_after: float = DEAD_AFTER
) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection(target, timeout=min(30, max(1, deadline - time.monotonic())))
            return watch_peer(sock, dead_after)
        except OSError as exc:
            if time.monotonic() > deadline:
                raise unreachable(target, name, exc) from None
            time.sleep(0.2)


def disk_failure(host: str, path: str, need: int, done: int, exc: OSError | None) -> RelayError:
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = -1
    what = f" ({exc.strerror})" if exc else ""
    need_text = f"needs {need} bytes" if need else "needs more space"
    return RelayError(
        "disk_full",
        f"{host}: disk full writing {path}{what}: {need_text}, "
        + (f"{free} bytes free in {folder}" if free >= 0 else f"{folder} unreadable")
        + (f" after {done} bytes written" if done else "")
        + (" (free again since: another writer on that file system, or a quota)" if 0 < need <= free else "")
        + f". Fix: free {f'at least {need - free} bytes' if need > free >= 0 else 'space'} on {host} in "
        f"{folder}, or stage on a larger file system (image_distribution_tmp_dir for images; the model's "
        "file system for models)",
    )


def io_failure(host: str, path: str, need: int, done: int, exc: OSError) -> RelayError:
    if exc.errno in NO_SPACE:
        return disk_failure(host, path, need, done, exc)
    if exc.errno in NO_WRITE:
        return RelayError(
            "permission",
            f"{host}: permission denied writing {path} ({exc.strerror}). Fix: make "
            f"{os.path.dirname(path) or path} writable by the relay (root) on {host}: not read-only, "
            "not immutable",
        )
    return RelayError("network", f"{host}: writing {path} failed: {exc}")


def report(code_cause: str, message: str, abort: socket.socket | None = None) -> NoReturn:
    print(json.dumps({"ok": False, "cause": code_cause, "error": message}), flush=True)
    if abort:  # reset, not close: the next node must see a broken stream, not a short one that ended well
        abort.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        abort.close()
    os._exit(EXIT.get(code_cause, 4))  # not sys.exit: worker threads may be blocked on a dead peer


def nak(upstream: socket.socket, failure: RelayError) -> None:
    """Tell the upstream node why, then let it read the line before the connection is reset."""
    line = json.dumps({"cause": failure.cause, "error": failure.message}).encode() + b"\n"
    try:
        upstream.sendall(NAK + line)
        upstream.shutdown(socket.SHUT_WR)
        upstream.settimeout(0.2)
        until = time.monotonic() + 1.0
        while time.monotonic() < until and upstream.recv(CHUNK):
            pass  # drain a little: closing with unread data resets at once, possibly before the line left
    except OSError:
        pass


class Reply(threading.Thread):
    """Reads the peer's verdict (ACK, or NAK with its reason) while data still flows the other way."""

    def __init__(self, conn: socket.socket) -> None:
        super().__init__(name="reply", daemon=True)
        self.conn = conn
        self.acked = False
        self.failure: RelayError | None = None
        self.silent = False  # the peer's kernel stopped acknowledging (watch_peer): the host is gone
        self.start()

    def run(self) -> None:
        try:
            first = self.conn.recv(1)
            if first == ACK:
                self.acked = True
            elif first == NAK:
                data = b""
                while not data.endswith(b"\n") and (more := self.conn.recv(4096)):
                    data += more
                reason = json.loads(data.decode() or "{}")
                self.failure = RelayError(str(reason.get("cause", "network")), str(reason.get("error", "")))
        except OSError as exc:
            self.silent = exc.errno == errno.ETIMEDOUT
        except ValueError:
            pass

    def verdict(self, timeout: float) -> tuple[bool, RelayError | None]:
        self.join(timeout)
        return self.acked, self.failure


def listen(args: argparse.Namespace, token: bytes | None) -> socket.socket:
    """Accept connections until one proves the token (probe: the first one)."""
    busy_until = time.monotonic() + BIND_WAIT  # a receiver just ended by the role may still hold the port
    while True:
        try:
            server = socket.create_server(address(args.listen))
            break
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE and time.monotonic() < busy_until:
                time.sleep(0.2)
                continue
            cause = "port_busy" if exc.errno == errno.EADDRINUSE else "network"
            report(cause, f"{args.name}: cannot listen on {args.listen}: {exc}")
    deadline = time.monotonic() + args.accept_timeout
    while True:
        left = deadline - time.monotonic()
        server.settimeout(max(left, 0.01))  # short: a sender that failed must not leave receivers waiting
        try:
            conn, peer = server.accept()
        except socket.timeout:  # noqa: UP041 - an alias of TimeoutError only from Python 3.10; nodes may run 3.8
            report(
                "network", f"{args.name}: no sender connected to {args.listen} within {args.accept_timeout} s"
            )
        if token is None:
            break
        watch_peer(conn, args.dead_after)
        conn.settimeout(HANDSHAKE_TIMEOUT)
        try:
            prove_sender(conn, token)
            break
        except (RelayError, OSError) as exc:
            print(json.dumps({"rejected": f"{peer[0]}:{peer[1]}", "why": str(exc)}), file=sys.stderr)
            with contextlib.suppress(OSError):
                conn.sendall(NAK)
            conn.close()
    server.close()
    return conn


class Worker(threading.Thread):
    """Hands chunks from a bounded queue to one consumer (the disk or the next node), off the receive loop."""

    def __init__(self, name: str, consume: Callable[[Chunk], object]) -> None:
        super().__init__(name=name, daemon=True)
        self.consume = consume
        self.error: OSError | None = None
        self.chunks: queue.Queue[Chunk | None] = queue.Queue(IN_FLIGHT // CHUNK)
        self.start()

    def run(self) -> None:
        while (chunk := self.chunks.get()) is not None:
            if self.error is None:  # after an error keep draining, so that the receive loop never blocks
                try:
                    self.consume(chunk)
                except OSError as exc:
                    self.error = exc

    def finish(self) -> OSError | None:
        self.chunks.put(None)
        self.join()
        return self.error


def read_chunk(conn: socket.socket) -> Chunk:
    """Up to CHUNK bytes (fewer only at the end): the queues then bound the bytes in flight, not the calls."""
    chunk, size = bytearray(CHUNK), 0
    while size < CHUNK and (got := conn.recv_into(memoryview(chunk)[size:])):
        size += got
    return chunk if size == CHUNK else memoryview(chunk)[:size]


def target_path(args: argparse.Namespace) -> str:
    if args.load:
        return f"docker load ({args.load})"
    return str(args.untar or args.out + ".part")


def check_space(args: argparse.Namespace) -> None:
    if not args.size or args.load:  # dockerd's data root is dockerd's to know; the preflight sized it
        return
    folder = args.untar or os.path.dirname(args.out) or "."
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if free < args.size:
        raise disk_failure(args.name, args.untar or args.out, args.size, 0, None)


def open_load(args: argparse.Namespace) -> tuple[IO[bytes], subprocess.Popen[bytes]]:
    """docker load reading the stream (through zstd -dc for zstd: older dockerd cannot read it)."""
    zstd = None
    if args.zstd:
        zstd = subprocess.Popen(["zstd", "-dc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc = subprocess.Popen(
        [args.load, "load"],
        stdin=zstd.stdout if zstd else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    if zstd:
        assert zstd.stdin is not None and zstd.stdout is not None  # PIPE: Popen always opens them
        zstd.stdout.close()  # docker load holds it now: zstd sees a broken pipe if docker load exits early
        return zstd.stdin, proc
    assert proc.stdin is not None  # stdin=PIPE: Popen always opens it
    return proc.stdin, proc


def end_load_stream(
    args: argparse.Namespace, sink: IO[bytes], proc: subprocess.Popen[bytes], digest: str, total: int
) -> None:
    """The stream has ended: docker load reads its last bytes; a stream with another sha256 is refused now.

    Its verdict on a good stream is awaited only after this node confirmed to its upstream: loading takes
    dockerd a while after the last byte (it unpacks the archive, then each layer), and on a loaded machine
    longer than a hop waits for a confirmation."""
    with contextlib.suppress(OSError):  # docker load stopped reading: its exit status and words say why
        sink.close()
    if args.sha256 and digest != args.sha256:
        finish_load(args, proc, digest, total)  # waits for it, removes what it loaded, raises


def load_verdict(args: argparse.Namespace, proc: subprocess.Popen[bytes]) -> tuple[int, str, list[str]]:
    """docker load's exit status, its words and the images it says it loaded."""
    said = (proc.stdout.read() if proc.stdout else b"").decode(errors="replace")
    code = proc.wait()
    loaded = [line.split(":", 1)[1].strip() for line in said.splitlines() if line.startswith("Loaded image")]
    return code, said, loaded


def docker_root(cli: str) -> str:
    """dockerd's data root, as dockerd says (its default when it does not answer)."""
    try:
        asked = [cli, "info", "--format", "{{.DockerRootDir}}"]
        said = subprocess.run(asked, capture_output=True, text=True, timeout=15, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        said = ""
    return said if said.startswith("/") else "/var/lib/docker"


def load_disk_failure(args: argparse.Namespace, said: str, total: int) -> RelayError:
    """docker load ran out of space: in dockerd's data root, not in a folder of the relay's."""
    root = docker_root(args.load)
    try:
        free = f"{shutil.disk_usage(root).free} bytes free in {root}"
    except OSError as exc:
        free = f"{root} not readable here ({exc.strerror})"
    size = f"the archive is {args.size} bytes; " if args.size else ""
    return RelayError(
        "disk_full",
        f"{args.name}: disk full in dockerd's data root {root} after {total} bytes of the stream: docker "
        f"load said {said.strip()[-300:]!r}; {size}{free}. Fix: free space in {root} on {args.name} (its "
        "image layers and what else fills that file system), or set docker_data_root to a folder on a larger "
        "file system",
    )


def load_failure(args: argparse.Namespace, code: int, said: str, total: int) -> RelayError:
    if "no space left" in said.lower():
        return load_disk_failure(args, said, total)
    return RelayError(
        "load", f"{args.name}: docker load refused the stream (exit {code}): {said.strip()[-300:]}"
    )


def finish_load(args: argparse.Namespace, proc: subprocess.Popen[bytes], digest: str, total: int) -> None:
    """docker load's verdict; a stream with another sha256 is refused and what it loaded removed."""
    code, said, loaded = load_verdict(args, proc)
    if args.sha256 and digest != args.sha256:
        for ref in loaded:
            subprocess.run([args.load, "rmi", ref], capture_output=True, check=False)
        raise RelayError(
            "checksum",
            f"{args.name}: the stream into docker load had sha256 {digest}, expected {args.sha256}; "
            f"the image it loaded ({', '.join(loaded) or 'none'}) was removed",
        )
    if code != 0:
        raise load_failure(args, code, said, total)
    print(json.dumps({"loaded": loaded}))


def open_sink(args: argparse.Namespace) -> tuple[IO[bytes], subprocess.Popen[bytes] | None]:
    try:
        if args.load:
            return open_load(args)
        if args.untar:
            os.makedirs(args.untar, exist_ok=True)
            probe = os.path.join(args.untar, ".gpufleet-write-test")
            open(probe, "wb").close()  # tar would only say "Cannot open" per member: find out here, once
            os.unlink(probe)
            proc = subprocess.Popen(
                ["tar", "-x", "-C", args.untar, "--no-same-owner", "--no-same-permissions"],
                stdin=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert proc.stdin is not None  # stdin=PIPE: Popen always opens it
            return proc.stdin, proc
        return open(args.out + ".part", "wb"), None
    except OSError as exc:
        raise io_failure(args.name, target_path(args), args.size or 0, 0, exc) from None


def close_sink(
    args: argparse.Namespace, sink: IO[bytes], proc: subprocess.Popen[bytes] | None, digest: str, total: int
) -> None:
    """Finish the local copy: docker load's or tar's exit status, or fsync, sha256 check and rename."""
    if proc and args.load:
        with contextlib.suppress(OSError):  # docker load stopped reading: its exit status and words say why
            sink.close()
        finish_load(args, proc, digest, total)
        return
    if proc:
        try:
            sink.close()
        except OSError as exc:
            raise io_failure(args.name, args.untar, args.size or total, total, exc) from None
        said = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace")
        if proc.wait() != 0:
            if "No space left" in said or "Disk quota" in said:
                raise disk_failure(args.name, args.untar, args.size or total, total, None)
            if "Permission denied" in said or "Read-only file system" in said:
                raise RelayError(
                    "permission",
                    f"{args.name}: permission denied extracting into {args.untar}: {said.strip()[:300]}",
                )
            raise RelayError(
                "network",
                f"{args.name}: tar -x into {args.untar} failed (exit {proc.returncode}): "
                f"{said.strip()[:300]}",
            )
        return
    try:
        os.fsync(sink.fileno())
        sink.close()
    except OSError as exc:
        raise io_failure(args.name, args.out + ".part", args.size or total, total, exc) from None
    if args.sha256 and digest != args.sha256:
        os.unlink(args.out + ".part")
        raise RelayError(
            "checksum", f"{args.name}: {args.out}: sha256 {digest}, expected {args.sha256}; removed"
        )
    os.replace(args.out + ".part", args.out)


def remove_partial(args: argparse.Namespace, proc: subprocess.Popen[bytes] | None) -> None:
    if proc and args.load:
        proc.kill()  # a broken stream: docker load must not take what came so far
        return
    if not args.untar:
        with contextlib.suppress(OSError):
            os.unlink(args.out + ".part")


def start(
    args: argparse.Namespace, conn: socket.socket, token: bytes
) -> tuple[socket.socket | None, IO[bytes], subprocess.Popen[bytes] | None]:
    """Before any data: free space, the next node (authenticated), the sink; a failure is NAKed upstream."""
    downstream: socket.socket | None = None
    try:
        check_space(args)
        if args.next:
            downstream = connect(address(args.next), args.timeout, args.next_name, args.dead_after)
            downstream.settimeout(args.timeout)
            prove_receiver(downstream, token, args.next_name or args.next)
        sink, proc = open_sink(args)
    except RelayError as failure:
        nak(conn, failure)
        report(failure.cause, failure.message, abort=downstream)
    return downstream, sink, proc


def broken_stream(
    args: argparse.Namespace,
    workers: list[Worker],
    reply: Reply | None,
    broken: str | None,
    total: int,
    *,
    proc: subprocess.Popen[bytes] | None,
) -> RelayError:
    """The cause of a failed stream: the disk or docker load, the next node (its own NAK), or the upstream."""
    failure = RelayError("network", broken or "")
    for worker in workers:
        if worker.error and worker.name == "write" and proc and args.load:
            code, words, _loaded = load_verdict(args, proc)  # docker load stopped reading: its words say why
            failure = load_failure(args, code, words, total)
        elif worker.error and worker.name == "write":
            failure = io_failure(args.name, target_path(args), args.size or total, total, worker.error)
        elif worker.error and reply:
            _acked, said = reply.verdict(5)
            # The kernel reports the timeout once: to the reply thread's recv or to this send (which then
            # sees a broken pipe).
            if said is None and (worker.error.errno == errno.ETIMEDOUT or reply.silent):
                said = vanished(args.name, args.next_name or args.next, total, args.dead_after)
            failure = said or RelayError(
                "network", f"{args.name}: forwarding to {args.next_name or args.next} broke: {worker.error}"
            )
    return failure


def settle(
    args: argparse.Namespace,
    conn: socket.socket,
    sink: IO[bytes],
    proc: subprocess.Popen[bytes] | None,
    *,
    digest: str,
    total: int,
    downstream: socket.socket | None,
    reply: Reply | None,
) -> None:
    """After the last byte: this node's copy, its downstream's confirmation, then ACK (or NAK) upstream."""
    problem: RelayError | None = None
    try:
        if proc and args.load:
            end_load_stream(args, sink, proc, digest, total)
        else:
            close_sink(args, sink, proc, digest, total)
    except RelayError as failed:
        problem = failed
    if downstream and reply:
        downstream.shutdown(socket.SHUT_WR)
        confirmed, said = reply.verdict(args.timeout)
        downstream.close()
        if not confirmed and not problem and reply.silent:
            problem = vanished(args.name, args.next_name or args.next, total, args.dead_after)
        if not confirmed and not problem:
            problem = said or RelayError(
                "network",
                f"{args.name}: the next node {args.next_name or args.next} did not confirm the copy",
            )
    if problem:
        nak(conn, problem)
        report(problem.cause, problem.message)
    conn.sendall(ACK)
    conn.close()


def receive(args: argparse.Namespace) -> None:
    try:
        token = read_token(args.token_file)
    except RelayError as failure:
        report(failure.cause, f"{args.name}: {failure.message}")
    conn = listen(args, token)
    conn.settimeout(args.timeout)
    downstream, sink, proc = start(args, conn, token)
    reply = Reply(downstream) if downstream else None
    workers = [Worker("write", sink.write)] + ([Worker("forward", downstream.sendall)] if downstream else [])
    digest, total, began, broken = hashlib.sha256(), 0, time.monotonic(), None
    try:
        while chunk := read_chunk(conn):
            for worker in workers:
                worker.chunks.put(chunk)  # blocks once IN_FLIGHT is queued: backpressure to the sender
            digest.update(chunk)
            total += len(chunk)
            if any(worker.error for worker in workers):
                break
    except OSError as exc:
        gone = " (the upstream node stopped answering)" if exc.errno == errno.ETIMEDOUT else ""
        broken = f"{args.name}: stream from upstream broken after {total} bytes: {exc}{gone}"
    errors = [worker.finish() for worker in workers]
    if broken or any(errors):
        cause = broken_stream(args, workers, reply, broken, total, proc=proc)
        remove_partial(args, proc)
        if not broken:
            nak(conn, cause)
        report(cause.cause, cause.message, abort=downstream)
    settle(args, conn, sink, proc, digest=digest.hexdigest(), total=total, downstream=downstream, reply=reply)
    if proc and args.load:
        try:  # every byte is here and matched: the chain is confirmed; what docker makes of it is this node's
            finish_load(args, proc, digest.hexdigest(), total)
        except RelayError as failed:
            report(failed.cause, failed.message)
    seconds = time.monotonic() - began
    print(
        json.dumps({"ok": True, "bytes": total, "seconds": round(seconds, 3), "sha256": digest.hexdigest()})
    )


def send(args: argparse.Namespace) -> None:
    where = args.to_name or args.to
    try:
        token = read_token(args.token_file)
        sock = connect(address(args.to), args.timeout, args.to_name, args.dead_after)
        sock.settimeout(HANDSHAKE_TIMEOUT)
        prove_receiver(sock, token, where)
    except RelayError as failure:
        report(failure.cause, failure.message)
    except OSError as exc:
        report("network", f"handshake with {where} failed: {exc}")
    sock.settimeout(max(args.timeout, 300))
    reply = Reply(sock)
    began, total = time.monotonic(), 0
    try:
        if args.tar_dir:
            names = sorted(n for n in os.listdir(args.tar_dir) if n not in (".git", ".gpufleet-model.json"))
            proc = subprocess.Popen(["tar", "-c", "-C", args.tar_dir, "--", *names], stdout=subprocess.PIPE)
            assert proc.stdout is not None  # stdout=PIPE: Popen always opens it
            while chunk := proc.stdout.read(CHUNK):
                sock.sendall(chunk)
                total += len(chunk)
            if proc.wait() != 0:
                report("network", f"tar -c of {args.tar_dir} failed")
        else:
            with open(args.file, "rb") as src:
                total = sock.sendfile(src)
        sock.shutdown(socket.SHUT_WR)
    except OSError as exc:
        _acked, said = reply.verdict(5)
        if said:
            report(said.cause, said.message)
        if exc.errno == errno.ETIMEDOUT or reply.silent:  # reported once: to this send or to the reply's recv
            gone = vanished("sender", where, total, args.dead_after)
            report(gone.cause, gone.message)
        report("network", f"stream to {where} broken after {total} bytes: {exc}")
    confirmed, said = reply.verdict(max(args.timeout, 300) + 60)
    sock.close()
    if said:
        report(said.cause, said.message)
    if not confirmed and reply.silent:
        gone = vanished("sender", where, total, args.dead_after)
        report(gone.cause, gone.message)
    if not confirmed:
        report("network", f"the chain behind {where} did not confirm the copy (see the receivers' errors)")
    print(json.dumps({"ok": True, "bytes": total, "seconds": round(time.monotonic() - began, 3)}))


def probe(args: argparse.Namespace) -> None:
    listen(args, None).close()
    print(json.dumps({"ok": True}))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    recv = sub.add_parser("recv")
    recv.add_argument("--listen", required=True)
    recv.add_argument("--token-file", required=True, help="0600 file holding the run's token")
    recv.add_argument("--out")
    recv.add_argument("--sha256")
    recv.add_argument("--untar")
    recv.add_argument("--load", help="a docker CLI: load the stream into dockerd instead of writing a file")
    recv.add_argument("--zstd", action="store_true", help="with --load: the stream is zstd-compressed")
    recv.add_argument("--size", type=int, default=0, help="bytes expected (free space is checked first)")
    recv.add_argument("--next")
    recv.add_argument("--name", default=socket.gethostname(), help="this host's name in messages")
    recv.add_argument("--next-name", default="", help="the next host's name in messages")
    recv.add_argument("--timeout", type=float, default=300, help="seconds without data before giving up")
    recv.add_argument("--accept-timeout", type=float, default=120, help="seconds to wait for the sender")
    recv.add_argument(
        "--dead-after", type=float, default=DEAD_AFTER, help="seconds before a silent peer is gone"
    )
    snd = sub.add_parser("send")
    snd.add_argument("--to", required=True)
    snd.add_argument("--to-name", default="", help="the receiving host's name in messages")
    snd.add_argument("--token-file", required=True, help="0600 file holding the run's token")
    snd.add_argument("--file")
    snd.add_argument("--tar-dir")
    snd.add_argument("--timeout", type=float, default=600, help="seconds to keep trying to connect")
    snd.add_argument(
        "--dead-after", type=float, default=DEAD_AFTER, help="seconds before a silent peer is gone"
    )
    prb = sub.add_parser("probe")
    prb.add_argument("--listen", required=True)
    prb.add_argument("--name", default=socket.gethostname())
    prb.add_argument("--accept-timeout", type=float, default=10)
    args = parser.parse_args()
    if args.mode == "recv" and [bool(args.out), bool(args.untar), bool(args.load)].count(True) != 1:
        parser.error("recv needs exactly one of --out, --untar and --load")
    if args.mode == "send" and bool(args.file) == bool(args.tar_dir):
        parser.error("send needs exactly one of --file and --tar-dir")
    {"recv": receive, "send": send, "probe": probe}[args.mode](args)


if __name__ == "__main__":
    main()
