@testable import CustodyCore
import CustodyCrypto
import CustodyTPM
import Foundation

/// Reads a daemon's sealed state files as the daemon does (the state key under its machine key,
/// from a file or the test's software TPM), for tests that look inside them.
struct StateReader {
    let files: StateFiles

    init(_ state: String, tcti: String? = nil) throws {
        let seal = StateSeal(directory: state)
        files = StateFiles(directory: state, seal: seal)
        try seal.load(try MachineKeys(files: files, sealer: tcti.map { SoftwareTPMSealer(tpm: TPM(tcti: $0)) }))
    }

    func keybag(of identity: String) throws -> StoredKeybag? { try files.read(StoredKeybag.self, from: files.keybagName(identity)) }

    /// The keybag's file, relative to the state directory.
    func keybagName(of identity: String) -> String { files.keybagName(identity) }
}

/// Unseals machine keys with the test's swtpm (sealing is the daemon's).
private struct SoftwareTPMSealer: MachineKeySealer {
    let tpm: TPM
    var description: String { "test TPM (\(tpm.tcti))" }

    func seal(_ key: SecretBytes, pcrs: [Int]) throws(MachineKeyProblem) -> Data { throw MachineKeyProblem("the test only reads") }

    func unseal(_ sealed: Data, pcrs: [Int]) throws(MachineKeyProblem) -> SecretBytes {
        do {
            return try tpm.unseal(try JSONDecoder().decode(SealedObject.self, from: sealed))
        } catch {
            throw MachineKeyProblem("\(error)")
        }
    }
}
