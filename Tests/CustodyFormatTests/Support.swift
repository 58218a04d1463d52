@testable import CustodyCrypto
@testable import CustodyFormat
import CustodySystem
import Glibc
import XCTest
import CustodyTestSupport

func secretBytes(_ bytes: [UInt8]) throws -> SecretBytes { try bytes.withUnsafeBytes { try SecretBytes(copying: $0) } }

func symmetricClassKey(_ byte: UInt8 = 0x11, id: [UInt8] = [1, 2, 3, 4, 5, 6, 7, 8]) throws -> ClassKey {
    .symmetric(id: id, key: try AESGCMKey(try secretBytes([UInt8](repeating: byte, count: 32))))
}

func classBKey(unlocked: Bool = true, id: [UInt8] = [9, 9, 9, 9, 9, 9, 9, 9]) throws -> (ClassKey, SecretBytes, [UInt8]) {
    let privateKey = try secretBytes([UInt8](repeating: 0x77, count: 32))
    let publicKey = try X25519.publicKey(for: privateKey)
    return (.agreement(id: id, publicKey: publicKey, privateKey: unlocked ? privateKey : nil), privateKey, publicKey)
}

extension ProtectedFile {
    func readAll() throws -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: Int(size))
        let count = try buffer.withUnsafeMutableBytes { try read(into: $0, at: 0) }
        return Array(buffer[0..<count])
    }

    func read(_ count: Int, at offset: UInt64) throws -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: count)
        let got = try buffer.withUnsafeMutableBytes { try read(into: $0, at: offset) }
        return Array(buffer[0..<got])
    }

    func write(_ bytes: [UInt8], at offset: UInt64) throws {
        try bytes.withUnsafeBytes { try write($0, at: offset) }
    }
}

func temporaryFile() throws -> (Int32, String) {
    var template = Array("/tmp/custody-format.XXXXXX".utf8CString)
    let fd = mkstemp(&template)
    guard fd >= 0 else { throw Errno.current }
    return (fd, String(cString: template))
}
