"""``gpufleet deploy -i INVENTORY``: run the stages, show them live, end with the report.

Also the shared driver of ``status`` and ``teardown``: progress on stderr, the report on stdout (one JSON
object with ``--json``), exit 0 when the run succeeded, 1 when a stage failed or the inventory has
problems, 2 for arguments that cannot work (a missing inventory or bundle, an unknown stage), 130 when
interrupted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console

from gpufleet.fleet import Fleet, load
from gpufleet.fleet.services import plan_replicas
from gpufleet.problems import InventoryError
from gpufleet.runner import STAGES, DeployError, DeployReport, ProgressSink, StatusReport, deploy
from gpufleet.runner.availability import INTERVAL, MAX_INTERVAL, MAX_STREAMS, MIN_INTERVAL, STREAMS
from gpufleet.runner.progress import LiveProgress, print_deploy_report
from gpufleet.vllm_log import PlanFigures

Report = TypeVar("Report", DeployReport, StatusReport)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "deploy",
        help="run the stages on the inventory's hosts and report what vLLM serves",
        description="Validate the inventory with the -e values over it (whichever stages run), then run the "
        "stages in order ("
        + " → ".join(STAGES)
        + "); a failing stage stops the run. A --limit part that selects no host is refused, naming it. "
        "Exit 0 deployed, 1 a stage failed or the inventory is invalid, 2 usage error.",
    )
    parser.add_argument("-i", "--inventory", type=Path, required=True, help="inventory file or directory")
    parser.add_argument(
        "--bundle", type=Path, metavar="DIR", help="offline bundle: take every artifact from it"
    )
    parser.add_argument(
        "--bundle-signer",
        type=Path,
        metavar="ALLOWED_SIGNERS",
        help="refuse the bundle unless its lock is signed by a key this ssh-keygen allowed-signers file "
        "lists (sets gpufleet_bundle_signers)",
    )
    parser.add_argument("--stages", metavar="A,B", help="comma-separated subset of the stages (run in order)")
    parser.add_argument("--check", action="store_true", help="Ansible check mode: report, change nothing")
    parser.add_argument("--limit", metavar="PATTERN", help="only these hosts (Ansible --limit)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument(
        "-e",
        "--extra-var",
        dest="extra_vars",
        action="append",
        default=[],
        type=extra_var,
        metavar="NAME=VALUE",
        help="a variable for this run over the inventory's (Ansible -e): -e gpufleet_monitoring=true",
    )
    parser.add_argument(
        "--no-rollback",
        dest="rollback",
        action="store_false",
        help="when the cluster, serve or verify stage fails, leave the fleet as the failure left it "
        "(default: restore every node's last healthy revision and pass the health gate again)",
    )
    add_load_arguments(parser)
    parser.set_defaults(func=run)


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """--load and --load-interval (deploy, rollback): the steady load through the edge that measures a change
    of services (deploy()'s and rollback()'s ``load`` and ``load_interval``)."""
    parser.add_argument(
        "--load",
        type=streams,
        default=STREAMS,
        metavar="N",
        help=f"services: N concurrent streams of short chats through the edge while the change runs, "
        f"measured in the report's availability (default {STREAMS}; 0: none)",
    )
    parser.add_argument(
        "--load-interval",
        type=pause,
        default=INTERVAL,
        metavar="SECONDS",
        help=f"services: at most one request per SECONDS in each stream (default {INTERVAL}); a fleet short "
        "of CPU (vLLM's CPU build, the lab) is slowed by a dense load: 2 there",
    )


def streams(text: str) -> int:
    """--load: a whole number of streams, 0 to MAX_STREAMS."""
    if not (text.isascii() and text.strip().isdigit() and int(text) <= MAX_STREAMS):
        raise argparse.ArgumentTypeError(
            f"found {text!r}; expected a whole number of streams from 0 to {MAX_STREAMS}. "
            "Fix: e.g. --load 1 (0: no load)"
        )
    return int(text)


def pause(text: str) -> float:
    """--load-interval: seconds from MIN_INTERVAL to MAX_INTERVAL (a stream without a pause would flood the
    edge)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not MIN_INTERVAL <= seconds <= MAX_INTERVAL:  # nan fails both
        raise argparse.ArgumentTypeError(
            f"found {text!r}; expected seconds between one stream's requests, from {MIN_INTERVAL} to "
            f"{MAX_INTERVAL:g}. Fix: e.g. --load-interval {INTERVAL} (the default), or --load 0 for no load"
        )
    return seconds


