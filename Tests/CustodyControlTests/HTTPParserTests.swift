import CLinux
@testable import CustodyControl
import Foundation
import Glibc
import XCTest

final class HTTPParserTests: XCTestCase {
    func parse(_ text: String) throws(HTTPReadError) -> HTTPRequest { try HTTPParser.parse(Array(text.utf8)) }

    func testAWellFormedRequest() throws {
        let request = try parse("POST /v1/accounts/alice%40contoso.com/lock?wait=false&x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}")
        XCTAssertEqual(request.method, "POST")
        XCTAssertEqual(request.path, "/v1/accounts/alice%40contoso.com/lock")
        XCTAssertEqual(request.query, ["wait": "false", "x": ""])
        XCTAssertEqual(request.headers["host"], "a")
        XCTAssertEqual(request.body, Array("{}".utf8))
    }

    /// The query string that used to trap, and its relatives.
    func testQueryStringsOfAnyShape() throws {
        for (query, expected) in [("=", [:]), ("&", [:]), ("=&=", [:]), ("a=b=c", ["a": "b=c"]), ("a&a=2", ["a": ""]),
                                  ("%zz=%", ["%zz": "%"]), ("%41=%42", ["A": "B"]), ("==", [:]), ("", [:])] as [(String, [String: String])] {
            XCTAssertEqual(try parse("GET /v1/status?\(query) HTTP/1.1\r\n\r\n").query, expected, query)
        }
    }

