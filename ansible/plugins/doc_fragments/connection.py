# -*- coding: utf-8 -*-
# Copyright: The Custody developers
# The terms are in COPYING at the root of this collection.

from __future__ import absolute_import, division, print_function
__metaclass__ = type


class ModuleDocFragment(object):
    # The options every module takes to reach custodyd (module_utils/custody.py's CONNECTION_ARGS).
    DOCUMENTATION = r'''
options:
  socket:
    description: The control socket.
    type: path
    default: /run/custody/control.sock
  timeout:
    description: Seconds to wait for each answer.
    type: float
    default: 60.0
'''
