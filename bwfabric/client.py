"""A thin client of the controller's REST API (``bwfabric status``,
``bwfabric tenants``, ``bwfabric reload``, and the experiments), and the
tables the CLI prints. Standard library only."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class ApiClientError(RuntimeError):
    pass


class ApiClient:
    def __init__(self, base_url: str, token: str, timeout_s: float = 10.0):
        self.base_url, self.token, self.timeout_s = base_url.rstrip("/"), token, timeout_s

    @classmethod
    def from_config(cls, path: str | Path) -> "ApiClient":
        """The API of the controller that runs ``path`` (its listener and token file)."""
        import yaml
        path = Path(path)
        data = yaml.safe_load(path.read_text()) or {}
        api = data.get("api") or {}
        if not api.get("listen") or not api.get("token_file"):
            raise ApiClientError(f"{path}: no api section (listen, token_file)")
        token_file = Path(api["token_file"])
        if not token_file.is_absolute():
            token_file = path.parent / token_file
        return cls(f"http://{api['listen']}", token_file.read_text().strip())

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.status, _decode(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _decode(exc.read())
        except (urllib.error.URLError, OSError) as exc:
            raise ApiClientError(f"{self.base_url}: {getattr(exc, 'reason', exc)}") from None

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """The reply of a request that must succeed; ApiClientError names why it did not."""
        code, reply = self.request(method, path, body)
        if code != 200:
            problems = "\n  ".join(reply.get("problems") or []) if isinstance(reply, dict) else ""
            error = reply.get("error") if isinstance(reply, dict) else reply
            raise ApiClientError(f"{method} {path}: {code} {error}" + (f"\n  {problems}" if problems else ""))
        return reply

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def put(self, path: str, body: Any) -> Any:
        return self.call("PUT", path, body)

    def delete(self, path: str) -> Any:
        return self.call("DELETE", path)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=self.timeout_s) as resp:
            return resp.read().decode()


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def natural(name: str) -> tuple:
    """h2 before h10."""
    import re
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [[str(c) for c in header]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def status_text(status: dict, agents: list[dict], tenants: dict) -> str:
    out = [f"configuration {status['digest']} version {status['version']} (generation {status['generation']}), "
           f"{status['routing']}; {status['switches']} switches, {status['hosts']} hosts; "
           f"{status['tenants']} tenants, {status['vms']} VMs; refused changes: {status['load_errors']}"]
    if status.get("last_error"):
        out.append(f"last refused change: {status['last_error']}")
    rows = []
    by_host = {a["host"]: a for a in agents}
    for t, tenant in sorted(tenants.items()):
        for vm, v in sorted(tenant["vms"].items(), key=lambda kv: natural(kv[0])):
            agent = by_host.get(v["host"]) or {}
            # a VM in a namespace of its own has its state under the agent's vms; a host that is its VM, at the top
            one = (agent.get("vms") or {}).get(f"{t}/{vm}") if v.get("netns") else agent
            one = one or {}
            rows.append([t, vm, v["host"], v.get("address") or "(host's)", v["guarantee_mbps"], v["weight"],
                         tenant["policy"], tenant["wc_subflows"],
                         {True: "yes", False: "NO", None: "-"}[one.get("in_force")],
                         None if one.get("bg_rate_bps") is None else f"{one['bg_rate_bps'] / 1e6:.2f}"])
    out += ["", table(rows, ["tenant", "vm", "host", "address", "guarantee Mb/s", "weight", "policy", "WC subflows",
                             "in force", "BG Mb/s"])]
    rows = [[a["host"], "up" if a["connected"] else "DOWN", a["version_in_force"],
             {True: "yes", False: "NO", None: "-"}[a["in_force"]],
             None if a["bg_rate_bps"] is None else f"{a['bg_rate_bps'] / 1e6:.2f}",
             a["pushes"], a["push_failures"], a["last_error"]] for a in sorted(agents, key=lambda a: natural(a["host"]))]
    out += ["", table(rows, ["agent", "session", "version", "in force", "BG Mb/s", "pushes", "failures",
                             "last error"])]
    return "\n".join(out)
