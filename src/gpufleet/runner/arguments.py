"""The one place gpufleet talks to ansible-runner: arguments, environment, signals, one run per stage.

Every ansible-runner argument is built by :func:`runner_arguments`; the ``Runner`` object stays inside
:func:`_run_playbook`. ansible-runner starts ansible-playbook with the caller's whole environment plus its
own variables; :func:`restrict_env` cuts that down to what ansible-runner sets itself, what gpufleet sets
(:func:`runner_env`) and the allow-listed variables of :data:`PASSED_ENV`.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpufleet.runner.combined import CombinedRecorder, combined_playbook
from gpufleet.runner.events import ProgressSink, StageRecorder
from gpufleet.runner.report import StageResult, StageStatus
from gpufleet.runner.transport import crashed_stage

# Taken from the caller's environment when set: locale, identity, the SSH agent, proxies for online mode.
PASSED_ENV = (
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "SSH_AUTH_SOCK",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)
# Set by ansible-runner itself; kept even when the caller's environment had them too.
_RUNNER_ENV = frozenset(
    {
        "ANSIBLE_STDOUT_CALLBACK",
        "ANSIBLE_CALLBACK_PLUGINS",
        "ORIGINAL_STDOUT_CALLBACK",
        "AWX_ISOLATED_DATA_DIR",
        "ANSIBLE_CACHE_PLUGIN",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION",
        "ANSIBLE_RETRY_FILES_ENABLED",
        "RUNNER_OMIT_EVENTS",
        "RUNNER_ONLY_FAILED_EVENTS",
    }
)
PEXPECT_TIMEOUT = 1  # seconds; see runner_arguments
# How ansible-playbook runs tasks. Measured on the 3-host lab (benchmarks/results/deploy.md): each module run
# costs a node about 0.23 s of CPU in a fresh Python that unpacks and compiles Ansible's module_utils from the
# AnsiballZ zip, every task, every host. Mitogen's strategy keeps one Python per node for the run and reuses
# what it imported: the no-op re-run of every stage went from 101 s to 69 s, a 30-task probe from 21 to 8 s.
# The default since the runner-driven lab suite (end-to-end, cancel, local runner: 38 tests) passed under it;
# GPUFLEET_ANSIBLE_STRATEGY=linear goes back to Ansible's own, which is also the fallback without mitogen.
STRATEGY_ENV = "GPUFLEET_ANSIBLE_STRATEGY"
STRATEGIES = ("mitogen_linear", "linear")
# Under mitogen's strategy, what mitogen would otherwise decide for itself. Its SSH method turns on SSH
# compression unless mitogen_ssh_compression says no; on a cluster network that only costs CPU at both ends
# (zlib over archives that are already compressed). Measured on the 3-host lab: copying the bundle's 71 MB
# docker tarball to 3 nodes took 9.6 s of wall time and 9.5 s of the control node's CPU with it, 4.2 s and
# 3.3 s without (benchmarks/results/deploy.md). A caller's own value (deploy(extra_vars=...),
# `gpufleet deploy -e mitogen_ssh_compression=true` for a slow link) wins.
MITOGEN_VARS: dict[str, Any] = {"mitogen_ssh_compression": False}
_STATUS: dict[str, StageStatus] = {"successful": "ok", "canceled": "canceled", "timeout": "timeout"}
Facts = dict[str, tuple[str, Any]]


@dataclass(frozen=True)
class RunSpec:
    """Everything one playbook run needs, checked."""

    stage: str
    project: Path
    playbook: Path
    inventory: Path
    extravars: Mapping[str, Any]
    check: bool = False
    limit: str | None = None
    timeout: int | None = None
    env_passthrough: tuple[str, ...] = ()


def run_stages(
    specs: Sequence[RunSpec],
    progress: ProgressSink | None,
    cancel: Callable[[], bool] | None,
) -> tuple[list[StageResult], Facts]:
    """Each stage in order until one does not end ok; a stage that failed only through a known crash of the
    connection layer (:mod:`gpufleet.runner.transport`) runs once more, with the stages after it."""
    results, facts = _run_stages(specs, progress, cancel)
    crash = crashed_stage(results)
    names = [spec.stage for spec in specs]
    if crash is None or results[-1].name not in names:
        return results, facts
    again, more = _run_stages(specs[names.index(results[-1].name) :], progress, cancel)
    if again:
        again[0] = again[0].model_copy(update={"retried": crash})
    return results[:-1] + again, {**facts, **more}


def _run_stages(
    specs: Sequence[RunSpec],
    progress: ProgressSink | None,
    cancel: Callable[[], bool] | None,
) -> tuple[list[StageResult], Facts]:
    results: list[StageResult] = []
    facts: Facts = {}
    with _interruptible(cancel) as cancelled:
        if len(specs) > 1 and combinable(specs):
            return _run_combined(specs, progress, cancelled)
        for spec in specs:
            if progress:
                progress.stage_started(spec.stage)
            result, published = _run_playbook(spec, progress, cancelled)
            facts.update(published)
            results.append(result)
            if progress:
                progress.stage_finished(result)
            if result.status != "ok":
                break
    return results, facts


def combinable(specs: Sequence[RunSpec]) -> bool:
    """Stages that differ only in their playbook can share one ansible-playbook run."""
    first = specs[0]
    return all(
        replace(spec, stage=first.stage, playbook=first.playbook, timeout=first.timeout) == first
        for spec in specs
    )


def _run_combined(
    specs: Sequence[RunSpec], progress: ProgressSink | None, cancelled: Callable[[], bool]
) -> tuple[list[StageResult], Facts]:
    """Every stage in one ansible-playbook run (gpufleet.runner.combined), reported stage by stage."""
    recorder = CombinedRecorder(specs[0].stage, progress)
    timeouts = [spec.timeout for spec in specs]
    with tempfile.TemporaryDirectory(prefix="gpufleet-runner-") as private:
        playbook = Path(private) / "stages.yml"
        playbook.write_text(combined_playbook([(spec.stage, spec.playbook) for spec in specs]))
        # A stage's timeout bounded each run alone: the run gets their sum, as the stages had in a row.
        timeout = None if None in timeouts else sum(t for t in timeouts if t is not None)
        name = "+".join(spec.stage for spec in specs)
        whole = replace(specs[0], stage=name, playbook=playbook, timeout=timeout)
        outcome = _ansible_playbook(whole, Path(private), recorder, cancelled)
    return recorder.finish(outcome), recorder.facts


def _run_playbook(
    spec: RunSpec, progress: ProgressSink | None, cancelled: Callable[[], bool]
) -> tuple[StageResult, Facts]:
    recorder = StageRecorder(spec.stage, progress)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpufleet-runner-") as private:
        outcome = _ansible_playbook(spec, Path(private), recorder, cancelled)
    return recorder.result(outcome, time.monotonic() - started), recorder.facts


def _ansible_playbook(
    spec: RunSpec,
    private: Path,
    recorder: Callable[[Mapping[str, Any]], bool],
    cancelled: Callable[[], bool],
) -> StageStatus:
    """One ansible-playbook run through ansible-runner; the Runner object stays here."""
    import ansible_runner  # noqa: PLC0415  (heavy; only when a playbook runs)

    arguments = runner_arguments(spec, private, recorder, cancelled)
    runner = ansible_runner.interface.init_runner(**arguments)
    runner.config.env = restrict_env(runner.config.env, os.environ, set(arguments["envvars"]))
    runner.run()
    return _STATUS.get(str(runner.status), "failed")


def runner_arguments(
    spec: RunSpec,
    private_dir: Path,
    event_handler: Callable[[Mapping[str, Any]], bool],
    cancel_callback: Callable[[], bool],
) -> dict[str, Any]:
    """Every argument gpufleet gives ansible-runner, in one place."""
    envvars = runner_env(spec, os.environ)
    mitogen = envvars.get("ANSIBLE_STRATEGY", "").startswith("mitogen")
    return {
        "private_data_dir": str(private_dir),
        "project_dir": str(spec.project),
        "playbook": str(spec.playbook),
        "inventory": str(spec.inventory),
        "extravars": {**(MITOGEN_VARS if mitogen else {}), **spec.extravars},
        "limit": spec.limit,
        "cmdline": "--check" if spec.check else None,
        "envvars": envvars,
        "json_mode": True,
        "quiet": True,
        "timeout": spec.timeout,
        "event_handler": event_handler,
        "cancel_callback": cancel_callback,
        "settings": {
            "suppress_ansible_output": True,
            "suppress_output_file": True,
            # How often ansible-runner asks cancel_callback while ansible-playbook is silent (default 5 s):
            # a cancel must stop everything within gpufleet.runner.owned.CANCEL_SECONDS.
            "pexpect_timeout": PEXPECT_TIMEOUT,
        },
    }


def runner_env(spec: RunSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment gpufleet sets for ansible-playbook, plus the allow-listed part of ``environ``."""
    python_bin = str(Path(sys.executable).parent)  # the venv's bin: ansible-playbook and gpufleet's Python
    env = {name: environ[name] for name in (*PASSED_ENV, *spec.env_passthrough) if name in environ}
    env.update(
        {
            "PATH": os.pathsep.join([python_bin, environ.get("PATH", os.defpath)]),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_CALLBACK_PLUGINS": "",
            "ANSIBLE_STDOUT_CALLBACK": "default",
        }
    )
    if (spec.project / "ansible.cfg").is_file():
        env["ANSIBLE_CONFIG"] = str(spec.project / "ansible.cfg")
    env.update(strategy_env(environ))
    return env


