"""validate and plan on a config.json that is wrong, against one the planner merely does not model.

A value no model has (``hidden_size: true``, ``architectures`` as a string) is refused by validate as
plan refuses it; a valid model the planner does not size (a vision-language model) is a warning.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from gpufleet.fleet import validate_inventory
from gpufleet.planner import PlannerInputError, PlannerUnmodelledError, load_model_config
from gpufleet.planner.arch import parse_arch

REPO = Path(__file__).resolve().parents[2]
QWEN = REPO / "models" / "Qwen2.5-1.5B-Instruct" / "config.json"


def tp_with_config(tmp_path: Path, whole: dict[str, object] | None = None, **changes: object) -> Path:
    """The one-model example (gpufleet_model_config) on a copy of Qwen2.5-1.5B's config.json, changed."""
    inventory = tmp_path / "tp-across-nodes"
    shutil.copytree(REPO / "inventories" / "examples" / "tp-across-nodes", inventory)
    config = whole if whole is not None else json.loads(QWEN.read_text(encoding="utf-8")) | changes
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(config), encoding="utf-8")
    group_vars = inventory / "group_vars" / "gpu_nodes.yml"
    data = yaml.safe_load(group_vars.read_text(encoding="utf-8"))
    data["gpufleet_model_config"] = str(config_file)
    group_vars.write_text(yaml.safe_dump(data), encoding="utf-8")
    return inventory


def test_validate_refuses_a_value_no_model_has(tmp_path: Path) -> None:
    result = validate_inventory(tp_with_config(tmp_path, hidden_size=True))
    (problem,) = [p for p in result.problems if p.variable == "hidden_size"]
    assert ": hidden_size: found True; expected a positive integer" in str(problem)
    assert problem.where == str(tmp_path / "config.json") and str(problem).count("Fix:") == 1
    assert not any("not planned" in warning for warning in result.warnings)


def test_validate_refuses_architectures_as_a_string(tmp_path: Path) -> None:
    result = validate_inventory(tp_with_config(tmp_path, architectures="Qwen2ForCausalLM"))
    (problem,) = [p for p in result.problems if p.variable == "architectures"]
    assert ": architectures: found 'Qwen2ForCausalLM'; expected a list of class names" in str(problem)


@pytest.mark.parametrize("value", ["Qwen2ForCausalLM", [1], {"a": 1}])
def test_the_planner_refuses_architectures_that_are_not_a_list_of_names(value: object) -> None:
    config = json.loads(QWEN.read_text(encoding="utf-8")) | {"architectures": value}
    with pytest.raises(PlannerInputError, match="architectures: found"):
        parse_arch(config)


def test_a_vision_model_is_unmodelled_not_wrong(tmp_path: Path) -> None:
    config = json.loads(QWEN.read_text(encoding="utf-8"))
    vision = {"model_type": "qwen2_5_vl", "text_config": config, "vision_config": {"depth": 32}}
    with pytest.raises(PlannerUnmodelledError):
        parse_arch(vision)
    result = validate_inventory(tp_with_config(tmp_path, vision))
    assert not [p for p in result.problems if p.where == str(tmp_path / "config.json")]
    assert any("not planned" in warning for warning in result.warnings)


def test_load_model_config_still_reads_the_shipped_config() -> None:
    assert load_model_config(QWEN)["architectures"] == ["Qwen2ForCausalLM"]
