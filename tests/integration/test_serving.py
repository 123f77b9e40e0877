"""The serving roles on the lab, through their Molecule scenarios: `ray_cluster` (Ray head + 2 workers in
containers of the CPU serving image) and `vllm_service` (vLLM's CPU build serving the tiny model in the
head's container). Each scenario: prepare (Docker, the image, the model) -> check -> converge ->
idempotence -> testinfra verify -> destroy, on three offline lab hosts.

The image is built (or found in ~/.cache/gpufleet/serving-image) once here and handed to both scenarios.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from conftest import REPO, VENV_BIN, ansible_env, skip_unless_lab_possible

from gpufleet.lab_state import load
from gpufleet.serving_image import DEFAULT_SPEC, BuiltImage, ImageSpec, build

# ray_cluster and vllm_service each copy the 3 GB serving image to 3 hosts; the end-to-end test
# (test_e2e.py) runs both roles in `make test`, these scenarios in `make test-all`.
pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(3600)]

ACTIONS = ("check", "converge", "idempotence", "verify", "destroy")
RECAP = re.compile(r"^(\S+)\s+: actions=\d+\s+successful=\d+.*missing=(\d+)\s+failed=(\d+)", re.MULTILINE)
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


def molecule(
    scenario: str, image: BuiltImage, key_file: Path
) -> tuple[subprocess.CompletedProcess[str], float]:
    env = ansible_env()
    del env["ANSIBLE_CONFIG"]  # Molecule writes and uses its own ansible.cfg
    record = asdict(image) | {"path": str(image.path)}
    env.update(GPUFLEET_SERVING_IMAGE=json.dumps(record), GPUFLEET_TEST_API_KEY_FILE=str(key_file))
    start = time.monotonic()
    result = subprocess.run(
        [str(VENV_BIN / "molecule"), "test", "--scenario-name", scenario],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=MOLECULE_TIMEOUT,
        check=False,
    )
    return result, time.monotonic() - start


def assert_scenario_passed(scenario: str, result: subprocess.CompletedProcess[str], log: Path) -> None:
    log.write_text(result.stdout, encoding="utf-8")
    tail = f"full output: {log}\n" + result.stdout[-8000:]
    assert result.returncode == 0, tail
    assert RECAP.findall(result.stdout) == [(scenario, "0", "0")], tail
    for action in ACTIONS:  # idempotence fails by itself on any changed task of the second converge
        # Molecule writes "➜" on a terminal and ">" otherwise.
        assert re.search(rf"{scenario} (?:➜|>) {action}: Executed: Successful", result.stdout), tail
    assert load(f"molecule-{scenario}") is None, "destroy left the lab up"


def test_ray_cluster_scenario_passes(serving_image: BuiltImage, api_key_file: Path, tmp_path: Path) -> None:
    result, seconds = molecule("ray_cluster", serving_image, api_key_file)
    print(f"ray_cluster scenario: {seconds:.0f} s")
    assert_scenario_passed("ray_cluster", result, tmp_path / "molecule.log")


def test_vllm_service_scenario_passes_and_never_shows_the_key(
    serving_image: BuiltImage, api_key_file: Path, tmp_path: Path
) -> None:
    result, seconds = molecule("vllm_service", serving_image, api_key_file)
    print(f"vllm_service scenario: {seconds:.0f} s")
    assert_scenario_passed("vllm_service", result, tmp_path / "molecule.log")
    key = api_key_file.read_text(encoding="utf-8").strip()
    assert len(key) >= 43
    assert key not in result.stdout, "the API key appeared in Ansible's output"
