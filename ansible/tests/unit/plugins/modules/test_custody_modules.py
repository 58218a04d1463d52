# -*- coding: utf-8 -*-
# Copyright: The Custody developers
# The terms are in COPYING at the root of this collection.

from __future__ import absolute_import, division, print_function
__metaclass__ = type

import json

from ansible_collections.custody.protection.plugins.modules import (
    custody_account, custody_identity, custody_info, custody_lock, custody_policy, custody_wipe)

ALICE = dict(identity="alice-id", upn="alice@contoso.com", passphrase="right")


def enroll(run, **extra):
    arguments = dict(ALICE)
    arguments.update(extra)
    return run(custody_account, arguments)


def test_info_reports_the_daemon_without_changing_it(run, daemon):
    enroll(run)
    result, failed = run(custody_info, {})
    assert not failed and result["changed"] is False
    assert result["version"] == "0.3.0"
    assert [account["upn"] for account in result["accounts"]] == ["alice@contoso.com"]
    assert result["accounts"][0]["lock"] == "unlocked"
    assert result["mounts"][0]["mountPoint"] == "/srv/work"
    assert result["jobs"] == []


def test_account_is_created_once_and_check_mode_creates_nothing(run, daemon):
    result, failed = run(custody_account, ALICE, check_mode=True, diff=True)
    assert not failed and result["changed"] is True
    assert result["diff"]["after"]["upn"] == "alice@contoso.com"
    assert daemon.accounts == {}
    result, failed = enroll(run, policy=dict(protectionLevel="untilFirstAuth"), uid=1000)
    assert not failed and result["changed"] is True
    posted = [body for method, path, body in daemon.requests if method == "POST"][0]
    assert posted == dict(id="alice-id", upn="alice@contoso.com", enroll=True, passphrase="right", uid=1000,
                          policy=dict(protectionLevel="untilFirstAuth"))
    result, failed = enroll(run)
    assert not failed and result["changed"] is False
    assert result["account"]["upn"] == "alice@contoso.com"


def test_absent_deregisters_with_or_without_a_wipe_and_then_changes_nothing(run, daemon):
    enroll(run)
    result, failed = run(custody_account, dict(identity="alice@contoso.com", state="absent", wipe=True))
    assert not failed and result["changed"] is True and result["code"] == 104
    assert [(method, path) for method, path, body in daemon.requests if method == "DELETE"] == [("DELETE", "/v1/accounts/alice%40contoso.com")]
    assert daemon.accounts == {}
    result, failed = run(custody_account, dict(identity="alice-id", state="absent"))
    assert not failed and result["changed"] is False


def test_failures_carry_the_daemons_code_and_message(run, daemon):
    result, failed = run(custody_account, dict(identity="eve-id", upn="eve@blocked.example"))
    assert failed
    assert (result["status"], result["code"], result["name"]) == (403, 209, "AccountNotAllowed")
    assert "AllowedAccounts" in result["msg"]


def test_an_unreachable_daemon_is_a_clear_failure(run, daemon):
    result, failed = run(custody_info, dict(socket=daemon.directory + "/nothing.sock"))
    assert failed and "cannot reach custodyd" in result["msg"]


def test_policy_changes_only_what_differs_and_accepts_every_spelling(run, daemon):
    enroll(run)
    result, failed = run(custody_policy, dict(identity="alice-id", policy=dict(protectionLevel="NSFileProtectionComplete")))
    assert not failed and result["changed"] is False and result["code"] == 101
    result, failed = run(custody_policy, dict(identity="alice-id", policy=dict(protectionLevel="C")), check_mode=True, diff=True)
    assert not failed and result["changed"] is True and result["code"] == 100
    assert result["diff"]["after"]["protectionLevel"] == "untilFirstAuth"
    assert daemon.accounts["alice-id"]["policy"]["protectionLevel"] == "complete", "check mode sends nothing"
    result, failed = run(custody_policy, dict(identity="alice-id", policy=dict(protectionLevel="class c", sendToOtherIdentities="none")))
    assert not failed and result["changed"] is True and result["code"] == 100
    assert daemon.accounts["alice-id"]["policy"] == dict(protectionLevel="untilFirstAuth", fileEncryptionRequired=True,
                                                         sendToOtherIdentities="none")
    result, failed = run(custody_policy, dict(identity="alice-id", policy=dict(protectionLevel="ultra")))
    assert failed and result["code"] == 301


def test_check_mode_refuses_what_applying_would_refuse(run, daemon):
    enroll(run)
    result, failed = run(custody_policy, dict(identity="alice-id", policy=dict(saveToLocation=["AccountDocument"])), check_mode=True)
    assert failed and result["code"] == 400 and result["msg"] == "unknown field saveToLocation (did you mean saveToLocations?)"
    result, failed = run(custody_policy, dict(identity="alice-id", policy=dict(protectionLevel="ultra")), check_mode=True)
    assert failed and result["code"] == 301 and "accepted: complete" in result["msg"]
    result, failed = run(custody_policy, dict(identity="alice-id", policy=dict(sendToOtherIdentities="some")), check_mode=True)
    assert failed and result["code"] == 301
    result, failed = run(custody_policy, dict(identity="alice-id", policy=dict(saveToLocations=["AccountDocument"])), check_mode=True)
    assert not failed and result["changed"] is True
    assert "saveToLocations" not in daemon.accounts["alice-id"]["policy"], "check mode sends nothing"


