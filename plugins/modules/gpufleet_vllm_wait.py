#!/usr/bin/python
"""Ansible module: wait until vLLM lists the served model, and stop waiting when vLLM keeps exiting.

``until`` on a uri task can only watch the endpoint, so an image that exits at start (built for a newer
driver, a broken build) was waited on for the whole start timeout (30 minutes by default) before anything
said so. This module polls ``/v1/models`` and, between polls, the systemd unit that runs vLLM: when the unit
has restarted ``max_restarts`` times since the wait began (vLLM exited each time), or has failed, it stops
at once, and the caller shows vLLM's log. A model that loads slowly restarts nothing and is waited for.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpufleet_vllm_wait
author: gpufleet maintainers (@gpufleet)
short_description: Wait until vLLM lists the served model; stop early when its unit keeps restarting
description:
  - Polls URL/v1/models with the API key until the served model is listed, and the unit's NRestarts and
    ActiveState between polls; fails when the unit restarted max_restarts times or failed, or on timeout.
  - Used by the gpufleet.gpufleet.vllm_service role (wait.yml). Changes nothing.
options:
  url: {type: str, required: true, description: "vLLM's base URL (http://HOST:PORT)."}
  api_key: {type: str, required: true, description: The API key (a Bearer token; never logged).}
  served_model: {type: str, required: true, description: The name /v1/models must list.}
  unit: {type: str, required: true, description: The systemd unit that runs vLLM.}
  timeout: {type: int, default: 1800, description: Seconds to wait in all.}
  interval:
    type: int
    default: 1
    description:
      - Seconds between polls (each one HTTP request and one systemctl show).
      - The wait ends at most this long after vLLM lists the model.
  max_restarts: {type: int, default: 2, description: Restarts of the unit that end the wait (0 = never).}
"""

EXAMPLES = r"""
- name: Wait until vLLM serves the model
  gpufleet.gpufleet.gpufleet_vllm_wait:
    url: http://10.0.0.11:8000
    api_key: "{{ __vllm_service_api_key }}"
    served_model: tiny
    unit: gpufleet-vllm@default.service
"""

RETURN = r"""
status:
  description: The HTTP status of the last poll (0 when it did not answer).
  returned: always
  type: int
restarts:
  description: How often the unit restarted while this waited.
  returned: always
  type: int
seconds:
  description: How long it waited.
  returned: always
  type: float
why:
  description: Why it stopped without the model (restarts, failed, key, timeout); empty when it served.
  returned: always
  type: str
"""

import json
import time
import urllib.error
from typing import TYPE_CHECKING, Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

# Shared host-side code: plugins/module_utils (docs/conventions.md, Python layout, says why in this shape)
if TYPE_CHECKING:  # mypy reads the repository's
    from plugins.module_utils.gpufleet_units import unit_properties
else:
    try:  # a checkout or the wheel: ansible.cfg's module_utils path, beside library
        from ansible.module_utils.gpufleet_units import unit_properties
    except ImportError:  # the installed collection
        from ansible_collections.gpufleet.gpufleet.plugins.module_utils.gpufleet_units import unit_properties


def unit_state(unit: str) -> tuple[int, str]:
    """(NRestarts, ActiveState) of a systemd unit; (0, '') when systemctl cannot say."""
    values = unit_properties(unit, ("NRestarts", "ActiveState"))
    try:
        return int(values.get("NRestarts", "0") or 0), values.get("ActiveState", "")
    except ValueError:
        return 0, values.get("ActiveState", "")


def listed(url: str, key: str, served: str) -> tuple[int, bool]:
    try:
        response = open_url(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
        body = json.loads(response.read() or b"{}")
        names = [entry.get("id") for entry in body.get("data", []) if isinstance(entry, dict)]
        return int(response.getcode()), served in names
    except urllib.error.HTTPError as refused:
        return int(refused.code), False
    except Exception:  # refused, reset, a half-sent reply while the server starts: not yet
        return 0, False


def run(params: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    first = unit_state(params["unit"])[0]
    status, restarts, why = 0, 0, "timeout"
    while True:
        status, ready = listed(params["url"].rstrip("/"), params["api_key"], params["served_model"])
        if ready:
            why = ""
            break
        if status in (401, 403):  # up, but not with the key clients use: waiting will not change that
            why = "key"
            break
        count, active = unit_state(params["unit"])
        restarts = max(0, count - first)
        if params["max_restarts"] and restarts >= params["max_restarts"]:
            why = "restarts"
            break
        if active in ("failed", "inactive"):  # inactive: it exited 0, and Restart=on-failure leaves it so
            why = "failed"
            break
        if time.monotonic() - started + params["interval"] > params["timeout"]:
            break
        time.sleep(params["interval"])
    return {
        "changed": False,
        "status": status,
        "restarts": restarts,
        "seconds": round(time.monotonic() - started, 1),
        "why": why,
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "api_key": {"type": "str", "required": True, "no_log": True},
            "served_model": {"type": "str", "required": True},
            "unit": {"type": "str", "required": True},
            "timeout": {"type": "int", "default": 1800},
            "interval": {"type": "int", "default": 1},
            "max_restarts": {"type": "int", "default": 2},
        },
        supports_check_mode=True,
    )
    result = run(module.params)
    if result["why"]:
        said = {
            "restarts": f"vLLM exited and its unit restarted {result['restarts']} times",
            "failed": "vLLM's unit failed or stopped",
            "key": "vLLM refuses the API key the control node has (it runs with another one: restart "
            "its unit after the key file changed)",
            "timeout": f"no answer listing the model within {module.params['timeout']} s",
        }[result["why"]]
        module.fail_json(msg=f"{said} (last answer: HTTP {result['status'] or 'none'})", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
