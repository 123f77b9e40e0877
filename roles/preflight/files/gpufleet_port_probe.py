"""Probe the cluster network before the cluster stage: can every node reach the head's ports?

  listen HOST PORTS SECONDS PEERS   on the head: listen on each free PORT (comma-separated), accept until
                                    PEERS connections reached each port or SECONDS passed; a PORT in use
                                    (Ray, on a re-run) is left to its owner, which answers the probe itself.
  connect HOST PORTS SECONDS        on the other nodes: connect to each PORT, retrying until SECONDS passed.

Prints one JSON object {PORT: outcome}; always exits 0 (the play judges the outcome).
"""

import errno
import json
import selectors
import socket
import sys
import time


def listen(host: str, ports: list[int], seconds: float, peers: int) -> dict[str, str]:
    outcome: dict[str, str] = {}
    selector = selectors.DefaultSelector()
    counts: dict[int, int] = {}
    for port in ports:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            in_use = exc.errno == errno.EADDRINUSE
            outcome[str(port)] = "in use" if in_use else f"cannot listen: {exc.strerror}"
            continue
        sock.listen(16)
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, port)
        counts[port] = 0
        outcome[str(port)] = "listening"
    deadline = time.monotonic() + seconds
    while counts and any(n < peers for n in counts.values()) and time.monotonic() < deadline:
        for key, _mask in selector.select(timeout=max(0.0, deadline - time.monotonic())):
            conn, _address = key.fileobj.accept()  # type: ignore[union-attr]
            conn.close()
            counts[key.data] += 1
    for port, n in counts.items():
        outcome[str(port)] = f"{n} of {peers} peers connected"
    return outcome


def connect(host: str, ports: list[int], seconds: float) -> dict[str, str]:
    outcome: dict[str, str] = {}
    for port in ports:
        deadline = time.monotonic() + seconds
        while True:
            try:
                with socket.create_connection((host, port), timeout=min(3.0, seconds)):
                    outcome[str(port)] = "ok"
                    break
            except OSError as exc:
                reason = exc.strerror or str(exc)
                if isinstance(exc, TimeoutError):
                    reason = "timed out (packets dropped?)"
                if time.monotonic() >= deadline:
                    outcome[str(port)] = reason
                    break
                time.sleep(0.5)
    return outcome


def main(argv: list[str]) -> int:
    mode, host, ports = argv[0], argv[1], [int(p) for p in argv[2].split(",") if p]
    if mode == "listen":
        print(json.dumps(listen(host, ports, float(argv[3]), int(argv[4]))))
    else:
        print(json.dumps(connect(host, ports, float(argv[3]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