    func testMalformedHeadsAreErrorsNotTraps() {
        let bad = [
            "", "\r\n", "GET\r\n\r\n", "GET /v1/status\r\n\r\n", "GET /v1/status HTTP/1.1 extra\r\n\r\n",
            "GET /v1/status HTTP/3\r\n\r\n", "GET status HTTP/1.1\r\n\r\n", "G@T /v1/status HTTP/1.1\r\n\r\n",
            "GET /v1/status HTTP/1.1\r\nNoColon\r\n\r\n", "GET /v1/status HTTP/1.1\r\n: empty name\r\n\r\n",
            "GET /v1/status HTTP/1.1\r\n folded\r\n\r\n", "GET /v1/status HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            "GET /v1/status HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", "GET /v1/status HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "GET /v1/status HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", "GET /v1/st\u{7f}tus HTTP/1.1\r\n\r\n",
            "GET /v1/status HTTP/1.1\r\nX: a\u{1}b\r\n\r\n", "GET /v1/status HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        ]
        for text in bad {
            XCTAssertThrowsError(try parse(text), text.debugDescription)
        }
        XCTAssertThrowsError(try HTTPParser.parse([0xff, 0xfe, 13, 10, 13, 10]))
        XCTAssertEqual(error { () throws(HTTPReadError) in _ = try parse("GET / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n") }, .bodyTooLarge)
        XCTAssertEqual(error { () throws(HTTPReadError) in _ = try parse("GET / HTTP/1.1\r\n" + String(repeating: "A: b\r\n", count: 100) + "\r\n") }, .headersTooLarge)
    }

    /// Any bytes at all: an answer or an error, never a trap (a quick stand-in for the fuzzer).
    func testRandomBytesNeverTrap() {
        var generator = SplitMix(seed: 7)
        let alphabet = Array("GETPOST /v1?=&%:\r\n0123456789aZ\u{0}\u{ff}".utf8)
        for round in 0..<20_000 {
            let length = Int(generator.next() % 200)
            let bytes = (0..<length).map { _ in round % 2 == 0 ? UInt8(truncatingIfNeeded: generator.next()) : alphabet[Int(generator.next() % UInt64(alphabet.count))] }
            if let request = try? HTTPParser.parse(bytes) {
                _ = try? ControlAPI.check(request)
            }
        }
    }

    func testPercentEscapesInAPathSegmentStayInIt() throws {
        let request = try parse("POST /v1/accounts/a%2Fb/lock HTTP/1.1\r\n\r\n")
        let (spec, parameters) = try ControlAPI.match(request)
        XCTAssertEqual(spec.pattern, "/v1/accounts/{identity}/lock")
        XCTAssertEqual(parameters["identity"], "a/b")
    }

    func testEveryRouteAnswersAnUnservedMethodWith405AndAllow() throws {
        for route in ControlAPI.routes {
            let path = route.pattern.replacingOccurrences(of: "{identity}", with: "a").replacingOccurrences(of: "{pid}", with: "1")
                .replacingOccurrences(of: "{id}", with: "1")
            let served = ControlAPI.routes.filter { $0.match(path) != nil }.map(\.method)
            for method in ["GET", "PUT", "POST", "DELETE", "PATCH"] where !served.contains(method) {
                do {
                    _ = try ControlAPI.match(HTTPRequest(method: method, path: path, query: [:], headers: [:], body: []))
                    XCTFail("\(method) \(path) matched")
                } catch {
                    XCTAssertEqual(error.status, 405, "\(method) \(path)")
                    XCTAssertEqual(Set((error.headers["Allow"] ?? "").components(separatedBy: ", ")), Set(served), "\(method) \(path)")
                }
            }
        }
    }

    func testRequestChecksNeedNoEngine() {
        func status(_ method: String, _ path: String, _ query: [String: String] = [:], _ body: String = "") -> Int {
            do {
                try ControlAPI.check(HTTPRequest(method: method, path: path, query: query, headers: [:], body: Array(body.utf8)))
                return 200
            } catch {
                return error.status
            }
        }
        XCTAssertEqual(status("GET", "/v1/status"), 200)
        XCTAssertEqual(status("POST", "/v1/accounts", [:], #"{"id":"a","upn":"a@b","passphrase":""}"#), 400)
        XCTAssertEqual(status("POST", "/v1/accounts", [:], #"{"id":"a","upn":"a@b","passphrase":"x"}"#), 200)
        XCTAssertEqual(status("POST", "/v1/accounts/a/unlock", [:], #"{"passphrase":""}"#), 400)
        XCTAssertEqual(status("DELETE", "/v1/bindings/0"), 400)
        XCTAssertEqual(status("POST", "/v1/accounts/a/wipe", ["wait": "yes"]), 400)
        XCTAssertEqual(status("GET", "/v1/events", ["after": "latest"]), 200)
        XCTAssertEqual(status("GET", "/v1/events", ["after": "x"]), 400)
        XCTAssertEqual(status("POST", "/v1/data/protect", [:], #"{"data":"!!"}"#), 400)
        XCTAssertEqual(status("GET", "/v1/nothing"), 404)
    }
}

final class ForwardingTests: XCTestCase {
    func testRequestsAndResponsesRoundTrip() throws {
        let request = HTTPRequest(method: "POST", path: "/v1/files/info", query: ["wait": "false", "é": "ü"], headers: ["host": "x"], body: Array("{\"path\":\"/a\"}".utf8))
        let back = try HTTPRequest(forwarded: request.forwardedPayload())
        XCTAssertEqual(back.method, request.method)
        XCTAssertEqual(back.path, request.path)
        XCTAssertEqual(back.query, request.query)
        XCTAssertEqual(back.body, request.body)
        var response = HTTPResponse(status: 405, body: Array("{}".utf8))
        response.headers = ["Allow": "GET"]
        let answer = try HTTPResponse(forwarded: response.forwardedPayload(), streamed: false)
        XCTAssertEqual(answer.status, 405)
        XCTAssertEqual(answer.headers, ["Allow": "GET"])
        XCTAssertEqual(answer.body, Array("{}".utf8))
        XCTAssertTrue(String(decoding: answer.serialized(), as: UTF8.self).contains("\r\nAllow: GET\r\n"))
    }

    /// Every cut and every flipped byte of a frame's payload is an error or a value, never a trap.
    func testDamagedFramesAreErrors() {
        let payload = HTTPRequest(method: "GET", path: "/v1/status", query: ["a": "b"], headers: [:], body: [1, 2, 3]).forwardedPayload()
        for cut in 0..<payload.count { XCTAssertThrowsError(try HTTPRequest(forwarded: Array(payload.prefix(cut))), "cut at \(cut)") }
        for index in payload.indices {
            for value: UInt8 in [0, 0x7f, 0xff] {
                var damaged = payload
                damaged[index] = value
                _ = try? HTTPRequest(forwarded: damaged)
                _ = try? HTTPResponse(forwarded: damaged, streamed: false)
            }
        }
    }

    func testFramesCrossASocketPair() throws {
        var pair: [Int32] = [-1, -1]
        XCTAssertEqual(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair), 0)
        defer { close(pair[0]); close(pair[1]) }
        let payload = [UInt8](repeating: 7, count: 300_000)
        let sender = FrameChannel(fd: pair[0], maxPayload: 0)
        let thread = startThread { XCTAssertTrue(sender.send(.chunk, payload)); XCTAssertTrue(sender.send(.chunk, [UInt8](repeating: 1, count: 64))) }
        let receiver = FrameChannel(fd: pair[1], maxPayload: 1 << 20)
        let (kind, got) = try receiver.receive()
        XCTAssertEqual(kind, .chunk)
        XCTAssertEqual(got, payload)
        if let thread { pthread_join(thread, nil) }
        XCTAssertThrowsError(try FrameChannel(fd: pair[1], maxPayload: 10).receive(), "over the limit")
    }

    func testDescriptorsCrossTheChannel() throws {
        var channel: [Int32] = [-1, -1]
        XCTAssertEqual(socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue), 0, &channel), 0)
        defer { close(channel[0]); close(channel[1]) }
        var client: [Int32] = [-1, -1]
        XCTAssertEqual(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &client), 0)
        defer { close(client[0]); close(client[1]) }
        let sent = [client[1], client[1]]
        XCTAssertEqual(sent.withUnsafeBufferPointer { clinux_send_descriptors(channel[0], $0.baseAddress, 2) }, 0)
        var byte: UInt8 = 0
        var fds: [Int32] = [-1, -1]
        XCTAssertEqual(fds.withUnsafeMutableBufferPointer { clinux_receive_descriptors(channel[1], &byte, $0.baseAddress, 2) }, 2)
        var pid: pid_t = 0, uid: uid_t = 0, gid: gid_t = 0
        XCTAssertEqual(clinux_peer_credentials(fds[0], &pid, &uid, &gid), 0)
        XCTAssertEqual(pid, getpid())
        XCTAssertEqual(uid, geteuid())
        for fd in fds { close(fd) }
        shutdown(channel[0], Int32(SHUT_RDWR))
        XCTAssertEqual(fds.withUnsafeMutableBufferPointer { clinux_receive_descriptors(channel[1], &byte, $0.baseAddress, 2) }, 0, "end of file")
    }
}

/// The typed error a closure throws (nil when it throws none).
func error<E: Error>(_ body: () throws(E) -> Void) -> E? {
    do {
        try body()
        return nil
    } catch {
        return error
    }
}

/// A small deterministic generator for repeatable random inputs.
struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D1_049B_5A5C_A4BD
        return z ^ (z >> 31)
    }
}