def extra_var(text: str) -> tuple[str, str]:
    """NAME=VALUE, VALUE kept as a string, as ``ansible-playbook -e key=value`` keeps it (roles read it with
    | bool and | int, and argument specs convert it)."""
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAME=VALUE with NAME a variable name. Fix: e.g. -e gpufleet_monitoring=true"
        )
    return name, value


def readable(inventory: Path) -> Fleet | None:
    """The fleet, read (not validated); InventoryError when the inventory cannot be read as one (binary, not
    UTF-8, no hosts file, vars that are not mappings, no host in gpu_nodes): Ansible would otherwise run on an
    empty inventory, match no host and report success. Unlike deploy's validation, a fleet that would not plan
    still passes: teardown and status must work on it. None for a missing inventory (the runner names it)."""
    if not inventory.exists():
        return None  # the runner names a missing inventory (exit 2)
    from gpufleet.problems import Problem  # noqa: PLC0415

    fleet = load(inventory, validate=False)
    if fleet.raw is None:
        raise InventoryError(list(fleet.problems))
    raw = fleet.raw
    unreadable = [problem for problem in raw.problems if problem.variable == "-i"]
    if not raw.members("gpu_nodes"):
        unreadable.append(
            Problem(
                str(inventory),
                "gpu_nodes",
                "no hosts in group gpu_nodes",
                "at least one host",
                "pass the inventory of the fleet (hosts under gpu_nodes, in ray_head or ray_workers)",
            )
        )
    if unreadable:
        raise InventoryError(unreadable)
    return fleet


def check_bundle(bundle: Path | None, signers: Path | None = None) -> None:
    """A bundle whose lock cannot be read, or (with ``--bundle-signer``) is not signed by an allowed key, is
    refused before any stage runs (exit 2); preflight checks the signature again (gpufleet_bundle_signers)."""
    if signers is not None and bundle is None:
        raise DeployError(
            f"command line: --bundle: found nothing; expected the offline bundle whose signature "
            f"--bundle-signer {signers} checks. Fix: pass --bundle DIR too, or leave --bundle-signer out"
        )
    if bundle is None or not (bundle / "bundle.lock.yml").is_file():
        return  # the runner names a missing directory or lock
    from gpufleet.bundle import LockError, read_lock  # noqa: PLC0415
    from gpufleet.bundle.signature import SignatureError, check  # noqa: PLC0415

    try:
        if signers is not None:
            check(bundle, signers, variable="--bundle-signer")
        read_lock(bundle)
    except SignatureError as error:
        raise DeployError(f"{error} Nothing was changed on any host.") from None
    except LockError as error:
        raise DeployError(f"--bundle {bundle}: {error}") from None


def signer_variables(args: argparse.Namespace) -> dict[str, str]:
    """The extra variables with ``--bundle-signer`` as gpufleet_bundle_signers (absolute: Ansible resolves a
    relative one against the inventory, the command line against the working directory)."""
    variables = dict(args.extra_vars)
    if args.bundle_signer is not None:
        if "gpufleet_bundle_signers" in variables:
            raise DeployError(
                "command line: gpufleet_bundle_signers: found it both as --bundle-signer and as -e; "
                "expected it once. "
                "Fix: give the allowed signers once, with --bundle-signer"
            )
        variables["gpufleet_bundle_signers"] = str(args.bundle_signer.resolve())
    return variables


