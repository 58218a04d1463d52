@testable import CustodyCore
import Glibc

/// The file of an identity's keybag (`keybags`) or wipe journal (`wipes`) in a state directory: a
/// keyed hash under the directory's state key, found as a starting engine finds it.
func stateFileName(of identity: String, in subdirectory: String = "keybags", directory: String, sealer: MachineKeySealer? = nil) throws -> String {
    let seal = StateSeal(directory: directory)
    let files = StateFiles(directory: directory, seal: seal)
    try seal.load(try MachineKeys(files: files, sealer: sealer))
    return seal.name(of: identity, in: subdirectory)
}

/// Rewrites a state directory as releases before the state key wrote it: every file in clear,
/// keybags named by a plain hash of the identity, no `state-key.json`.
func writeAsBeforeTheStateKey(_ engine: Engine, directory: String) throws {
    let plain = StateFiles(directory: directory, seal: nil)
    if let accounts = try engine.files.read(Engine.AccountsFile.self, from: "accounts.json") {
        try plain.write(accounts, to: "accounts.json")
    }
    if let bindings = try engine.files.read(Engine.Bindings.self, from: "bindings.json") {
        try plain.write(bindings, to: "bindings.json")
    }
    for name in plain.list("keybags") where name.hasSuffix(".json") {
        guard let stored = try engine.files.read(StoredKeybag.self, from: "keybags/" + name) else { continue }
        _ = unlink(directory + "/keybags/" + name)
        try plain.write(stored, to: StateSeal.legacyName(of: stored.identity, in: "keybags"))
    }
    _ = unlink(directory + "/" + StateSeal.keyFile)
}
