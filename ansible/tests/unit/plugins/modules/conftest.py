# -*- coding: utf-8 -*-
# Copyright: The Custody developers
# The terms are in COPYING at the root of this collection.

from __future__ import absolute_import, division, print_function
__metaclass__ = type

import json

import pytest

from ansible.module_utils import basic
from ansible_collections.custody.protection.tests.unit.plugins.modules.fake_daemon import FakeDaemon

try:
    from ansible.module_utils.testing import patch_module_args
except ImportError:  # ansible-core before 2.19
    patch_module_args = None


class ModuleExit(Exception):
    def __init__(self, result, failed):
        super(ModuleExit, self).__init__(result)
        self.result = result
        self.failed = failed


@pytest.fixture
def daemon():
    fake = FakeDaemon()
    yield fake
    fake.close()


@pytest.fixture
def run(monkeypatch, daemon):
    """Runs a module's main() with arguments (the fake daemon's socket added); returns
    (result, failed)."""
    def exit_json(self, **result):
        raise ModuleExit(result, False)

    def fail_json(self, **result):
        raise ModuleExit(result, True)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)

    def runner(module, arguments, check_mode=False, diff=False):
        arguments = dict(arguments)
        arguments.setdefault("socket", daemon.path)
        if check_mode:
            arguments["_ansible_check_mode"] = True
        if diff:
            arguments["_ansible_diff"] = True
        try:
            if patch_module_args is not None:
                with patch_module_args(arguments):
                    module.main()
            else:
                monkeypatch.setattr(basic, "_ANSIBLE_ARGS", json.dumps(dict(ANSIBLE_MODULE_ARGS=arguments)).encode("utf-8"))
                module.main()
        except ModuleExit as done:
            return done.result, done.failed
        raise AssertionError("the module returned without exit_json or fail_json")
    return runner
