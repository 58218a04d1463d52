#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: The Custody developers
# The terms are in COPYING at the root of this collection.

from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r'''
module: custody_wipe
short_description: Selectively wipe one Custody identity
description:
  - Destroys the identity's keys (from then on every copy of its encrypted files is unreadable),
    deletes its files in every mount, and deregisters it, as the daemon's wipe job.
  - Waits for the job and returns its counters and the SDK status code (C(104)). An identity that
    is not there (never enrolled, or already wiped) is left alone, so a second run changes nothing.
  - Works with C(async) and C(poll) for long wipes; the job goes on in the daemon whatever happens
    to the connection.
version_added: "0.3.0"
author: The Custody developers (@custody)
extends_documentation_fragment:
  - custody.protection.connection
options:
  identity:
    description: The account (object ID or UPN).
    type: str
    required: true
  wait:
    description: Wait for the whole job (files deleted); with C(false), return once it has started.
    type: bool
    default: true
  wait_timeout:
    description: Seconds to wait for the job before failing (the job goes on).
    type: float
    default: 3600
  poll_interval:
    description: Seconds between looks at the job.
    type: float
    default: 1
notes:
  - Needs root or the daemon's admin group.
  - Supports check mode and diff mode.
'''

EXAMPLES = r'''
- name: Wipe a departed user's identity on every host, 50 hosts at a time
  custody.protection.custody_wipe:
    identity: bob@contoso.com
  async: 7200
  poll: 10
  throttle: 50
'''

RETURN = r'''
code:
  description: The SDK status code, C(104) UnenrollmentSuccess.
  returned: when a wipe ran
  type: int
job:
  description: The job's number in the daemon (C(GET /v1/jobs/N)).
  returned: when a wipe ran
  type: int
keys_destroyed_seconds:
  description: Seconds from the wipe's start until the keys were gone.
  returned: when the job finished
  type: float
scanned:
  description: Files looked at.
  returned: when the job finished
  type: int
deleted:
  description: Files deleted.
  returned: when the job finished
  type: int
bytes_freed:
  description: Bytes freed.
  returned: when the job finished
  type: int
'''

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.custody.protection.plugins.module_utils.custody import (
    CONNECTION_ARGS, CustodyClient, CustodyError, segment)


def main():
    spec = dict(CONNECTION_ARGS)
    spec.update(identity=dict(type="str", required=True), wait=dict(type="bool", default=True),
                wait_timeout=dict(type="float", default=3600), poll_interval=dict(type="float", default=1))
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    identity = module.params["identity"]
    client = CustodyClient.from_module(module)
    try:
        account = client.account(identity)
        if account is None:
            module.exit_json(changed=False, msg="no account %s: nothing to wipe" % identity)
        diff = dict(before=dict(identity=account.get("upn"), enrolled=account.get("enrolled")), after={})
        if module.check_mode:
            module.exit_json(changed=True, diff=diff)
        job = client.call("POST", "/v1/accounts/" + segment(identity) + "/wipe?wait=false", ok=(200, 202))
        number = job.get("id")
        if not module.params["wait"]:
            module.exit_json(changed=True, job=number, diff=diff)
        deadline = time.time() + module.params["wait_timeout"]
        while job.get("state") == "running":
            if time.time() > deadline:
                module.fail_json(msg="the wipe of %s did not finish within %s s (job %s goes on)" % (identity, module.params["wait_timeout"], number),
                                 changed=True, job=number, progress=job.get("progress"))
            time.sleep(module.params["poll_interval"])
            job = client.call("GET", "/v1/jobs/%d" % number)
        if job.get("state") != "succeeded":
            error = job.get("error") or {}
            module.fail_json(msg=error.get("message", "the wipe of %s failed" % identity), changed=True, job=number,
                             code=error.get("code"), name=error.get("name"), progress=job.get("progress"))
        result = job.get("result") or {}
        module.exit_json(changed=True, job=number, code=result.get("code", 104), result=result.get("result"),
                         keys_destroyed_seconds=result.get("keysDestroyedSeconds"), scanned=result.get("scanned"),
                         deleted=result.get("deleted"), bytes_freed=result.get("bytesFreed"), diff=diff)
    except CustodyError as error:
        module.fail_json(**error.as_result())


if __name__ == "__main__":
    main()
