"""TEST DOUBLE for Grafana: the lab has no Grafana image (none of the registries it reaches carries one).

It reads what the monitoring role gives a real Grafana container, the same way: the GF_* environment
(listen address and port, admin user and password, anonymous access) and the provisioning directory
(/etc/grafana/provisioning: data sources, and dashboard providers whose options.path holds the JSON).
It answers the few API calls the lab test makes, with Grafana's paths and shapes:

- GET /api/health (open);
- GET /api/search?tag=T, /api/dashboards/uid/<uid>, /api/datasources, /api/user (basic auth as the
  admin; 401 otherwise, anonymous access being off).

It exits 1 at start-up, naming the file, when a provisioning file cannot be read, a provider's path holds no
dashboard, or a dashboard is not JSON with a uid and a title: what would leave a real Grafana without them.
The real Grafana path (image, provisioning) is exercised only where a bundle carries the image.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlparse

import yaml

PROVISIONING = Path(os.environ.get("GF_PATHS_PROVISIONING", "/etc/grafana/provisioning"))


def fail(message: str) -> None:
    print(f"grafana-double: {message}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        fail(f"{path}: {error}")
        return None


def provisioned() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    datasources = [
        source
        for path in sorted((PROVISIONING / "datasources").glob("*.yml"))
        for source in (read_yaml(path) or {}).get("datasources", [])
    ]
    dashboards = []
    for path in sorted((PROVISIONING / "dashboards").glob("*.yml")):
        for provider in (read_yaml(path) or {}).get("providers", []):
            folder = Path(provider["options"]["path"])
            files = sorted(folder.glob("*.json"))
            if not files:
                fail(f"{path}: provider {provider.get('name')!r}: no dashboard in {folder}")
            for file in files:
                try:
                    dashboard = json.loads(file.read_text(encoding="utf-8"))
                except (OSError, ValueError) as error:
                    fail(f"{file}: {error}")
                if not dashboard.get("uid") or not dashboard.get("title"):
                    fail(f"{file}: a dashboard needs a uid and a title")
                dashboards.append(dashboard | {"_folder": provider.get("folder", "")})
    return datasources, dashboards


class Handler(BaseHTTPRequestHandler):
    datasources: ClassVar[list[dict[str, Any]]] = []
    dashboards: ClassVar[list[dict[str, Any]]] = []

    def send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def admin(self) -> bool:
        expected = (
            f"{os.environ.get('GF_SECURITY_ADMIN_USER', 'admin')}:{os.environ['GF_SECURITY_ADMIN_PASSWORD']}"
        )
        given = self.headers.get("Authorization", "")
        return given == "Basic " + base64.b64encode(expected.encode()).decode()

    def do_GET(self) -> None:
        url = urlparse(self.path)
        if url.path == "/api/health":
            self.send(200, {"database": "ok", "version": "test-double"})
            return
        anonymous = os.environ.get("GF_AUTH_ANONYMOUS_ENABLED", "false").lower() == "true"
        if not (anonymous or self.admin()):
            self.send(401, {"message": "Unauthorized"})
            return
        if url.path == "/api/search":
            tags = parse_qs(url.query).get("tag", [])
            found = [d for d in self.dashboards if all(tag in d.get("tags", []) for tag in tags)]
            self.send(
                200,
                [
                    {
                        "uid": d["uid"],
                        "title": d["title"],
                        "tags": d.get("tags", []),
                        "type": "dash-db",
                        "folderTitle": d["_folder"],
                    }
                    for d in found
                ],
            )
        elif url.path.startswith("/api/dashboards/uid/"):
            uid = url.path.rsplit("/", 1)[-1]
            match = [d for d in self.dashboards if d["uid"] == uid]
            self.send(200, {"dashboard": match[0]}) if match else self.send(
                404, {"message": "Dashboard not found"}
            )
        elif url.path == "/api/user":
            login = os.environ.get("GF_SECURITY_ADMIN_USER", "admin")
            self.send(200, {"login": login, "isGrafanaAdmin": True})
        elif url.path == "/api/datasources":
            self.send(200, self.datasources)
        else:
            self.send(404, {"message": "Not found"})


def main() -> None:
    Handler.datasources, Handler.dashboards = provisioned()
    address = (
        os.environ.get("GF_SERVER_HTTP_ADDR", "0.0.0.0"),
        int(os.environ.get("GF_SERVER_HTTP_PORT", "3000")),
    )
    print(f"grafana-double: {len(Handler.dashboards)} dashboards on {address[0]}:{address[1]}", flush=True)
    ThreadingHTTPServer(address, Handler).serve_forever()


if __name__ == "__main__":
    main()
