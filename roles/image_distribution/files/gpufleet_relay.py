#!/usr/bin/env python3
"""Pipelined chain copy between cluster nodes (no third-party packages: runs on any node's python3).

Each receiver accepts one connection, writes the stream to a file (or into ``tar -x``) while forwarding the
same bytes to the next node, so N nodes receive a file in about the time of one transfer and every link
carries it once. Receiving, writing and forwarding run in separate threads joined by bounded queues
(IN_FLIGHT bytes at most), so a slow disk or a slow next hop does not stall the upstream link until that
buffer is full. The file is hashed as it streams and only renamed into place when its sha256 matches. A
receiver confirms with one byte to its upstream only after its own copy is in place and its downstream has
confirmed, so a sender that exits 0 knows that every node of the chain has the data.

  gpufleet_relay.py recv --listen IP:PORT (--out FILE --sha256 HEX | --untar DIR) [--next IP:PORT]
  gpufleet_relay.py send --to IP:PORT (--file FILE | --tar-dir DIR)
  gpufleet_relay.py probe --listen IP:PORT    (accept one connection and close it: a reachability test)
Exit codes: 0 done, 2 usage, 3 checksum mismatch, 4 network or timeout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import socket
import struct
import subprocess
import threading
import time
from typing import IO, TYPE_CHECKING, NoReturn

if TYPE_CHECKING:  # annotations only: nothing here runs, so older node Pythons never evaluate it
    from collections.abc import Callable

    Chunk = bytearray | memoryview

CHUNK = 1 << 20
IN_FLIGHT = 64 << 20  # bytes received but not yet written and forwarded, at most
ACK = b"\x06"


def address(text: str) -> tuple[str, int]:
    host, _colon, port = text.rpartition(":")
    return host, int(port)


def connect(target: tuple[str, int], timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection(target, timeout=30)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def fail(code: int, message: str, abort: socket.socket | None = None) -> NoReturn:
    print(json.dumps({"ok": False, "error": message}), flush=True)
    if abort:  # reset, not close: the next node must see a broken stream, not a short one that ended well
        abort.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        abort.close()
    os._exit(code)  # not sys.exit: worker threads may be blocked on a dead peer


def listen_once(args: argparse.Namespace) -> socket.socket:
    try:
        server = socket.create_server(address(args.listen))
    except OSError as exc:
        fail(4, f"cannot listen on {args.listen}: {exc}")
    server.settimeout(args.accept_timeout)  # short: a sender that failed must not leave receivers waiting
    try:
        conn, _peer = server.accept()
    except socket.timeout:  # noqa: UP041 - an alias of TimeoutError only from Python 3.10; nodes may run 3.8
        fail(4, f"no sender connected to {args.listen} within {args.accept_timeout} s")
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


def open_sink(args: argparse.Namespace) -> tuple[IO[bytes], subprocess.Popen[bytes] | None]:
    if args.untar:
        os.makedirs(args.untar, exist_ok=True)
        proc = subprocess.Popen(["tar", "-x", "-C", args.untar, "--no-same-owner"], stdin=subprocess.PIPE)
        assert proc.stdin is not None  # stdin=PIPE: Popen always opens it
        return proc.stdin, proc
    return open(args.out + ".part", "wb"), None


def close_sink(
    args: argparse.Namespace, sink: IO[bytes], proc: subprocess.Popen[bytes] | None, digest: str
) -> str | None:
    """Finish the local copy: tar's exit status, or fsync + sha256 check + rename into place."""
    if proc:
        sink.close()
        if proc.wait() != 0:
            return f"tar -x into {args.untar} failed (exit {proc.returncode})"
        return None
    os.fsync(sink.fileno())
    sink.close()
    if args.sha256 and digest != args.sha256:
        os.unlink(args.out + ".part")
        return f"{args.out}: sha256 {digest}, expected {args.sha256}; removed"
    os.replace(args.out + ".part", args.out)
    return None


def receive(args: argparse.Namespace) -> None:
    conn = listen_once(args)
    conn.settimeout(args.timeout)
    try:
        downstream = connect(address(args.next), args.timeout) if args.next else None
    except OSError as exc:
        fail(4, f"cannot reach the next node {args.next}: {exc}")
    if downstream:
        downstream.settimeout(args.timeout)
    sink, proc = open_sink(args)
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
        broken = f"stream broken after {total} bytes: {exc}"
    errors = [worker.finish() for worker in workers]
    if broken or any(errors):
        if not proc:
            os.unlink(args.out + ".part")  # the file object is left to the exit: closing may raise again
        failure = broken or "; ".join(f"{w.name} failed: {w.error}" for w in workers if w.error)
        fail(4, failure, abort=downstream)
    problem = close_sink(args, sink, proc, digest.hexdigest())
    if downstream:
        downstream.shutdown(socket.SHUT_WR)
        try:
            confirmed = downstream.recv(1) == ACK  # the next node has everything, and so has the rest
        except OSError:
            confirmed = False
        downstream.close()
        if not confirmed and not problem:
            fail(4, f"the next node {args.next} did not confirm the copy (see its own error)")
    if problem:
        fail(3, problem)
    conn.sendall(ACK)
    conn.close()
    seconds = time.monotonic() - began
    print(
        json.dumps({"ok": True, "bytes": total, "seconds": round(seconds, 3), "sha256": digest.hexdigest()})
    )


def send(args: argparse.Namespace) -> None:
    try:
        sock = connect(address(args.to), args.timeout)
    except OSError as exc:
        fail(4, f"cannot connect to {args.to} within {args.timeout} s: {exc}")
    sock.settimeout(max(args.timeout, 300))
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
                fail(4, f"tar -c of {args.tar_dir} failed")
        else:
            with open(args.file, "rb") as src:
                total = sock.sendfile(src)
        sock.shutdown(socket.SHUT_WR)
        confirmed = sock.recv(1) == ACK
    except OSError as exc:
        fail(4, f"stream to {args.to} broken after {total} bytes: {exc}")
    sock.close()
    if not confirmed:
        fail(4, f"the chain behind {args.to} did not confirm the copy (see the receivers' errors)")
    print(json.dumps({"ok": True, "bytes": total, "seconds": round(time.monotonic() - began, 3)}))


def probe(args: argparse.Namespace) -> None:
    listen_once(args).close()
    print(json.dumps({"ok": True}))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    recv = sub.add_parser("recv")
    recv.add_argument("--listen", required=True)
    recv.add_argument("--out")
    recv.add_argument("--sha256")
    recv.add_argument("--untar")
    recv.add_argument("--next")
    recv.add_argument("--timeout", type=float, default=300, help="seconds without data before giving up")
    recv.add_argument("--accept-timeout", type=float, default=120, help="seconds to wait for the sender")
    snd = sub.add_parser("send")
    snd.add_argument("--to", required=True)
    snd.add_argument("--file")
    snd.add_argument("--tar-dir")
    snd.add_argument("--timeout", type=float, default=600, help="seconds to keep trying to connect")
    prb = sub.add_parser("probe")
    prb.add_argument("--listen", required=True)
    prb.add_argument("--accept-timeout", type=float, default=10)
    args = parser.parse_args()
    if args.mode == "recv" and bool(args.out) == bool(args.untar):
        parser.error("recv needs exactly one of --out and --untar")
    if args.mode == "send" and bool(args.file) == bool(args.tar_dir):
        parser.error("send needs exactly one of --file and --tar-dir")
    {"recv": receive, "send": send, "probe": probe}[args.mode](args)


if __name__ == "__main__":
    main()
