# -*- coding: utf-8 -*-
# Copyright: The Custody developers
# The terms are in COPYING at the root of this collection.

"""A client for custodyd's control socket: HTTP/1.1 and JSON over AF_UNIX, with the standard
library only, so managed hosts need no Python package beyond the interpreter."""

from __future__ import absolute_import, division, print_function
__metaclass__ = type

import json
import socket

try:
    from http.client import HTTPConnection
    from urllib.parse import quote
except ImportError:  # Python 2 is not supported by custodyd hosts; keeps sanity's import test quiet
    HTTPConnection = object
    quote = None

DEFAULT_SOCKET = "/run/custody/control.sock"

# Options every module takes.
CONNECTION_ARGS = dict(
    socket=dict(type="path", default=DEFAULT_SOCKET),
    timeout=dict(type="float", default=60.0),
)


class CustodyError(Exception):
    """A refusal from the daemon (its HTTP status, stable code, name and message), or no daemon."""

    def __init__(self, message, status=None, code=None, name=None):
        super(CustodyError, self).__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.name = name

    def as_result(self):
        """Keyword arguments for fail_json."""
        return dict(msg=self.message, status=self.status, code=self.code, name=self.name)


class UnixHTTPConnection(HTTPConnection):
    def __init__(self, path, timeout):
        HTTPConnection.__init__(self, "localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except Exception:
            sock.close()
            raise
        self.sock = sock


def segment(value):
    """A path segment (an identity) with everything but unreserved characters escaped."""
    return quote(str(value), safe="")


class CustodyClient:
    """One request per connection, as the daemon serves them."""

    def __init__(self, socket_path=DEFAULT_SOCKET, timeout=60.0):
        self.socket_path = socket_path
        self.timeout = timeout

    @classmethod
    def from_module(cls, module):
        return cls(module.params["socket"], module.params["timeout"])

    def request(self, method, path, body=None):
        """(status, decoded JSON or None). Raises CustodyError when the daemon cannot be reached."""
        connection = UnixHTTPConnection(self.socket_path, self.timeout)
        try:
            headers = {"Host": "custody"}
            payload = None
            if body is not None:
                payload = json.dumps(body).encode("utf-8")
                headers["Content-Type"] = "application/json"
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            data = response.read()
            status = response.status
        except (OSError, IOError, socket.timeout) as error:
            raise CustodyError("cannot reach custodyd at %s: %s" % (self.socket_path, error))
        finally:
            connection.close()
        decoded = None
        if data:
            try:
                decoded = json.loads(data.decode("utf-8"))
            except ValueError:
                decoded = None
        return status, decoded

    def call(self, method, path, body=None, ok=(200,)):
        """The decoded answer of a request that must succeed with one of `ok`; else CustodyError
        carrying the daemon's code and message."""
        status, decoded = self.request(method, path, body)
        if status in ok:
            return decoded
        if isinstance(decoded, dict) and "message" in decoded:
            raise CustodyError(decoded.get("message"), status, decoded.get("code"), decoded.get("name"))
        raise CustodyError("%s %s answered HTTP %s" % (method, path, status), status)

    def account(self, identity):
        """The account (object ID or UPN), or None when there is none."""
        try:
            return self.call("GET", "/v1/accounts/" + segment(identity))
        except CustodyError as error:
            if error.code == 300:
                return None
            raise

    def lock_state(self, identity):
        """unlocked, locking, locked, unavailable; None for an account that is not enrolled."""
        status = self.call("GET", "/v1/status")
        wanted = str(identity).lower()
        for account in status.get("accounts", []):
            if account.get("id", "").lower() == wanted or account.get("upn", "").lower() == wanted:
                return account.get("lock")
        raise CustodyError("no account %s" % identity, 404, 300, "UnknownAccount")
