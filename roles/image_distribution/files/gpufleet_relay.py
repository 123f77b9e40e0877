#!/usr/bin/env python3
"""Pipelined chain copy between cluster nodes (no third-party packages: runs on any node's python3).

Each receiver accepts one connection, writes the stream to a file (or into ``tar -x``) while forwarding the
same bytes to the next node, so N nodes receive a file in about the time of one transfer and every link
carries it once. The file is hashed as it streams and only renamed into place when its sha256 matches.

  gpufleet_relay.py recv --listen IP:PORT (--out FILE --sha256 HEX | --untar DIR) [--next IP:PORT]
  gpufleet_relay.py send --to IP:PORT (--file FILE | --tar-dir DIR)
Exit codes: 0 done, 2 usage, 3 checksum mismatch, 4 network or timeout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import time

CHUNK = 1 << 20


def address(text):
    host, _, port = text.rpartition(":")
    return host, int(port)


def connect(target, timeout):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection(target, timeout=30)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def fail(code, message):
    print(json.dumps({"ok": False, "error": message}))
    sys.exit(code)


def open_sink(args):
    if args.untar:
        os.makedirs(args.untar, exist_ok=True)
        proc = subprocess.Popen(["tar", "-x", "-C", args.untar, "--no-same-owner"], stdin=subprocess.PIPE)
        return proc.stdin, proc
    return open(args.out + ".part", "wb"), None


def receive(args):
    server = socket.create_server(address(args.listen), reuse_port=False)
    server.settimeout(args.accept_timeout)  # short: a sender that failed must not leave receivers waiting
    try:
        conn, _ = server.accept()
    except socket.timeout:
        fail(4, f"no sender connected to {args.listen} within {args.accept_timeout} s")
    server.close()
    conn.settimeout(args.timeout)
    downstream = connect(address(args.next), args.timeout) if args.next else None
    sink, proc = open_sink(args)
    digest, total, began = hashlib.sha256(), 0, time.monotonic()
    try:
        while chunk := conn.recv(CHUNK):
            sink.write(chunk)
            if downstream:
                downstream.sendall(chunk)
            digest.update(chunk)
            total += len(chunk)
    except OSError as exc:
        fail(4, f"stream broken after {total} bytes: {exc}")
    finally:
        if downstream:
            downstream.shutdown(socket.SHUT_WR)
            downstream.recv(1)  # wait until the next node has everything before we report success
            downstream.close()
    sink.flush()
    if proc:
        sink.close()
        if proc.wait() != 0:
            fail(3, f"tar -x into {args.untar} failed (exit {proc.returncode})")
    else:
        os.fsync(sink.fileno())
        sink.close()
        if args.sha256 and digest.hexdigest() != args.sha256:
            os.unlink(args.out + ".part")
            fail(3, f"{args.out}: sha256 {digest.hexdigest()}, expected {args.sha256}; removed")
        os.replace(args.out + ".part", args.out)
    conn.close()
    seconds = time.monotonic() - began
    print(json.dumps({"ok": True, "bytes": total, "seconds": round(seconds, 3), "sha256": digest.hexdigest()}))


def send(args):
    sock = connect(address(args.to), args.timeout)
    began = time.monotonic()
    if args.tar_dir:
        names = sorted(n for n in os.listdir(args.tar_dir) if n not in (".git", ".gpufleet-model.json"))
        proc = subprocess.Popen(["tar", "-c", "-C", args.tar_dir, "--", *names], stdout=subprocess.PIPE)
        total = 0
        while chunk := proc.stdout.read(CHUNK):
            sock.sendall(chunk)
            total += len(chunk)
        if proc.wait() != 0:
            fail(4, f"tar -c of {args.tar_dir} failed")
    else:
        with open(args.file, "rb") as src:
            total = sock.sendfile(src)
    sock.shutdown(socket.SHUT_WR)
    sock.recv(1)
    sock.close()
    print(json.dumps({"ok": True, "bytes": total, "seconds": round(time.monotonic() - began, 3)}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    snd.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    if args.mode == "recv" and bool(args.out) == bool(args.untar):
        parser.error("recv needs exactly one of --out and --untar")
    if args.mode == "send" and bool(args.file) == bool(args.tar_dir):
        parser.error("send needs exactly one of --file and --tar-dir")
    receive(args) if args.mode == "recv" else send(args)


if __name__ == "__main__":
    main()
