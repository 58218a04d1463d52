# -*- coding: utf-8 -*-
# Copyright: The Custody developers
# The terms are in COPYING at the root of this collection.

"""A stand-in for custodyd's control socket in the modules' unit tests: real HTTP/1.1 over a
real Unix socket, answering the routes the modules use from an in-memory state, with the
daemon's status codes and error bodies (docs/api.md). The playbook test runs real daemons."""

from __future__ import absolute_import, division, print_function
__metaclass__ = type

import json
import os
import socketserver
import tempfile
import threading
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote, urlsplit, parse_qs


class FakeDaemon:
    def __init__(self):
        self.directory = tempfile.mkdtemp(prefix="custody-fake-")
        self.path = os.path.join(self.directory, "control.sock")
        self.accounts = {}
        self.locks = {}
        self.passphrases = {}
        self.keys = {}
        self.host_key = "q1gEvJcT8RVRAbOYyUGIgYWfH+ZlRGDoprFBY7WdDGg="
        self.jobs = []
        self.requests = []
        self.wipe_fails = False
        daemon = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def answer(self, status, body=None):
                data = b"" if body is None else json.dumps(body).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length).decode("utf-8")) if length else None
                url = urlsplit(self.path)
                daemon.requests.append((self.command, url.path, body))
                status, answer = daemon.route(self.command, url.path, parse_qs(url.query), body)
                self.answer(status, answer)

            do_GET = do_POST = do_PUT = do_DELETE = serve

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(self.path, Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        os.unlink(self.path)
        os.rmdir(self.directory)

    @staticmethod
    def error(status, code, name, message):
        return status, dict(code=code, name=name, message=message)

    def find(self, identity):
        for key, account in self.accounts.items():
            if identity.lower() in (key.lower(), account["upn"].lower()):
                return key
        return None

    def route(self, method, path, query, body):
        parts = [unquote(part) for part in path.split("/")[1:]]
        if (method, parts) == ("GET", ["v1", "status"]):
            accounts = []
            for key, account in self.accounts.items():
                view = dict(account)
                if account["enrolled"]:
                    view["lock"] = self.locks[key]
                accounts.append(view)
            return 200, dict(version="0.3.0", mounts=[dict(mountPoint="/srv/work", backing="/srv/.work")], accounts=accounts,
                             machineKey=dict(store="file", stranded=[]))
        if (method, parts) == ("GET", ["v1", "jobs"]):
            return 200, self.jobs
        if method == "GET" and parts[:2] == ["v1", "jobs"] and len(parts) == 3:
            number = int(parts[2])
            if number >= len(self.jobs):
                return self.error(404, 404, "UnknownJob", "no job %s" % number)
            job = self.jobs[number]
            job["polls"] = job.get("polls", 0) + 1
            if job["polls"] >= 2 and job["state"] == "running":
                self.finish(job)
            return 200, dict((k, v) for k, v in job.items() if k not in ("polls", "identity"))
        if (method, parts) == ("GET", ["v1", "host-key"]):
            return 200, dict(publicKey=self.host_key, fingerprint="0011223344556677")
        if (method, parts) == ("POST", ["v1", "identities", "import"]):
            # An export "opens" here when it was sealed to this host's key; its keys are named by
            # the sealed text itself, a generation per "+"-separated part.
            export = body["export"]
            if export.get("to") != self.host_key:
                return self.error(422, 320, "IdentityExportInvalid", "sealed to another host")
            key = self.find(export["accountID"])
            if key is not None:
                ours, theirs = set(self.keys.get(key, "").split("+")), set(export["sealed"].split("+"))
                if theirs <= ours:
                    return 200, self.accounts[key]
                if not ours <= theirs:
                    return self.error(409, 208, "AlreadyEnrolled", "%s is already enrolled" % export["upn"])
                if query.get("check") == ["true"]:
                    return 204, None
                self.keys[key] = export["sealed"]
                self.accounts[key]["keyGenerations"] = len(theirs)
                return 200, self.accounts[key]
            if query.get("check") == ["true"]:
                return 204, None
            account = dict(id=export["accountID"], upn=export["upn"], enrolled=True, uid=None,
                           policy=dict(protectionLevel="untilFirstAuth"), hasPassphrase="passphrase" in body,
                           keyGenerations=len(export["sealed"].split("+")))
            self.accounts[export["accountID"]] = account
            self.locks[export["accountID"]] = "unlocked"
            self.keys[export["accountID"]] = export["sealed"]
            return 201, account
        if (method, parts) == ("POST", ["v1", "accounts"]):
            if self.find(body["id"]) is not None:
                return self.error(409, 208, "AlreadyEnrolled", "%s is already enrolled" % body["id"])
            if body["upn"].endswith("@blocked.example"):
                return self.error(403, 209, "AccountNotAllowed", "%s is not in AllowedAccounts" % body["upn"])
            enrolled = body.get("enroll", True)
            policy = dict(protectionLevel="complete", fileEncryptionRequired=True)
            policy.update(body.get("policy") or {})
            account = dict(id=body["id"], upn=body["upn"], enrolled=enrolled, uid=body.get("uid"),
                           policy=policy if enrolled else None, hasPassphrase="passphrase" in body)
            self.accounts[body["id"]] = account
            self.locks[body["id"]] = "unlocked"
            self.passphrases[body["id"]] = body.get("passphrase")
            return 201, account
        if parts[:2] == ["v1", "accounts"] and len(parts) >= 3:
            key = self.find(parts[2])
            if key is None:
                return self.error(404, 300, "UnknownAccount", "no account %s" % parts[2])
            rest = parts[3:]
            if method == "GET" and rest == []:
                return 200, self.accounts[key]
            if method == "DELETE" and rest == []:
                del self.accounts[key]
                return 204, None
            if method == "PUT" and rest == ["policy"]:
                if body.get("protectionLevel") not in ("complete", "completeUnlessOpen", "untilFirstAuth", "none"):
                    return self.error(400, 301, "InvalidPolicy", "unknown protection level")
                self.accounts[key]["policy"] = body
                return 200, self.accounts[key]
            if method == "POST" and rest == ["export"]:
                if self.locks[key] != "unlocked":
                    return self.error(423, 305, "Locked", "%s is locked" % self.accounts[key]["upn"])
                return 200, dict(format="custody-identity-export/1", accountID=key, upn=self.accounts[key]["upn"], to=body["hostKey"],
                                 toFingerprint="8899aabbccddeeff", **{"from": "0011223344556677"}, created=0,
                                 sealed=self.keys.get(key, "sealed-" + key))
            if method == "POST" and rest == ["lock"]:
                self.locks[key] = "locking"
                return 200, dict(identity=parts[2], lock="locking")
            if method == "POST" and rest == ["unlock"]:
                if self.passphrases[key] is not None and (body or {}).get("passphrase") != self.passphrases[key]:
                    return self.error(403, 303, "WrongPassphrase", "wrong passphrase for %s" % self.accounts[key]["upn"])
                self.locks[key] = "unlocked"
                return 200, dict(identity=parts[2], lock="unlocked")
            if method == "POST" and rest == ["wipe"] and query.get("wait") == ["false"]:
                job = dict(id=len(self.jobs), kind="wipe", target=self.accounts[key]["upn"], state="running", progress={}, identity=key)
                self.jobs.append(job)
                return 202, dict((k, v) for k, v in job.items() if k != "identity")
        return self.error(404, 404, "UnknownRoute", "no route %s %s" % (method, path))

    def finish(self, job):
        if self.wipe_fails:
            job["state"] = "failed"
            job["error"] = dict(code=215, name="WipeFailed", message="wipe of %s failed: disk gone" % job["target"])
            return
        self.accounts.pop(job["identity"], None)
        job["state"] = "succeeded"
        job["progress"] = dict(scanned=10, deleted=4, bytesFreed=4096)
        job["result"] = dict(identity=job["target"], code=104, result="UnenrollmentSuccess", keysDestroyedSeconds=0.002,
                             scanned=10, deleted=4, bytesFreed=4096)