def test_lock_and_unlock_are_idempotent_and_a_wrong_passphrase_fails(run, daemon):
    enroll(run)
    result, failed = run(custody_lock, dict(identity="alice-id", state="locked"))
    assert not failed and result["changed"] is True and result["lock"] == "locking"
    result, failed = run(custody_lock, dict(identity="alice-id", state="locked"))
    assert not failed and result["changed"] is False, "a lock in its grace period counts as locked"
    result, failed = run(custody_lock, dict(identity="alice-id", state="unlocked", passphrase="wrong"))
    assert failed and (result["code"], result["name"]) == (303, "WrongPassphrase")
    result, failed = run(custody_lock, dict(identity="alice-id", state="unlocked", passphrase="right"))
    assert not failed and result["changed"] is True and result["lock"] == "unlocked"
    result, failed = run(custody_lock, dict(identity="alice-id", state="unlocked"), check_mode=True)
    assert not failed and result["changed"] is False


def test_wipe_waits_for_the_job_and_a_second_run_changes_nothing(run, daemon):
    enroll(run)
    result, failed = run(custody_wipe, dict(identity="alice@contoso.com"), check_mode=True)
    assert not failed and result["changed"] is True and "alice-id" in daemon.accounts
    result, failed = run(custody_wipe, dict(identity="alice@contoso.com", poll_interval=0.01))
    assert not failed and result["changed"] is True
    assert (result["code"], result["deleted"], result["bytes_freed"], result["keys_destroyed_seconds"]) == (104, 4, 4096, 0.002)
    assert daemon.accounts == {}
    result, failed = run(custody_wipe, dict(identity="alice@contoso.com"))
    assert not failed and result["changed"] is False


def test_a_failed_wipe_job_fails_with_its_code(run, daemon):
    enroll(run)
    daemon.wipe_fails = True
    result, failed = run(custody_wipe, dict(identity="alice-id", poll_interval=0.01))
    assert failed and result["code"] == 215 and "disk gone" in result["msg"]


def test_identity_goes_from_host_key_to_export_to_an_idempotent_import(run, daemon):
    result, failed = run(custody_identity, dict(state="host_key"))
    assert not failed and result["changed"] is False and result["host_key"] == daemon.host_key
    enroll(run)
    result, failed = run(custody_identity, dict(state="exported", identity="alice@contoso.com", to=result["host_key"]))
    assert not failed and result["changed"] is False
    export = result["export"]
    assert export["upn"] == "alice@contoso.com" and export["sealed"] == "sealed-alice-id"
    # Imported where it is not enrolled: checked first, then imported, then nothing to do.
    del daemon.accounts["alice-id"]
    result, failed = run(custody_identity, dict(export=export, passphrase="here"), check_mode=True, diff=True)
    assert not failed and result["changed"] is True and result["diff"]["after"]["enrolled"] is True
    assert "alice-id" not in daemon.accounts
    result, failed = run(custody_identity, dict(identity="alice-id", export=export, passphrase="here"), diff=True)
    assert not failed and result["changed"] is True and result["account"]["upn"] == "alice@contoso.com"
    assert [body for method, path, body in daemon.requests if path == "/v1/identities/import"][-1]["passphrase"] == "here"
    for check_mode in (False, True):
        result, failed = run(custody_identity, dict(export=export), check_mode=check_mode)
        assert not failed and result["changed"] is False
    # As JSON text too; an export of another account, or for another host, fails.
    result, failed = run(custody_identity, dict(export=json.dumps(export)))
    assert not failed and result["changed"] is False
    result, failed = run(custody_identity, dict(identity="bob-id", export=export))
    assert failed and "not bob-id" in result["msg"]
    other = dict(export, to="another host", accountID="carol-id", upn="carol@contoso.com")
    result, failed = run(custody_identity, dict(export=other))
    assert failed and (result["status"], result["code"]) == (422, 320)


def test_identity_import_adds_the_keys_of_a_rotation_once(run, daemon):
    enroll(run)
    host_key = run(custody_identity, dict(state="host_key"))[0]["host_key"]
    export = run(custody_identity, dict(state="exported", identity="alice-id", to=host_key))[0]["export"]
    del daemon.accounts["alice-id"]
    result, failed = run(custody_identity, dict(export=export))
    assert not failed and result["changed"] is True and result["account"]["keyGenerations"] == 1
    # Rotated on the host that exports: the same account, one generation more.
    rotated = dict(export, sealed=export["sealed"] + "+2")
    result, failed = run(custody_identity, dict(export=rotated), check_mode=True, diff=True)
    assert not failed and result["changed"] is True and daemon.accounts["alice-id"]["keyGenerations"] == 1
    result, failed = run(custody_identity, dict(export=rotated), diff=True)
    assert not failed and result["changed"] is True and result["account"]["keyGenerations"] == 2
    assert result["diff"]["before"]["keyGenerations"] == 1 and result["diff"]["after"]["keyGenerations"] == 2
    for check_mode in (False, True):
        result, failed = run(custody_identity, dict(export=rotated), check_mode=check_mode)
        assert not failed and result["changed"] is False
    # An export from before the rotation changes nothing either; another enrolment's keys fail.
    result, failed = run(custody_identity, dict(export=export))
    assert not failed and result["changed"] is False
    result, failed = run(custody_identity, dict(export=dict(export, sealed="sealed-elsewhere")))
    assert failed and (result["status"], result["code"]) == (409, 208)
