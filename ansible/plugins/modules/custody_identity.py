#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: The Custody developers
# The terms are in COPYING at the root of this collection.

from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r'''
module: custody_identity
short_description: Carry a Custody identity to other hosts, sealed end to end
description:
  - Moves an identity's keys between hosts so that files it encrypted on any of them open on all.
    Three steps, one per I(state), each run where it belongs; the controller only ever sees the
    receiving hosts' public keys and the sealed exports, never a key in clear.
  - I(state=host_key) answers the host's key for receiving identities (changes nothing).
  - I(state=exported), on a host where the identity is enrolled and unlocked, seals its keys to
    the host key I(to) and answers the export (changes nothing on the host).
  - I(state=present), on the receiving host, enrolls the identity with the keys I(export) carries,
    under this host's own protectors. An identity enrolled there with exactly those keys is left
    as it is, so the task is idempotent. One enrolled there with earlier generations of them (its
    keys were rotated since, with C(custodyctl identity rotate)) gets the new generations, which
    the task reports as a change; its C(account.keyGenerations) says how many it has.
version_added: "0.3.0"
author: The Custody developers (@custody)
extends_documentation_fragment:
  - custody.protection.connection
options:
  state:
    description: C(host_key), C(exported) or C(present) (above).
    type: str
    choices: [host_key, exported, present]
    default: present
  identity:
    description: The account (object ID or UPN). Needed for C(exported); with C(present), checked against the export.
    type: str
  to:
    description: With I(state=exported), the receiving host's key (its C(host_key) result).
    type: str
  export:
    description: With I(state=present), the export (the C(export) result of I(state=exported)), as a dict or JSON text.
    type: raw
  passphrase:
    description: With I(state=present), the identity's passphrase on this host (keep it in a vault). Leave it out for none.
    type: str
  policy:
    description: With I(state=present), a policy instead of the one the export carries.
    type: dict
  user:
    description: With I(state=present), the local user the identity belongs to here, by name.
    type: str
notes:
  - Needs root or the daemon's admin group.
  - Supports check mode and diff mode.
'''

EXAMPLES = r'''
- name: Each target's key for receiving identities
  custody.protection.custody_identity:
    state: host_key
  register: receiving

- name: Alice's keys sealed to each target, on the host that has them
  custody.protection.custody_identity:
    state: exported
    identity: alice@contoso.com
    to: "{{ hostvars[item].receiving.host_key }}"
  delegate_to: workstation1
  loop: "{{ groups.targets }}"
  register: exports

- name: Alice enrolled on each target with those keys
  custody.protection.custody_identity:
    identity: alice@contoso.com
    export: "{{ (exports.results | selectattr('item', 'equalto', inventory_hostname) | first).export }}"
    user: alice
'''

RETURN = r'''
host_key:
  description: The host's key for receiving identities (base64), with I(state=host_key).
  returned: state is host_key
  type: str
fingerprint:
  description: That key's fingerprint (8 bytes of its SHA-256, hex).
  returned: state is host_key
  type: str
export:
  description: The sealed export, with I(state=exported). Only the host whose key it was sealed to can open it.
  returned: state is exported
  type: dict
account:
  description: The account after the task, with I(state=present) (not in check mode when it would be imported).
  returned: state is present
  type: dict
'''

import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.custody.protection.plugins.module_utils.custody import (
    CONNECTION_ARGS, CustodyClient, CustodyError, segment)


def export_document(value):
    """The export as a dict, from a dict or JSON text."""
    if isinstance(value, dict):
        return value
    try:
        document = json.loads(value)
    except (TypeError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def matches(identity, document):
    wanted = str(identity).lower()
    return wanted in (str(document.get("accountID", "")).lower(), str(document.get("upn", "")).lower())


def main():
    spec = dict(CONNECTION_ARGS)
    spec.update(state=dict(type="str", choices=["host_key", "exported", "present"], default="present"),
                identity=dict(type="str"), to=dict(type="str"), export=dict(type="raw"),
                passphrase=dict(type="str", no_log=True), policy=dict(type="dict"), user=dict(type="str"))
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True,
                           required_if=[("state", "exported", ("identity", "to")), ("state", "present", ("export",))])
    params = module.params
    client = CustodyClient.from_module(module)
    try:
        if params["state"] == "host_key":
            key = client.call("GET", "/v1/host-key")
            module.exit_json(changed=False, host_key=key["publicKey"], fingerprint=key["fingerprint"])
        if params["state"] == "exported":
            export = client.call("POST", "/v1/accounts/" + segment(params["identity"]) + "/export", dict(hostKey=params["to"]))
            module.exit_json(changed=False, export=export)

        document = export_document(params["export"])
        if document is None:
            module.fail_json(msg="export is not an identity export (a dict, or its JSON text)")
        if params["identity"] is not None and not matches(params["identity"], document):
            module.fail_json(msg="the export carries %s, not %s" % (document.get("upn"), params["identity"]))
        body = dict(export=document)
        for name in ("passphrase", "policy", "user"):
            if params[name] is not None:
                body[name] = params[name]
        before = dict(enrolled=False)
        existing = client.account(document.get("accountID", ""))
        if existing is not None:
            before = dict(enrolled=bool(existing.get("enrolled")), keyGenerations=existing.get("keyGenerations"))
        after = dict(enrolled=True, keysFrom=document.get("from"))
        path = "/v1/identities/import"
        if module.check_mode:
            status, answer = client.request("POST", path + "?check=true", body)
            if status == 200:
                module.exit_json(changed=False, account=answer)
            if status == 204:
                module.exit_json(changed=True, diff=dict(before=before, after=after))
            client.call("POST", path + "?check=true", body, ok=(200, 204))
        status, answer = client.request("POST", path, body)
        if status in (200, 201):
            # 200 is also an import that added the keys of a rotation made on another host.
            changed = status == 201 or answer.get("keyGenerations") != before.get("keyGenerations")
            after["keyGenerations"] = answer.get("keyGenerations")
            result = dict(changed=changed, account=answer)
            if changed:
                result["diff"] = dict(before=before, after=after)
            module.exit_json(**result)
        client.call("POST", path, body, ok=(200, 201))
    except CustodyError as error:
        module.fail_json(**error.as_result())


if __name__ == "__main__":
    main()
