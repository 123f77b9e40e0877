"""The serving roles on the lab, through their Molecule scenarios: `ray_cluster` (Ray head + 2 workers in
containers of the CPU serving image) and `vllm_service` (vLLM's CPU build serving the tiny model in the
head's container). Each scenario: prepare (Docker, the image, the model) -> check -> converge ->
idempotence -> testinfra verify -> destroy, on three offline lab hosts.

The image is built (or found in ~/.cache/gpufleet/serving-image) once here and handed to both scenarios.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from conftest import REPO, VENV_BIN, ansible_env, skip_unless_lab_possible

from gpufleet.lab.serving_image import DEFAULT_SPEC, BuiltImage, ImageSpec, build
from gpufleet.lab.state import load

# ray_cluster and vllm_service each copy the 3 GB serving image to 3 hosts; the end-to-end test
# (test_e2e.py) runs both roles in `make test`, these scenarios in `make test-all`.
pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(3600)]

# `molecule test`'s sequence for these scenarios (`create` runs prepare too); the final destroy always runs.
ACTIONS = ("destroy", "syntax", "create", "check", "converge", "idempotence", "verify")
MOLECULE_TIMEOUT = 1800


@pytest.fixture(scope="module")
def serving_image() -> BuiltImage:
    skip_unless_lab_possible()
    return build(ImageSpec.load(DEFAULT_SPEC))


@pytest.fixture(scope="module")
def api_key_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("serving") / "gpufleet.apikey"
    yield path
    path.unlink(missing_ok=True)


def molecule(action: str, scenario: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "molecule"), action, "--scenario-name", scenario],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=MOLECULE_TIMEOUT,
        check=False,
    )


def run_scenario(scenario: str, image: BuiltImage, key_file: Path, log: Path) -> dict[str, float]:
    """`molecule test`, one action at a time so that each is timed; the lab is destroyed whatever happens.

    Returns the seconds per action; fails on the first action that does not succeed, with its output.
    (The idempotence action fails by itself on any changed task of the second converge.)
    """
    env = ansible_env()
    del env["ANSIBLE_CONFIG"]  # Molecule writes and uses its own ansible.cfg
    record = asdict(image) | {"path": str(image.path)}
    env.update(GPUFLEET_SERVING_IMAGE=json.dumps(record), GPUFLEET_TEST_API_KEY_FILE=str(key_file))
    seconds: dict[str, float] = {}
    outputs: list[str] = []
    try:
        for action in ACTIONS:
            start = time.monotonic()
            result = molecule(action, scenario, env)
            seconds[action] = round(time.monotonic() - start, 1)
            outputs.append(result.stdout)
            log.write_text("".join(outputs), encoding="utf-8")
            assert result.returncode == 0, f"{action} failed; full output: {log}\n{result.stdout[-8000:]}"
    finally:
        destroyed = molecule("destroy", scenario, env)
        outputs.append(destroyed.stdout)
        log.write_text("".join(outputs), encoding="utf-8")
    assert destroyed.returncode == 0, destroyed.stdout[-4000:]
    assert load(f"molecule-{scenario}") is None, "destroy left the lab up"
    print(f"{scenario}: seconds per action {json.dumps(seconds)}")
    return seconds


def test_ray_cluster_scenario_passes(serving_image: BuiltImage, api_key_file: Path, tmp_path: Path) -> None:
    seconds = run_scenario("ray_cluster", serving_image, api_key_file, tmp_path / "molecule.log")
    assert list(seconds) == list(ACTIONS)


def test_vllm_service_scenario_passes_and_never_shows_the_key(
    serving_image: BuiltImage, api_key_file: Path, tmp_path: Path
) -> None:
    log = tmp_path / "molecule.log"
    run_scenario("vllm_service", serving_image, api_key_file, log)
    key = api_key_file.read_text(encoding="utf-8").strip()
    assert len(key) >= 43
    assert key not in log.read_text(encoding="utf-8"), (
        "the API key appeared in Ansible's or Molecule's output"
    )
