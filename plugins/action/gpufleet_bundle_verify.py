"""Action plugin ``gpufleet_bundle_verify``: check an offline bundle on the control node, before hosts change.

The same check as ``gpufleet bundle verify`` (every lock entry by size and sha256, extra files), through
:func:`gpufleet.bundle.verified.verify_cached`, which skips re-hashing files unchanged since they last
matched. playbooks/preflight.yml runs it once, so a corrupted bundle file stops the run before the nodes
stage. With ``signers`` (``gpufleet_bundle_signers``: an ssh-keygen allowed-signers file) the lock must
first carry a good signature by a key that file lists (:func:`gpufleet.bundle.signature.check`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


class ActionModule(ActionBase):  # type: ignore[misc]
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("bundle", "cache", "signers"))
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        bundle = str(self._task.args.get("bundle") or "")
        if not bundle:
            return result | {"failed": True, "msg": "gpufleet_bundle_verify: bundle: expected a directory"}
        try:
            from gpufleet.bundle import LockError  # noqa: PLC0415
            from gpufleet.bundle.signature import SignatureError, check  # noqa: PLC0415
            from gpufleet.bundle.verified import verify_cached  # noqa: PLC0415
        except ImportError:
            return result | {
                "failed": True,
                "msg": "the gpufleet Python package is not importable by this ansible-playbook's Python; "
                "install it into the same environment (pip install -e . in the gpufleet checkout)",
            }
        root = Path(bundle)
        if not root.is_dir():
            return result | {
                "failed": True,
                "msg": f"control node: gpufleet_bundle_dir {bundle}: not a directory; nothing was changed on "
                "any host. Fix: point gpufleet_bundle_dir at the directory `gpufleet bundle build` wrote",
            }
        signer = ""
        if signers := str(self._task.args.get("signers") or ""):
            allowed = Path(signers)
            if not allowed.is_absolute():  # relative to the inventory, as gpufleet_bundle_dir is
                allowed = Path(str((task_vars or {}).get("inventory_dir") or ".")) / allowed
            try:
                found = check(root, allowed, variable="gpufleet_bundle_signers")
            except SignatureError as exc:
                return result | {"failed": True, "msg": f"{exc} Nothing was changed on any host."}
            signer = f"; lock signed by {found.principal} ({found.fingerprint})"
        cache = None if self._task.args.get("cache", True) else Path(self._make_tmp_path_local())
        try:
            verified = verify_cached(root, cache=cache)
        except LockError as exc:
            return result | {"failed": True, "msg": f"control node: {exc} Nothing was changed on any host."}
        result.update(
            changed=False,
            problems=verified.problems,
            hashed=verified.hashed,
            trusted=verified.trusted,
            seconds=verified.seconds,
        )
        if verified.problems:
            result["failed"] = True
            result["msg"] = (
                f"control node: bundle {bundle} does not match its bundle.lock.yml ({len(verified.problems)} "
                "problem(s)); nothing was changed on any host:\n"
                + "\n".join(verified.problems)
                + "\nFix: restore these files from the bundle's source (or rebuild it with `gpufleet bundle "
                f"build`); `gpufleet bundle verify {bundle}` checks it again."
            )
        else:
            result["msg"] = (
                f"bundle {bundle} matches its lock: {verified.hashed} file(s) hashed, {verified.trusted} "
                f"unchanged since they last matched, {verified.seconds} s{signer}"
            )
            display.display(result["msg"])
        return result

    def _make_tmp_path_local(self) -> str:
        import tempfile  # noqa: PLC0415

        return tempfile.mkdtemp(prefix="gpufleet-verify-")
