"""A local git-lfs remote laid out like ModelScope, for the lab and the tests.

``make_lfs_repo`` turns a model directory into ``<root>/<org>/<name>.git`` (a bare repository on branch
master, ``*.safetensors`` and friends through LFS, like ModelScope's .gitattributes). git-lfs 3.3 reaches
such a repository through ``file://`` URLs by itself (its built-in ``lfs-standalone-file`` transfer agent),
and ``LfsServer`` serves it over HTTP the way ModelScope does: git's dumb HTTP protocol for the repository
plus the LFS batch API and basic transfers (with Range requests, so interrupted downloads resume).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpufleet.bundle.fetch import run

# The patterns ModelScope puts in a new model repository's .gitattributes (the weight formats that matter).
GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in (
        "*.7z",
        "*.bin",
        "*.ckpt",
        "*.gguf",
        "*.h5",
        "*.msgpack",
        "*.onnx",
        "*.pb",
        "*.pt",
        "*.pth",
        "*.safetensors",
        "*.tar.gz",
        "*.zip",
        "tokenizer.json",
    )
)
_FIXED_ENV = {
    "GIT_AUTHOR_NAME": "gpufleet",
    "GIT_AUTHOR_EMAIL": "gpufleet@localhost",
    "GIT_COMMITTER_NAME": "gpufleet",
    "GIT_COMMITTER_EMAIL": "gpufleet@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}
_CHUNK = 64 * 1024


def make_lfs_repo(
    model_dir: Path, root: Path, repo_id: str, message: str = "Upload model"
) -> tuple[Path, str]:
    """Publish ``model_dir`` as the bare repository ``root/<repo_id>.git``; returns (path, commit)."""
    bare = root / f"{repo_id}.git"
    shutil.rmtree(bare, ignore_errors=True)
    bare.parent.mkdir(parents=True, exist_ok=True)
    run(["git", "init", "--quiet", "--bare", "-b", "master", str(bare)], what=repo_id)
    with tempfile.TemporaryDirectory(prefix="gpufleet-lfsrepo-") as tmp:
        work = Path(tmp)
        run(["git", "init", "--quiet", "-b", "master", str(work)], what=repo_id)
        run(["git", "-C", tmp, "lfs", "install", "--local"], what=repo_id)
        (work / ".gitattributes").write_text(GITATTRIBUTES)
        for item in sorted(model_dir.iterdir()):
            if item.is_file():
                shutil.copyfile(item, work / item.name)
        run(["git", "-C", tmp, "add", "--all"], what=repo_id)
        run(["git", "-C", tmp, "commit", "--quiet", "-m", message], what=repo_id, env=_FIXED_ENV)
        run(["git", "-C", tmp, "push", "--quiet", bare.resolve().as_uri(), "master"], what=repo_id)
        commit = run(["git", "-C", tmp, "rev-parse", "HEAD"], what=repo_id).strip()
    run(["git", "-C", str(bare), "update-server-info"], what=repo_id)
    return bare, commit


def lfs_object_path(bare: Path, oid: str) -> Path:
    return bare / "lfs" / "objects" / oid[:2] / oid[2:4] / oid


@dataclass
class ServerLog:
    """What the server saw, for tests: each request's method, path and Range header."""

    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, method: str, path: str, byte_range: str | None) -> None:
        with self.lock:
            self.requests.append((method, path, byte_range))


class LfsServer(ThreadingHTTPServer):
    """Serves every ``*.git`` repository under ``root``: dumb git HTTP + the LFS batch API.

    ``rate`` (bytes/s per download, 0 = unlimited) slows LFS object downloads so a test can interrupt one.
    """

    daemon_threads = True

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 0, rate: int = 0) -> None:
        super().__init__((host, port), _Handler)
        self.root = root.resolve()
        self.rate = rate
        self.log = ServerLog()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> LfsServer:
        self._thread = threading.Thread(target=self.serve_forever, name="lfs-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def __enter__(self) -> LfsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_OBJECT = re.compile(r"^/(?P<repo>.+\.git)/info/lfs/objects/(?P<oid>[0-9a-f]{64})$")
_BATCH = re.compile(r"^/(?P<repo>.+\.git)/info/lfs/objects/batch$")


class _Handler(BaseHTTPRequestHandler):
    server: LfsServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the ServerLog keeps what tests need."""

    def _local(self, urlpath: str) -> Path | None:
        target = (self.server.root / urlpath.lstrip("/")).resolve()
        return target if target.is_relative_to(self.server.root) and target.is_file() else None

    def _send_json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.git-lfs+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        self.server.log.add("GET", path, self.headers.get("Range"))
        if match := _OBJECT.match(path):
            bare = self._local(match["repo"] + "/HEAD")
            obj = lfs_object_path(bare.parent, match["oid"]) if bare else None
            self._send_file(obj if obj and obj.is_file() else None, throttle=True)
        else:
            self._send_file(self._local(path), throttle=False)

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        self.server.log.add("POST", path, None)
        match = _BATCH.match(path)
        head = self._local(match["repo"] + "/HEAD") if match else None
        if not match or head is None:
            self._send_json(HTTPStatus.NOT_FOUND, {"message": f"no repository at {path}"})
            return
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        if request.get("operation") != "download":
            self._send_json(HTTPStatus.FORBIDDEN, {"message": "this remote is read-only"})
            return
        objects = [self._batch_object(head.parent, match["repo"], obj) for obj in request.get("objects", [])]
        self._send_json(HTTPStatus.OK, {"transfer": "basic", "objects": objects})

    def _batch_object(self, bare: Path, repo: str, obj: dict[str, Any]) -> dict[str, Any]:
        oid, size = str(obj.get("oid", "")), obj.get("size")
        local = lfs_object_path(bare, oid) if re.fullmatch(r"[0-9a-f]{64}", oid) else None
        if local is None or not local.is_file():
            return {"oid": oid, "size": size, "error": {"code": 404, "message": "object not found"}}
        href = f"http://{self.headers.get('Host')}/{repo}/info/lfs/objects/{oid}"
        return {"oid": oid, "size": size, "authenticated": True, "actions": {"download": {"href": href}}}

    def _send_file(self, path: Path | None, *, throttle: bool) -> None:
        if path is None:
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        size = path.stat().st_size
        start = _range_start(self.headers.get("Range"), size)
        self.send_response(HTTPStatus.PARTIAL_CONTENT if start else HTTPStatus.OK)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.send_header("Content-Length", str(size - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        with path.open("rb") as src:
            src.seek(start)
            self._copy(src, self.server.rate if throttle else 0)

    def _copy(self, src: Any, rate: int) -> None:
        began, sent = time.monotonic(), 0
        while chunk := src.read(_CHUNK):
            try:
                self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                return
            sent += len(chunk)
            if rate and (ahead := sent / rate - (time.monotonic() - began)) > 0:
                time.sleep(ahead)


def _range_start(header: str | None, size: int) -> int:
    """The first byte of a ``bytes=N-`` request (0 when absent, unparsable or past the end)."""
    match = re.fullmatch(r"bytes=(\d+)-", header or "")
    start = int(match[1]) if match else 0
    return start if start < size else 0


def serve_forever(root: Path, host: str, port: int) -> None:  # pragma: no cover - manual use
    """Run a server in the foreground (``python -m gpufleet.bundle.lfs ROOT HOST PORT``)."""
    with LfsServer(root, host, port) as server:
        print(f"serving {root} at {server.url}", flush=True)
        while True:
            time.sleep(3600)


if __name__ == "__main__":  # pragma: no cover
    import sys

    serve_forever(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
