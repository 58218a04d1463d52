#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: The Custody developers
# The terms are in COPYING at the root of this collection.

from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r'''
module: custody_policy
short_description: Set an enrolled Custody identity's policy
description:
  - Sets the fields given, by the SDK's names, and leaves the others as they are.
  - A change re-protects the identity's existing files in the background (the daemon's job); the
    module reports the SDK code C(100) NewPoliciesReceived, or C(101) PoliciesHaveNotChanged.
version_added: "0.3.0"
author: The Custody developers (@custody)
extends_documentation_fragment:
  - custody.protection.connection
options:
  identity:
    description: The account (object ID or UPN).
    type: str
    required: true
  policy:
    description:
      - The fields to set, by the SDK's names, for example C(protectionLevel), C(fileEncryptionRequired),
        C(sendToOtherIdentities), C(receiveFromOtherIdentities), C(saveToLocations), C(openFromLocations),
        C(lockOnSessionLock), C(lockOnSuspend), C(lockOnLogout).
      - C(protectionLevel) takes any of the daemon's spellings (C(NSFileProtectionComplete), C(complete), C(A), ...).
    type: dict
    required: true
notes:
  - Needs root or the daemon's admin group.
  - Supports check mode and diff mode.
'''

EXAMPLES = r'''
- name: Files of this identity become unreadable at lock
  custody.protection.custody_policy:
    identity: alice@contoso.com
    policy:
      protectionLevel: NSFileProtectionComplete
      sendToOtherIdentities: none
'''

RETURN = r'''
policy:
  description: The identity's policy after the task.
  returned: success
  type: dict
code:
  description: C(100) NewPoliciesReceived when the policy changed, C(101) PoliciesHaveNotChanged when not.
  returned: success
  type: int
'''

import difflib

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.custody.protection.plugins.module_utils.custody import (
    CONNECTION_ARGS, CustodyClient, CustodyError, segment)

# The daemon's spellings of the protection levels, to the names it reports (ProtectionClass).
LEVELS = {
    "complete": ("nsfileprotectioncomplete", "complete", "a", "classa", "whendevicelocked", "whendeviceislocked"),
    "completeUnlessOpen": ("nsfileprotectioncompleteunlessopen", "completeunlessopen", "b", "classb",
                           "lockedexceptopenfiles", "whendevicelockedexceptopenfiles"),
    "untilFirstAuth": ("nsfileprotectioncompleteuntilfirstuserauthentication", "completeuntilfirstuserauthentication",
                       "untilfirstauth", "untilfirstauthentication", "c", "classc", "afterrestart", "afterdevicerestart"),
    "none": ("nsfileprotectionnone", "none", "d", "classd", "usedevicesettings", "off"),
}


# The policy document's fields (docs/openapi.yaml, Policy), for check mode, which sends nothing for
# the daemon to refuse: a misspelt field must fail there as it fails when applied.
POLICY_FIELDS = (
    "fileEncryptionRequired", "protectionLevel", "fileProviderEncryptionRequired", "sendToOtherIdentities",
    "receiveFromOtherIdentities", "canShareWithOtherIdentities", "canReceiveFromUnmanaged", "saveToLocations",
    "openFromLocations", "transferExemptExecutables", "transferExemptUids",
)
SCOPES = ("all", "managed", "none")


def problems(policy):
    """What the daemon would refuse in `policy` (400 BadRequest for a field, 301 InvalidPolicy for a value)."""
    for key in policy:
        if key not in POLICY_FIELDS:
            close = difflib.get_close_matches(key, POLICY_FIELDS, n=1)
            hint = " (did you mean %s?)" % close[0] if close else ""
            return dict(msg="unknown field %s%s" % (key, hint), status=400, code=400, name="BadRequest")
    value = policy.get("protectionLevel")
    if value is not None and level(value) not in LEVELS:
        return dict(msg="unknown protection level %s (accepted: %s)" % (value, ", ".join(LEVELS)), status=400, code=301, name="InvalidPolicy")
    for key in ("sendToOtherIdentities", "receiveFromOtherIdentities"):
        if policy.get(key) is not None and policy[key] not in SCOPES:
            return dict(msg="%s must be all, managed or none, not %s" % (key, policy[key]), status=400, code=301, name="InvalidPolicy")
    return None


def level(value):
    """The reported name of a protection level as given, or the value itself when unknown (the daemon refuses it)."""
    key = "".join(c for c in str(value).lower() if not c.isspace() and c not in "_-")
    for name, spellings in LEVELS.items():
        if key in spellings:
            return name
    return value


def normalized(policy):
    result = dict(policy or {})
    if "protectionLevel" in result:
        result["protectionLevel"] = level(result["protectionLevel"])
    return result


def main():
    spec = dict(CONNECTION_ARGS)
    spec.update(identity=dict(type="str", required=True), policy=dict(type="dict", required=True))
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    identity = module.params["identity"]
    client = CustodyClient.from_module(module)
    try:
        account = client.account(identity)
        if account is None:
            module.fail_json(msg="no account %s" % identity, status=404, code=300, name="UnknownAccount")
        if not account.get("enrolled"):
            module.fail_json(msg="%s is registered but not enrolled" % identity, status=409, code=214, name="NotEnrolledAccount")
        before = normalized(account.get("policy"))
        wanted = dict(before)
        wanted.update(normalized(module.params["policy"]))
        if wanted == before:
            module.exit_json(changed=False, code=101, policy=before)
        if module.check_mode:
            refused = problems(module.params["policy"])
            if refused:
                module.fail_json(**refused)
            module.exit_json(changed=True, code=100, policy=wanted, diff=dict(before=before, after=wanted))
        updated = client.call("PUT", "/v1/accounts/" + segment(identity) + "/policy", wanted)
        after = normalized(updated.get("policy") if isinstance(updated, dict) else None)
        changed = after != before
        module.exit_json(changed=changed, code=100 if changed else 101, policy=after, diff=dict(before=before, after=after))
    except CustodyError as error:
        module.fail_json(**error.as_result())


if __name__ == "__main__":
    main()
