#!/usr/bin/python
# Copyright (c) 2026, Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: controller_files
short_description: Write text files and links in one directory on the controller, in one step
version_added: 0.1.0
description:
  - Writes each of O(files) into O(path) on the controller, where C(ansible-playbook) runs, whatever host the task
    is for, and points each of O(links) at a file there.
  - It is an action, so no module runs on any host and a run report rewritten after every phase costs no round trip
    (M(ansible.builtin.file), M(ansible.builtin.copy) and M(ansible.builtin.template) each run one or two modules).
  - Each file is written to a temporary file beside it and renamed over it, so a reader never sees half of it; a file
    that already has the content and mode is left alone. O(path) is created with O(directory_mode) when missing.
author:
  - Pivot developers (@pivot)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Says what it would write and writes nothing.
  diff_mode:
    support: none
  platform:
    platforms: posix
options:
  path:
    description:
      - The directory on the controller.
    type: path
    required: true
  files:
    description:
      - The files to write, by name within O(path).
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description:
          - The file's name, a single path component (no C(/), not C(.) or C(..)).
        type: str
        required: true
      content:
        description:
          - The file's text, written as UTF-8.
        type: str
        required: true
  links:
    description:
      - Symbolic links to make within O(path), each pointing at a file name in O(path) (a relative link).
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description:
          - The link's name, a single path component.
        type: str
        required: true
      target:
        description:
          - The name it points at, a single path component.
        type: str
        required: true
  mode:
    description:
      - Permissions of the files written, as an octal string.
    type: str
    default: "0644"
  directory_mode:
    description:
      - Permissions of O(path) when it has to be created, as an octal string.
    type: str
    default: "0755"
notes:
  - It runs on the controller as an action plugin; running the module itself on a host fails.
seealso:
  - module: ansible.builtin.copy
  - module: ansible.builtin.file
"""

EXAMPLES = r"""
- name: Write the run report and point the latest report at it
  pivot.ops.controller_files:
    path: "{{ playbook_dir }}/../artifacts"
    files:
      - name: pivot-20261207T093438Z-20690.json
        content: "{{ report | to_nice_json }}\n"
      - name: pivot-20261207T093438Z-20690.md
        content: "{{ lookup('ansible.builtin.template', 'report.md.j2') }}"
    links:
      - name: pivot-latest.json
        target: pivot-20261207T093438Z-20690.json
      - name: pivot-latest.md
        target: pivot-20261207T093438Z-20690.md
  run_once: true
"""

RETURN = r"""
written:
  description: The files written (or, in check mode, that would be), as paths.
  returned: always
  type: list
  elements: str
  sample: [/srv/pivot/artifacts/pivot-20261207T093438Z-20690.json]
linked:
  description: The links made or changed (or, in check mode, that would be), as paths.
  returned: always
  type: list
  elements: str
  sample: [/srv/pivot/artifacts/pivot-latest.json]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pivot.ops.plugins.module_utils.controller_files import ARGUMENT_SPEC


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="pivot.ops.controller_files is an action that writes on the controller: it ran as a module, "
                         "without its action plugin. Run it from the pivot.ops collection as installed, not copied.")


if __name__ == "__main__":
    main()
