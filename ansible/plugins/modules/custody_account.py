#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: The Custody developers
# The terms are in COPYING at the root of this collection.

from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r'''
module: custody_account
short_description: Enroll or deregister a Custody identity
description:
  - Enrolls an identity (a managed account with keys and a policy), registers it without keys, or
    deregisters it, through the host's control socket.
  - An account that exists is left as it is; use M(custody.protection.custody_policy) to change its policy.
version_added: "0.3.0"
author: The Custody developers (@custody)
extends_documentation_fragment:
  - custody.protection.connection
options:
  identity:
    description: The account's object ID (its stable name).
    type: str
    required: true
  upn:
    description: The account's UPN. Needed to create it.
    type: str
  state:
    description: C(present) creates the account when missing; C(absent) deregisters it.
    type: str
    choices: [present, absent]
    default: present
  enroll:
    description: Enroll (keys and a policy) rather than only register.
    type: bool
    default: true
  policy:
    description: The policy to enroll with, by the SDK's field names (C(protectionLevel), C(fileEncryptionRequired), ...).
    type: dict
  passphrase:
    description: The identity's passphrase at enrollment (keep it in a vault). Leave it out for none.
    type: str
  uid:
    description: The local user the identity belongs to, by uid.
    type: int
  user:
    description: The local user the identity belongs to, by name.
    type: str
  wipe:
    description: With I(state=absent), also destroy its keys and delete its files (a selective wipe).
    type: bool
    default: false
notes:
  - Needs root or the daemon's admin group.
  - Supports check mode and diff mode.
  - The passphrase is only used when the account is created; changing it is not this module's job.
'''

EXAMPLES = r'''
- name: Enroll Alice's work identity
  custody.protection.custody_account:
    identity: 7f1c2a9e-alice
    upn: alice@contoso.com
    user: alice
    passphrase: "{{ vault_custody_alice_passphrase }}"
    policy:
      protectionLevel: completeUntilFirstUserAuthentication

- name: Deregister Bob, keeping his files encrypted
  custody.protection.custody_account:
    identity: 0b3e-bob
    state: absent
'''

RETURN = r'''
account:
  description: The account as the daemon describes it (absent after deregistering).
  returned: when the account exists after the task
  type: dict
code:
  description: The SDK status code (C(104) UnenrollmentSuccess after deregistering).
  returned: when the account was deregistered
  type: int
'''

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.custody.protection.plugins.module_utils.custody import (
    CONNECTION_ARGS, CustodyClient, CustodyError, segment)


def view(account):
    """What diff mode shows of an account (no counters that change on their own)."""
    if account is None:
        return {}
    return dict((key, account.get(key)) for key in ("id", "upn", "enrolled", "uid", "policy", "hasPassphrase"))


def main():
    spec = dict(CONNECTION_ARGS)
    spec.update(
        identity=dict(type="str", required=True),
        upn=dict(type="str"),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        enroll=dict(type="bool", default=True),
        policy=dict(type="dict"),
        passphrase=dict(type="str", no_log=True),
        uid=dict(type="int"),
        user=dict(type="str"),
        wipe=dict(type="bool", default=False),
    )
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True,
                           required_if=[("state", "present", ("upn",))],
                           mutually_exclusive=[("uid", "user")])
    params = module.params
    client = CustodyClient.from_module(module)
    try:
        current = client.account(params["identity"])
        if params["state"] == "absent":
            if current is None:
                module.exit_json(changed=False)
            if not module.check_mode:
                query = "?wipe=true" if params["wipe"] else ""
                client.call("DELETE", "/v1/accounts/" + segment(params["identity"]) + query, ok=(200, 204))
            module.exit_json(changed=True, code=104, diff=dict(before=view(current), after={}))
        if current is not None:
            if params["enroll"] and not current.get("enrolled"):
                module.fail_json(msg="%s is registered but not enrolled; deregister it first to enroll it" % params["identity"],
                                 account=current)
            module.exit_json(changed=False, account=current)
        body = dict(id=params["identity"], upn=params["upn"], enroll=params["enroll"])
        for key in ("policy", "passphrase", "uid", "user"):
            if params[key] is not None:
                body[key] = params[key]
        wanted = dict(id=params["identity"], upn=params["upn"], enrolled=params["enroll"], uid=params["uid"],
                      policy=params["policy"], hasPassphrase=params["passphrase"] is not None)
        if module.check_mode:
            module.exit_json(changed=True, diff=dict(before={}, after=wanted))
        created = client.call("POST", "/v1/accounts", body, ok=(201,))
        module.exit_json(changed=True, account=created, diff=dict(before={}, after=view(created)))
    except CustodyError as error:
        module.fail_json(**error.as_result())


if __name__ == "__main__":
    main()
