#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: The Custody developers
# The terms are in COPYING at the root of this collection.

from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r'''
module: custody_lock
short_description: Lock or unlock a Custody identity
description:
  - Locks an identity (its class A and B keys go after the grace period, so its files of those
    classes become unreadable) or unlocks it with its passphrase.
version_added: "0.3.0"
author: The Custody developers (@custody)
extends_documentation_fragment:
  - custody.protection.connection
options:
  identity:
    description: The account (object ID or UPN).
    type: str
    required: true
  state:
    description: C(locked) (a lock in its grace period counts as locked) or C(unlocked).
    type: str
    choices: [locked, unlocked]
    required: true
  passphrase:
    description: The passphrase, to unlock an identity that has one (keep it in a vault).
    type: str
notes:
  - Needs root, the daemon's admin group, or the identity's own local user.
  - Supports check mode and diff mode.
'''

EXAMPLES = r'''
- name: Lock Alice's identity on every host
  custody.protection.custody_lock:
    identity: alice@contoso.com
    state: locked
'''

RETURN = r'''
lock:
  description: The lock state after the task (C(unlocked), C(locking), C(locked), C(unavailable)).
  returned: success
  type: str
'''

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.custody.protection.plugins.module_utils.custody import (
    CONNECTION_ARGS, CustodyClient, CustodyError, segment)


def main():
    spec = dict(CONNECTION_ARGS)
    spec.update(identity=dict(type="str", required=True), state=dict(type="str", choices=["locked", "unlocked"], required=True),
                passphrase=dict(type="str", no_log=True))
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    identity, state = module.params["identity"], module.params["state"]
    client = CustodyClient.from_module(module)
    try:
        current = client.lock_state(identity)
        if current is None:
            module.fail_json(msg="%s is registered but not enrolled: it has no keys to lock" % identity, status=409, code=214,
                             name="NotEnrolledAccount")
        if current == "unavailable":
            module.fail_json(msg="%s cannot be opened without its machine key (custodyctl machine-key, then recover)" % identity,
                             status=409, code=316, name="MachineKeyUnavailable", lock=current)
        done = current in ("locked", "locking") if state == "locked" else current == "unlocked"
        if done:
            module.exit_json(changed=False, lock=current)
        if module.check_mode:
            module.exit_json(changed=True, lock=state, diff=dict(before=dict(lock=current), after=dict(lock=state)))
        path = "/v1/accounts/" + segment(identity) + ("/lock" if state == "locked" else "/unlock")
        body = None
        if state == "unlocked" and module.params["passphrase"] is not None:
            body = dict(passphrase=module.params["passphrase"])
        answer = client.call("POST", path, body)
        after = answer.get("lock") if isinstance(answer, dict) else state
        module.exit_json(changed=True, lock=after, diff=dict(before=dict(lock=current), after=dict(lock=after)))
    except CustodyError as error:
        module.fail_json(**error.as_result())


if __name__ == "__main__":
    main()
