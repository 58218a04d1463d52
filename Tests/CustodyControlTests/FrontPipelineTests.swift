import CustodyAPI
import CLinux
import CustodySystem
@testable import CustodyControl
import Foundation
import Glibc
import XCTest

/// The front's HTTP pipeline (SwiftNIO's decoder, the limits, the checks), driven without a socket.
final class FrontPipelineTests: XCTestCase {
    /// What the front answers to `text`, with every checked request answered by echoing it.
    func exchange(_ text: String, pieceSize: Int = 4096, keepOpen: Bool = false) -> String {
        exchange(Array(text.utf8), pieceSize: pieceSize, keepOpen: keepOpen)
    }

    func exchange(_ bytes: [UInt8], pieceSize: Int = 4096, keepOpen: Bool = false) -> String {
        let answer = FrontExchange.run(bytes, pieceSize: pieceSize, keepOpen: keepOpen) { request in
            let echo = ["method": request.method, "path": request.path, "query": request.query.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: "&"),
                        "host": request.headers["host"] ?? "", "body": String(decoding: request.body, as: UTF8.self)]
            return HTTPResponse(status: 200, body: Array(echo.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" }.joined(separator: "|").utf8))
        }
        return String(decoding: answer, as: UTF8.self)
    }

    func status(_ answer: String) -> Int { Int(answer.dropFirst(9).prefix(3)) ?? 0 }

    func testAWellFormedRequest() throws {
        let answer = exchange("POST /v1/accounts/alice%40contoso.com/lock?wait=false&x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}")
        XCTAssertTrue(answer.hasPrefix("HTTP/1.1 200 OK\r\n"), answer)
        XCTAssertTrue(answer.hasSuffix("body:{}|host:a|method:POST|path:/v1/accounts/alice%40contoso.com/lock|query:wait=false&x="), answer)
        XCTAssertTrue(answer.contains("\r\nContent-Length: "), answer)
    }

    /// Any split of the bytes gives the same answer (a client may send a byte at a time).
    func testARequestInPiecesOfAnySize() {
        let request = "POST /v1/accounts/a/lock HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
        let whole = exchange(request)
        XCTAssertTrue(whole.hasSuffix("body:hello|host:h|method:POST|path:/v1/accounts/a/lock|query:"), whole)
        for size in [1, 2, 3, 7, 50] { XCTAssertEqual(exchange(request, pieceSize: size), whole, "pieces of \(size)") }
    }

    /// A chunked body is read like any other, within the same limit.
    func testAChunkedBody() {
        let answer = exchange("POST /v1/accounts/a/lock HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        XCTAssertTrue(answer.contains("body:abcde|"), answer)
        let chunk = String(repeating: "x", count: 64 * 1024)
        let many = String(repeating: "10000\r\n\(chunk)\r\n", count: 17)
        let tooLarge = exchange("POST /v1/accounts/a/lock HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + many + "0\r\n\r\n", pieceSize: 65536)
        XCTAssertEqual(status(tooLarge), 413, String(tooLarge.prefix(200)))
    }

    /// Requests on one connection are answered in order; `Connection: close` ends it.
    func testKeepAliveAndPipelining() {
        let two = exchange("GET /v1/status?n=1 HTTP/1.1\r\n\r\nGET /v1/status?n=2 HTTP/1.1\r\nConnection: close\r\n\r\nGET /v1/status?n=3 HTTP/1.1\r\n\r\n", keepOpen: true)
        XCTAssertEqual(two.components(separatedBy: "HTTP/1.1 200 OK").count - 1, 2, two)
        XCTAssertTrue(two.contains("query:n=1") && two.contains("query:n=2") && !two.contains("query:n=3"), two)
        XCTAssertTrue(two.contains("Connection: keep-alive"), two)
        XCTAssertTrue(two.hasSuffix("query:n=2"), two)
        let ten = exchange(String(repeating: "GET /v1/status HTTP/1.1\r\n\r\n", count: 10), pieceSize: 13)
        XCTAssertEqual(ten.components(separatedBy: "HTTP/1.1 200 OK").count - 1, 10)
    }

    /// The query string that used to trap, and its relatives.
    func testQueryStringsOfAnyShape() throws {
        for (query, expected) in [("=", ""), ("&", ""), ("=&=", ""), ("a=b=c", "a=b=c"), ("a&a=2", "a="),
                                  ("%zz=%", "%zz=%"), ("%41=%42", "A=B"), ("==", ""), ("", "")] {
            let answer = exchange("GET /v1/status?\(query) HTTP/1.1\r\n\r\n")
            XCTAssertTrue(answer.hasSuffix("|query:\(expected)"), "\(query): \(answer)")
        }
    }

    func testMalformedRequestsAreAnsweredNotTraps() {
        let bad = [
            "GET\r\n\r\n", "GET /v1/status HTTP/1.1 extra\r\n\r\n",
            "GET /v1/status HTTP/3\r\n\r\n", "GET status HTTP/1.1\r\n\r\n", "G@T /v1/status HTTP/1.1\r\n\r\n",
            "GET /v1/status HTTP/1.1\r\nNoColon\r\n\r\n", "GET /v1/status HTTP/1.1\r\n: empty name\r\n\r\n",
            "GET /v1/status HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            "GET /v1/status HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", "GET /v1/status HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "GET /v1/status HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", "GET /v1/st\u{7f}tus HTTP/1.1\r\n\r\n",
            "GET /v1/status HTTP/1.1\r\nX: a\u{1}b\r\n\r\n", "GET /v1/status HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "GET http://x/v1/status HTTP/1.1\r\n\r\n", "GET /v1/status HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        ]
        for text in bad {
            let answer = exchange(text)
            XCTAssertEqual(status(answer), 400, "\(text.debugDescription): \(answer)")
            XCTAssertTrue(answer.contains("Connection: close"), answer)
        }
        XCTAssertEqual(status(exchange([0xff, 0xfe, 13, 10, 13, 10])), 400)
        // Nothing at all, or a blank line: closed without an answer or answered 400; never a trap.
        XCTAssertEqual(exchange(""), "")
        XCTAssertEqual(status(exchange("GET / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n")), 413)
        XCTAssertEqual(status(exchange("GET / HTTP/1.1\r\n" + String(repeating: "A: b\r\n", count: 100) + "\r\n")), 431)
        XCTAssertEqual(status(exchange("GET / HTTP/1.1\r\nA: " + String(repeating: "b", count: 20_000) + "\r\n\r\n")), 431)
        // An endless request line: cut off once it passes the head's limit.
        XCTAssertEqual(status(exchange("GET /" + String(repeating: "a", count: 200_000), pieceSize: 1024, keepOpen: true)), 431)
    }

    /// The answers carry the API's error body.
    func testErrorsAreTheAPIsJSON() {
        let answer = exchange("GET / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n")
        XCTAssertTrue(answer.hasPrefix("HTTP/1.1 413 Content Too Large\r\n"), answer)
        XCTAssertTrue(answer.contains("Content-Type: application/json"), answer)
        XCTAssertTrue(answer.contains("\"name\":\"RequestTooLarge\""), answer)
        let unknown = exchange("GET /v1/nothing HTTP/1.1\r\n\r\n")
        XCTAssertEqual(status(unknown), 404, unknown)
    }

    /// Any bytes at all: an answer or a close, never a trap (a quick stand-in for the fuzzer).
    func testRandomBytesNeverTrap() {
        var generator = SplitMix(seed: 7)
        let alphabet = Array("GETPOST /v1?=&%:\r\n0123456789aZ\u{0}\u{ff}".utf8)
        for round in 0..<3_000 {
            let length = Int(generator.next() % 200)
            let bytes = (0..<length).map { _ in round % 2 == 0 ? UInt8(truncatingIfNeeded: generator.next()) : alphabet[Int(generator.next() % UInt64(alphabet.count))] }
            ControlInputs.parseAndCheck(bytes)
        }
    }

    /// A connection's pipeline is freed when it ends, whatever ended it (the fuzzer runs millions).
    func testExchangesLeaveNothingBehind() {
        func residentBytes() -> Int {
            4096 * (Int((try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8))?.split(separator: " ").dropFirst().first ?? "0") ?? 0)
        }
        for text in ["GET /v1/status HTTP/1.1\r\n\r\n", "POST /v1/accounts/a/lock HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", "garbage\r\n\r\n", ""] {
            for _ in 0..<300 { ControlInputs.parseAndCheck(Array(text.utf8)) }
            let before = residentBytes()
            for _ in 0..<3000 { ControlInputs.parseAndCheck(Array(text.utf8)) }
            XCTAssertLessThan((residentBytes() - before) / 3000, 1024, "bytes kept per exchange of \(text.debugDescription)")
        }
    }

    func request(_ text: String) -> HTTPRequest {
        let (path, query) = RequestTarget.split(text)
        return HTTPRequest(method: "POST", path: path, query: RequestTarget.query(query), headers: [:], body: [])
    }

    func testPercentEscapesInAPathSegmentStayInIt() throws {
        let (spec, parameters) = try ControlAPI.match(request("/v1/accounts/a%2Fb/lock"))
        XCTAssertEqual(spec.endpoint, .lock)
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
        XCTAssertEqual(status("DELETE", "/v1/bindings/1", ["thread": "null"]), 400)
        XCTAssertEqual(status("DELETE", "/v1/bindings/1", ["thread": "true"]), 200)
        XCTAssertEqual(status("DELETE", "/v1/bindings/1", ["thread": "false"]), 200)
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
        let thread = try? DaemonThread.start("test-sender") { XCTAssertTrue(sender.send(.chunk, payload)); XCTAssertTrue(sender.send(.chunk, [UInt8](repeating: 1, count: 64))) }
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