def strategy_env(environ: Mapping[str, str]) -> dict[str, str]:
    """ANSIBLE_STRATEGY (and the plugin path mitogen's needs); ValueError names a wrong choice and the fix."""
    wanted = environ.get(STRATEGY_ENV, STRATEGIES[0]) or STRATEGIES[0]
    if wanted not in STRATEGIES:
        raise ValueError(
            f"{STRATEGY_ENV}={wanted!r}: unknown; expected one of {', '.join(STRATEGIES)}. "
            f"Fix: unset it (mitogen_linear, the default) or set it to linear (Ansible's own)"
        )
    if wanted == "linear":
        return {"ANSIBLE_STRATEGY": "linear"}
    try:
        import ansible_mitogen  # noqa: PLC0415  (only its location is needed)
    except ImportError:
        return {"ANSIBLE_STRATEGY": "linear"}
    plugins = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
    return {"ANSIBLE_STRATEGY": wanted, "ANSIBLE_STRATEGY_PLUGINS": str(plugins)}


def restrict_env(prepared: Mapping[str, str], inherited: Mapping[str, str], ours: set[str]) -> dict[str, str]:
    """ansible-runner's final environment without what it copied from ours and gpufleet did not pass."""
    keep = ours | _RUNNER_ENV
    return {name: value for name, value in prepared.items() if name in keep or name not in inherited}


@contextmanager
def _interruptible(cancel: Callable[[], bool] | None) -> Iterator[Callable[[], bool]]:
    """While stages run, SIGINT and SIGTERM cancel the playbook (ansible-runner stops it cleanly)."""
    received = threading.Event()

    def cancelled() -> bool:
        return received.is_set() or (cancel is not None and cancel())

    if threading.current_thread() is not threading.main_thread():
        yield cancelled
        return
    previous = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    for number in previous:
        signal.signal(number, lambda *_: received.set())
    try:
        yield cancelled
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
