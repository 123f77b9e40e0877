#!/usr/bin/python
"""Documentation of the ``gpufleet_bundle_verify`` action plugin (plugins/action): runs on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpufleet_bundle_verify
author: gpufleet maintainers (@gpufleet)
short_description: Check an offline bundle against its bundle.lock.yml on the control node
description:
  - Runs on the control node the check of C(gpufleet bundle verify) (every file of the lock by size and
    sha256, files the lock does not name) with the same Python code (C(gpufleet.bundle)).
  - A file whose device, inode, size, mtime and ctime are unchanged since it last matched its sha256 is not
    read again (a cache in the control node's C($XDG_CACHE_HOME/gpufleet/verified), never in the bundle).
  - Fails with one line per problem before any host is changed.
  - With O(signers), the lock's SSH signature is checked first (C(ssh-keygen -Y verify)).
options:
  bundle:
    description: The bundle directory (C(gpufleet_bundle_dir)).
    type: path
    required: true
  cache:
    description: Skip re-hashing files unchanged since they last matched; false hashes every byte.
    type: bool
    default: true
  signers:
    description:
      - An ssh-keygen allowed-signers file (C(gpufleet_bundle_signers); relative to the inventory directory).
      - Set, the bundle's C(bundle.lock.yml.sig) must be a good C(ssh-keygen -Y sign -n gpufleet-bundle)
        signature of its lock by a key the file lists, before any file is checked; an unsigned lock, a lock
        changed after signing and a key the file does not list are refused.
      - Empty, a signature is not required (nor checked).
    type: path
    default: ""
notes:
  - An action plugin; this file only documents it. Needs the gpufleet Python package on the control node.
"""

EXAMPLES = r"""
- name: Check the bundle on the control node before anything changes
  gpufleet.gpufleet.gpufleet_bundle_verify:
    bundle: "{{ gpufleet_bundle_dir }}"
    signers: "{{ gpufleet_bundle_signers | default('') }}"
  run_once: true
"""

RETURN = r"""
problems:
  description: One line per missing, corrupt or extra file.
  returned: always
  type: list
  elements: str
hashed:
  description: Files read in full this time.
  returned: success
  type: int
trusted:
  description: Files not read again because they are unchanged since they last matched.
  returned: success
  type: int
seconds:
  description: Time the check took.
  returned: success
  type: float
"""
