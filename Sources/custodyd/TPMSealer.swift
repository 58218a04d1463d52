import CustodyCore
import CustodyCrypto
import CustodyTPM
import FoundationEssentials

/// The engine's machine-key sealer on the machine's TPM 2.0: what the engine keeps is the sealed
/// object (JSON), and every TPM failure becomes a reason that says what happened and what to do.
struct TPMSealer: MachineKeySealer {
    let tpm: TPM

    var description: String { "TPM 2.0 (\(tpm.tcti))" }

    /// A sealer when a TPM is there (also with `machine-key = "file"`: a key sealed earlier is
    /// then moved out of it), or when `machine-key = "tpm2"` asks for one (its absence is then an
    /// error at start rather than a silent file).
    static func make(_ settings: Settings) -> TPMSealer? {
        guard settings.machineKey == .tpm2 || TPM.isPresent(tcti: settings.tpm2TCTI) else { return nil }
        return TPMSealer(tpm: TPM(tcti: settings.tpm2TCTI))
    }

    func seal(_ key: SecretBytes, pcrs: [Int]) throws(MachineKeyProblem) -> Data {
        do {
            return try JSONEncoder().encode(try tpm.seal(key, pcrs: pcrs))
        } catch let error as TPMError {
            throw problem(error, pcrs: pcrs)
        } catch {
            throw MachineKeyProblem("cannot record the sealed object: \(error)")
        }
    }

    func unseal(_ sealed: Data, pcrs: [Int]) throws(MachineKeyProblem) -> SecretBytes {
        let object: SealedObject
        do { object = try JSONDecoder().decode(SealedObject.self, from: sealed) } catch { throw MachineKeyProblem("the sealed machine key is not readable: \(error)") }
        do { return try tpm.unseal(object) } catch { throw problem(error, pcrs: object.pcrs) }
    }

    /// A gate: one random byte sealed with `authorization` and without noDA, so that each wrong
    /// authorization counts against the TPM's dictionary-attack lockout.
    func makeGate(authorization: SecretBytes) -> Data? {
        guard let content = try? SecretBytes.random(count: 1), let sealed = try? tpm.seal(content, authorization: authorization) else { return nil }
        return try? JSONEncoder().encode(sealed)
    }

    func openGate(_ gate: Data, authorization: SecretBytes) -> GateAnswer {
        guard let object = try? JSONDecoder().decode(SealedObject.self, from: gate) else { return .unusable("the gate is not readable") }
        do {
            _ = try tpm.unseal(object, authorization: authorization)
            return .open
        } catch {
            switch error.kind {
            case .badAuthorization: return .wrong
            case .lockout:
                let interval = (try? tpm.lockoutState()).map { Double($0.interval) } ?? 0
                return .lockedOut(retryAfterSeconds: max(1, interval))
            default: return .unusable(error.description)
            }
        }
    }

    var dictionaryAttack: DictionaryAttackState? {
        guard let state = try? tpm.lockoutState() else { return nil }
        return DictionaryAttackState(failures: Int(state.failures), maxTries: Int(state.maxTries), intervalSeconds: Int(state.interval))
    }

    func problem(_ error: TPMError, pcrs: [Int]) -> MachineKeyProblem {
        switch error.kind {
        case .foreign:
            return MachineKeyProblem("the machine key was sealed by another TPM, or this TPM (\(tpm.tcti)) was cleared: it cannot be unsealed here "
                + "(\(error.message)). Identities with a recovery key can be recovered: custodyctl machine-key reset, then custodyctl recover")
        case .policy:
            return MachineKeyProblem("PCR \(pcrs.map(String.init).joined(separator: ", ")) changed since the machine key was sealed"
                + (pcrs.contains(7) ? " (PCR 7: the Secure Boot state or its keys)" : "") + ", so the TPM refuses to unseal it (\(error.message))")
        case .unreachable:
            return MachineKeyProblem("no TPM answers at \(tpm.tcti) (\(error.message))")
        case .lockout:
            return MachineKeyProblem("the TPM is in dictionary-attack lockout (\(error.message))")
        default:
            return MachineKeyProblem("the TPM refused: \(error.message)")
        }
    }
}