def run(args: argparse.Namespace) -> int:
    stages = args.stages.split(",") if args.stages is not None else None

    def call(progress: ProgressSink | None) -> DeployReport:
        check_bundle(args.bundle, args.bundle_signer)
        variables = signer_variables(args)
        # Read and checked once (with -e over it): deploy's stages, checks and endpoint, and the plan below.
        fleet = load(args.inventory, validate=False).with_extra_vars(variables).validate()
        report = deploy(
            fleet,
            bundle=args.bundle,
            stages=stages,
            extra_vars=variables,
            check=args.check,
            limit=args.limit,
            progress=progress,
            rollback=args.rollback,
            load=args.load,
            load_interval=args.load_interval,
        )
        return finished(report, fleet, args)

    return run_reporting(call, print_deploy_report, as_json=args.json)


def finished(report: DeployReport, fleet: Fleet, args: argparse.Namespace) -> DeployReport:
    """The run's report with what the planner adds: vLLM's facts against its prediction, and the warning of
    an image that runs another vLLM release than the one it predicts."""
    # Planned only now, and only when vLLM reported facts to compare with: the one instance's, or each
    # replica's against its own plan (on its own GPUs).
    plan = planned(fleet) if report.vllm is not None else None
    report = report.compared_with(plan) if plan is not None else report
    if report.replicas and fleet.spec is not None:
        report = report.replicas_compared_with(plan_replicas(fleet.spec).plans)
    caveats = image_caveats(fleet, signer_variables(args), args.bundle)
    return report.model_copy(update={"warnings": (*report.warnings, *caveats)}) if caveats else report


def run_reporting(
    call: Callable[[ProgressSink | None], Report], show: Callable[[Console, Report], None], *, as_json: bool
) -> int:
    """Run ``call`` with a live display (on stderr; with ``--json`` only on a terminal), then report."""
    errors = Console(stderr=True)
    try:
        if as_json and not errors.is_terminal:
            report = call(None)
        else:
            with LiveProgress(errors) as live:
                report = call(live)
    except DeployError as error:
        return _refuse(str(error), as_json, code=2)
    except InventoryError as error:
        return _refuse(str(error), as_json, code=1, suffix="nothing was changed on any host.")
    if as_json:
        print(report.model_dump_json(indent=2))
    else:
        show(Console(), report)
    return exit_code(report)


def exit_code(report: DeployReport | StatusReport) -> int:
    if report.ok:
        return 0
    stages = report.stages if isinstance(report, DeployReport) else (report.stage,)
    if isinstance(report, DeployReport) and report.rollback is not None and report.rollback.stage is not None:
        stages = (*stages, report.rollback.stage)  # interrupted during the automatic rollback: canceled too
    return 130 if any(stage.status == "canceled" for stage in stages) else 1


def planned(inventory: Path | Fleet) -> PlanFigures | None:
    """The planner's prediction for the fleet, to compare with what vLLM measured; None if unplannable."""
    try:
        from gpufleet.planner import plan  # noqa: PLC0415

        fleet = load(inventory) if isinstance(inventory, Path) else inventory
        return plan(fleet.plan_request())
    except (ImportError, InventoryError, ValueError):
        return None


def image_caveats(fleet: Fleet, extra_vars: dict[str, Any], bundle: Path | None) -> list[str]:
    """``gpufleet validate``'s warning when the image runs another vLLM than the planner's, for the image
    this run deployed (``-e ray_cluster_image`` and ``--bundle`` over the inventory's); none for a fleet
    that is not valid (deploy refused it) or has no GPUs (not planned)."""
    from gpufleet.fleet.compatibility import fleet_vllm_version_warnings  # noqa: PLC0415

    checked = fleet.validate()  # itself: the run loaded it validated
    if checked.spec is None or checked.raw is None:
        return []
    spec = (
        checked.spec if bundle is None else checked.spec.model_copy(update={"bundle_dir": bundle.resolve()})
    )
    return fleet_vllm_version_warnings(spec, checked.raw, extra_vars)


def _refuse(message: str, as_json: bool, *, code: int, suffix: str = "") -> int:
    lines = message.splitlines() or [message]
    if as_json:
        print(json.dumps({"ok": False, "problems": lines}, indent=2))
    for line in lines:
        print(line, file=sys.stderr)
    if suffix:
        print(suffix, file=sys.stderr)
    return code
