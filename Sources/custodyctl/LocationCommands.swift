import ArgumentParser
import CustodyClient
import FoundationEssentials

// The SDK's location questions (isSaveToAllowedForLocation, isOpenFromAllowedForLocation) and
// where a path is.

struct Locations: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the locations of this machine and the directories they cover; with --account, what its policy allows.")
    @OptionGroup var global: Global
    @Option(help: ArgumentHelp("The account whose policy to show (ID or UPN).", valueName: "identity")) var account: String?

    func run() throws {
        let response = try request(global, Endpoint.locations, query: account.map { [("account", $0)] } ?? [])
        let list = try decode(LocationList.self, response)
        show(response, global) {
            list.locations.map { location in
                var line = location.name + ": " + (location.neverMatches ? "(never on Linux)" : location.paths.isEmpty ? "(none)" : location.paths.joined(separator: ", "))
                if let save = location.saveToAllowed, let open = location.openFromAllowed {
                    line += "  save to: \(save ? "allowed" : "blocked"), open from: \(open ? "allowed" : "blocked")"
                }
                return line
            }.joined(separator: "\n")
        }
    }
}

struct Locate: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show the location a path is in (AccountDocument, LocalDrive, Other, or a configured one).")
    @OptionGroup var global: Global
    @Argument(help: "The path.") var path: String

    func run() throws {
        let response = try request(global, Endpoint.classify, body: PathRequest(path: absolute(path)))
        let located = try decode(PathLocation.self, response)
        show(response, global) { "\(located.path): \(located.location) (under \(located.under))" }
    }
}

struct SaveToAllowed: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "May an account's data be saved to a location (isSaveToAllowedForLocation)? Exit 0 yes, 2 no.")
    @OptionGroup var global: Global
    @Argument(help: "The location: AccountDocument, LocalDrive, OneDriveForBusiness, SharePoint, Other, CameraRoll or a configured one.")
    var location: String
    @Option(help: ArgumentHelp("The account (ID or UPN); without it, no identity.", valueName: "identity")) var account: String?

    func run() throws { try ask(global, Endpoint.saveToAllowed, location, account, "saving \(account ?? "unmanaged")'s data to") }
}

struct OpenFromAllowed: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "May data from a location be opened into an account (isOpenFromAllowedForLocation)? Exit 0 yes, 2 no.")
    @OptionGroup var global: Global
    @Argument(help: "The location.") var location: String
    @Option(help: ArgumentHelp("The account (ID or UPN); without it, no identity.", valueName: "identity")) var account: String?

    func run() throws { try ask(global, Endpoint.openFromAllowed, location, account, "opening into \(account ?? "unmanaged") from") }
}

private func ask(_ global: Global, _ endpoint: Endpoint, _ location: String, _ account: String?, _ what: String) throws {
    let response = try request(global, endpoint, body: LocationQuery(location: location, account: account))
    let answer = try decode(LocationAnswer.self, response)
    show(response, global) { "\(answer.allowed ? "yes" : "no"): \(what) \(answer.location) is \(answer.allowed ? "allowed" : "blocked")" }
    if !answer.allowed { throw ExitCode(Exit.no) }
}
