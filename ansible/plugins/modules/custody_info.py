#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: The Custody developers
# The terms are in COPYING at the root of this collection.

from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r'''
module: custody_info
short_description: What custodyd on the host is doing
description:
  - Reads the daemon's status and jobs from its control socket; changes nothing.
  - Returns the version, the mounts, the accounts with their lock states, the machine key and the jobs.
version_added: "0.3.0"
author: The Custody developers (@custody)
extends_documentation_fragment:
  - custody.protection.connection
notes:
  - Run as root or as a member of the daemon's admin group to see every account.
  - Supports check mode.
'''

EXAMPLES = r'''
- name: Read Custody's state
  custody.protection.custody_info:
  register: custody

- name: Fail where an identity cannot be opened
  ansible.builtin.assert:
    that: custody.accounts | selectattr('lock', 'equalto', 'unavailable') | list | length == 0
'''

RETURN = r'''
version:
  description: The daemon's version.
  returned: success
  type: str
  sample: 0.3.0
mounts:
  description: The protected directories, each with C(mountPoint) and C(backing).
  returned: success
  type: list
  elements: dict
accounts:
  description: The accounts, with C(id), C(upn), C(enrolled), C(policy), C(lock) and unlock counters.
  returned: success
  type: list
  elements: dict
machine_key:
  description: Where the machine key is kept and which identities cannot be opened without it.
  returned: success
  type: dict
jobs:
  description: Running jobs and the last finished ones (wipes, re-protection).
  returned: success
  type: list
  elements: dict
'''

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.custody.protection.plugins.module_utils.custody import (
    CONNECTION_ARGS, CustodyClient, CustodyError)


def main():
    module = AnsibleModule(argument_spec=dict(CONNECTION_ARGS), supports_check_mode=True)
    client = CustodyClient.from_module(module)
    try:
        status = client.call("GET", "/v1/status")
        jobs = client.call("GET", "/v1/jobs")
    except CustodyError as error:
        module.fail_json(**error.as_result())
    module.exit_json(changed=False, version=status.get("version"), mounts=status.get("mounts", []),
                     accounts=status.get("accounts", []), machine_key=status.get("machineKey", {}),
                     jobs=jobs if isinstance(jobs, list) else jobs.get("jobs", []))


if __name__ == "__main__":
    main()
