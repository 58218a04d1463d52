@testable import CustodyGuard
import Foundation
import Glibc
import XCTest

/// The helpers a process talks to over socketpairs are found; what it talks to through a service's
/// socket, or a socket another program leaked into it, is not.
final class SocketPairsTests: XCTestCase {
    func testAChildAtTheOtherEndOfASocketpairIsAPeer() throws {
        let script = """
            import os, socket, sys, time
            a, b = socket.socketpair()
            child = os.fork()
            if child == 0:
                a.close()
                time.sleep(30)
                os._exit(0)
            b.close()
            lonely = os.fork()
            if lonely == 0:
                time.sleep(30)
                os._exit(0)
            print(child, lonely, flush=True)
            time.sleep(30)
            """
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = ["-c", script]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        defer { process.terminate() }
        // The whole line: the pieces of a print may come in more than one write.
        var text = ""
        while !text.contains("\n") {
            let data = output.fileHandleForReading.availableData
            if data.isEmpty { break }
            text += String(decoding: data, as: UTF8.self)
        }
        let line = text.split(separator: " ")
        guard line.count == 2, let child = Int32(line[0]), let lonely = Int32(line[1].trimmingCharacters(in: .whitespacesAndNewlines)) else {
            return XCTFail("no PIDs: \(line)")
        }
        defer {
            kill(child, SIGKILL)
            kill(lonely, SIGKILL)
        }
        let peers = SocketPairs.peers(of: process.processIdentifier)
        XCTAssertEqual(peers, [child], "the child with the other end; not the child without one")
        XCTAssertTrue(SocketPairs.descends(child, from: process.processIdentifier))
        XCTAssertFalse(SocketPairs.descends(process.processIdentifier, from: child))
        XCTAssertEqual(SocketPairs.peers(of: child), [], "the parent is not the child's helper")
    }
}
