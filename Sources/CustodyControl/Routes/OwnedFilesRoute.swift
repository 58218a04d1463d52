import CustodyAPI
import CustodyCore
import FoundationEssentials

extension ControlAPI {
    /// `GET /v1/accounts/{identity}/files`: what the identity owns in every mount, one object per
    /// line as the walk finds it (a large tree is never held whole), then `{"summary": …}`. With
    /// `wipe=true` only what a wipe of it would delete: the preview `custodyctl wipe --dry-run`
    /// shows, made by the same walk as the wipe.
    func ownedFiles(_ r: RouteRequest) throws(Failure) -> HTTPResponse {
        let onlyWiped = r.flag("wipe", default: false)
        // An unknown account is a 404 before anything is streamed.
        let engine = self.engine
        let account = try engineCall { () throws(EngineError) in try engine.account(r.identity) }
        var response = HTTPResponse(status: 200, body: [], contentType: "application/x-ndjson")
        response.stream = { writer in
            let encoder = ControlAPI.encoder()
            var totals = OwnedTotals()
            var kept = 0
            var pending: [UInt8] = []
            func line(_ line: CustodyOwnedLine) {
                guard let bytes = try? line.json(encoder) else { return }
                pending += bytes
                pending.append(10)
            }
            var complete = true
            do throws(EngineError) {
                complete = try engine.ownedObjects(of: account.id) { object in
                    if object.kind == .directory, !object.wipeDeletes { kept += 1 }
                    if onlyWiped, !object.wipeDeletes { return true }
                    totals.add(object)
                    line(.object(CustodyOwnedObject(object)))
                    // Sent in pieces of about 64 KiB; a client that went away stops the walk.
                    guard pending.count >= 1 << 16 else { return true }
                    defer { pending.removeAll(keepingCapacity: true) }
                    return writer.send(pending)
                }
            } catch {
                complete = false
                let failure = ControlAPI.failure(error)
                line(.error(ErrorAnswer(code: failure.code, name: failure.name, message: failure.message)))
            }
            line(.summary(CustodyOwnedSummary(identity: account.upn, files: totals.files, directories: totals.directories,
                                              symlinks: totals.symlinks, other: totals.other, size: totals.size,
                                              bytesOnDisk: totals.bytesOnDisk, encryptedFiles: totals.encryptedFiles,
                                              keptDirectories: kept, complete: complete)))
            writer.send(pending)
        }
        return response
    }
}

extension CustodyOwnedObject {
    init(_ object: OwnedObject) {
        self.init(path: object.path, kind: object.kind.rawValue, size: object.size, bytesOnDisk: object.bytesOnDisk,
                  encrypted: object.encrypted, wipeDeletes: object.wipeDeletes, otherLink: object.otherLink ? true : nil)
    }
}
