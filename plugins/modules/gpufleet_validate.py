#!/usr/bin/python
"""Documentation of the ``gpufleet_validate`` action plugin (plugins/action): it runs on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpufleet_validate
author: gpufleet maintainers (@gpufleet)
short_description: Validate a gpufleet inventory and plan the model's memory, before any host changes
description:
  - Runs on the control node the checks of C(gpufleet validate), with the same Python code
    (C(gpufleet.fleet)) - groups, addresses, unknown variables, versions that work together, parallelism,
    the memory plan.
  - Fails the play with one line per problem (where, what was found, what was expected, the fix); warnings
    become Ansible warnings.
  - Needs the gpufleet Python package on the control node.
options:
  inventory:
    description: Inventory sources to validate; default, the play's own (C(ansible_inventory_sources)).
    type: list
    elements: path
notes:
  - An action plugin; this file only documents it.
"""

EXAMPLES = r"""
- name: Validate the inventory and plan the model's memory with gpufleet
  gpufleet.gpufleet.gpufleet_validate:
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
warnings:
  description: The planner's and the validator's warnings.
  returned: always
  type: list
  elements: str
"""
