import CustodyAPI
import CustodyCore
import CustodySystem

// The location routes: the SDK's `isSaveToAllowedForLocation` and
// `isOpenFromAllowedForLocation`, the locations this machine has, and the location of a path.



extension ControlAPI {
    static func checkLocation(_ body: LocationQuery) throws(Failure) -> Location {
        guard let location = Location(name: body.location) else {
            throw badRequest("unknown location \(body.location) (\(Location.knownNames))")
        }
        return location
    }

    /// The identity a policy question is about (nil: none named). An account that is not known,
    /// or that the caller may not see, is 404 UnknownAccount alike (nothing shows of the other),
    /// never answered as if it had no policy: a misspelt account must not read as "allowed".
    func policyIdentity(_ name: String?, _ caller: Caller) throws(Failure) -> String? {
        guard let name, !name.isEmpty else { return nil }
        do throws(EngineError) { return try visibleAccount(name, caller).upn } catch { throw Self.failure(error) }
    }

    func locationAnswer(_ body: LocationQuery, _ caller: Caller, saving: Bool) throws(Failure) -> HTTPResponse {
        let location = try Self.checkLocation(body)
        guard engine.isKnown(location) else {
            throw Self.badRequest("unknown location \(body.location) (\(Location.knownNames) configured in Locations)")
        }
        let identity = try policyIdentity(body.account, caller)
        let allowed = saving ? engine.isSaveToAllowed(location, for: identity) : engine.isOpenFromAllowed(location, for: identity)
        return json(LocationAnswer(location: location.name, account: body.account, allowed: allowed))
    }

    func locations(_ request: HTTPRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        let asked = request.query["account"]
        let identity = try policyIdentity(asked, caller)
        return json(LocationList(locations: engine.locationSummaries(answering: asked != nil, for: identity).map { CustodyAPI.LocationSummary($0) }))
    }

    /// The location of a path that need not exist yet (where a file would be saved): its
    /// nearest existing directory is resolved as the caller sees it (symbolic links followed),
    /// the rest is taken as written.
    func classify(_ body: PathRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        guard body.path.isAbsolutePath else { throw Self.malformedPath(body.path, "give an absolute path") }
        guard !body.path.utf8.contains(0) else { throw Self.malformedPath(body.path, "contains a NUL byte") }
        var existing = Engine.normalized(body.path)
        var rest: [String] = []
        let resolved = try asCaller(caller) { () throws(Failure) -> String in
            while true {
                if let resolved = resolvedPath(existing) { return resolved }
                guard !existing.bytesEqual("/") else { return "/" }
                let (parent, name) = Syscall.split(existing)
                rest.insert(name, at: 0)
                existing = parent.isEmpty ? "/" : parent
            }
        }
        let full = rest.isEmpty ? resolved : (resolved.bytesEqual("/") ? "" : resolved) + "/" + rest.joined(separator: "/")
        return try run { () throws(EngineError) in json(CustodyAPI.PathLocation(try engine.locate(full))) }
    }
}
