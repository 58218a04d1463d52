@testable import CustodyConfig
import CustodyCore
import CustodyFormat
import Foundation
import XCTest

final class ConfigurationTests: XCTestCase {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    func parse(_ text: String) throws -> DaemonConfiguration { try DaemonConfiguration.parse(text, file: "test.toml") }

    func errors(_ text: String) -> [String] {
        do throws(ConfigurationErrors) {
            _ = try DaemonConfiguration.parse(text, file: "test.toml")
            return []
        } catch {
            return error.errors.map(\.description)
        }
    }

    func testTheShippedExampleIsValid() throws {
        let configuration = try DaemonConfiguration.load(path: Self.repository.appendingPathComponent("config/custody.toml").path)
        XCTAssertEqual(configuration.stateDirectory, "/var/lib/custody")
        XCTAssertEqual(configuration.socketMode, 0o666)
        XCTAssertEqual(configuration.adminGroup, "custody-admin")
        XCTAssertEqual(configuration.settings.maxFileProtectionLevel, .complete)
        XCTAssertTrue(configuration.settings.multiIdentity)
        XCTAssertTrue(configuration.scrubAccountIdentities)
        XCTAssertEqual(configuration.mounts, [])
    }

    func testTransferExemptionsAndLocations() throws {
        let configuration = try parse("""
            [settings]
            TransferExemptExecutables = ["/usr/sbin/backup-agent"]
            TransferExemptUids = [0, 34]
            [locations]
            OneDriveForBusiness = ["/home/alice/OneDrive - Contoso/"]
            "Team Share" = ["/srv/team"]
            """)
        XCTAssertEqual(configuration.settings.transferExemptExecutables, ["/usr/sbin/backup-agent"])
        XCTAssertEqual(configuration.settings.transferExemptUids, [0, 34])
        XCTAssertEqual(configuration.settings.locations, ["OneDriveForBusiness": ["/home/alice/OneDrive - Contoso"], "Team Share": ["/srv/team"]])
        let bad = errors("""
            [settings]
            TransferExemptExecutables = ["cat"]
            TransferExemptUids = ["root"]
            [locations]
            LocalDrive = ["/"]
            OneDriveForBusiness = ["relative"]
            "../x" = ["/x"]
            """)
        XCTAssertEqual(bad.count, 5, "\(bad)")
        XCTAssertTrue(bad.contains { $0.contains("settings.TransferExemptExecutables") && $0.contains("absolute") }, "\(bad)")
        XCTAssertTrue(bad.contains { $0.contains("locations.LocalDrive") && $0.contains("worked out") }, "\(bad)")
    }

    func testTheMachineKeyAndTheTPM() throws {
        XCTAssertEqual(try parse("").settings.machineKey, .auto)
        XCTAssertEqual(try DaemonConfiguration.load(path: Self.repository.appendingPathComponent("config/custody.toml").path).settings.machineKey, .auto)
        let configuration = try parse("""
            machine-key = "tpm2"
            tpm2-pcrs = [7]
            tpm2-tcti = "swtpm:host=127.0.0.1,port=2321"
            """)
        XCTAssertEqual(configuration.settings.machineKey, .tpm2)
        XCTAssertEqual(configuration.settings.tpm2PCRs, [7])
        XCTAssertEqual(configuration.settings.tpm2TCTI, "swtpm:host=127.0.0.1,port=2321")
        XCTAssertEqual(Set(errors("""
            machine-key = "hsm"
            tpm2-pcrs = [7, 24]
            tpm2-tcti = ""
            """)), [
            "test.toml:1: machine-key: must be auto, tpm2 or file, not hsm",
            "test.toml:2: tpm2-pcrs: must be an array of PCR numbers (0 to 23), such as [7]",
            "test.toml:3: tpm2-tcti: empty TCTI (for example device:/dev/tpmrm0)",
        ])
    }

    func testMetricsListenIsALoopbackAddress() throws {
        XCTAssertEqual(try parse(#"metrics-listen = "127.0.0.1:9464""#).metricsListen?.description, "127.0.0.1:9464")
        XCTAssertEqual(try parse(#"metrics-listen = "[::1]:9464""#).metricsListen?.description, "[::1]:9464")
        XCTAssertNil(try parse("").metricsListen, "off by default")
        XCTAssertEqual(errors(#"metrics-listen = "0.0.0.0:9464""#),
                       ["test.toml:1: metrics-listen: 0.0.0.0 is not a loopback address (127.0.0.0/8 or ::1): the metrics are served to this machine only"])
        XCTAssertEqual(errors(#"metrics-listen = "127.0.0.1:0""#), ["test.toml:1: metrics-listen: port must be 1 to 65535, not 0"])
        XCTAssertEqual(errors(#"metrics-listen = "localhost""#),
                       ["test.toml:1: metrics-listen: must be address:port on loopback, such as 127.0.0.1:9464, not localhost"])
        XCTAssertEqual(errors(#"metrics-listen = "[::1]9464""#),
                       ["test.toml:1: metrics-listen: must be address:port on loopback, such as 127.0.0.1:9464 or [::1]:9464, not [::1]9464"])
        XCTAssertEqual(errors(#"metrics-listen = "127.0.0.300:80""#).count, 1)
    }

    func testAFullConfiguration() throws {
        let configuration = try parse("""
            state = "/var/lib/custody/"
            log_level = "debug"
            [control]
            socket = "/run/c.sock"
            mode = "0600"
            [settings]
            MaxFileProtectionLevel = "NSFileProtectionCompleteUntilFirstUserAuthentication"
            LockGracePeriod = 2.5
            ValuesToScrubFromLogging = ["alice@contoso.com", "/srv/secret"]
            [default_identities]
            "1000" = "alice@contoso.com"
            [[mount]]
            backing = "/srv/a"
            mount_point = "/home/a/Work"
            allow_other = true
            threads = 4
            [[mount]]
            backing = "/srv/b"
            mount_point = "/home/b/Work"
            cache_timeout = 0
            writeback_cache = false
            low_latency = false
            encrypt_names = false
            shared_store = true
            store_attributes = "user"
            """)
        XCTAssertEqual(configuration.stateDirectory, "/var/lib/custody")
        XCTAssertEqual(configuration.logLevel, "debug")
        XCTAssertEqual(configuration.socketMode, 0o600)
        XCTAssertEqual(configuration.settings.maxFileProtectionLevel, .untilFirstAuthentication)
        XCTAssertEqual(configuration.settings.lockGracePeriod, 2.5)
        XCTAssertEqual(configuration.settings.valuesToScrubFromLogging, ["alice@contoso.com", "/srv/secret"])
        XCTAssertEqual(configuration.settings.defaultIdentities, [1000: "alice@contoso.com"])
        XCTAssertEqual(configuration.mounts.count, 2)
        XCTAssertEqual(configuration.mounts[0].threads, 4)
        XCTAssertTrue(configuration.mounts[0].allowOther)
        XCTAssertEqual(configuration.mounts[1].cacheTimeout, 0)
        XCTAssertFalse(configuration.mounts[1].writebackCache)
        XCTAssertTrue(configuration.mounts[0].lowLatency)
        XCTAssertFalse(configuration.mounts[1].lowLatency)
        XCTAssertTrue(configuration.mounts[0].encryptNames)
        XCTAssertFalse(configuration.mounts[1].encryptNames)
        XCTAssertFalse(configuration.mounts[0].sharedStore)
        XCTAssertTrue(configuration.mounts[1].sharedStore)
        XCTAssertNil(configuration.mounts[0].storeAttributes)
        XCTAssertEqual(configuration.mounts[1].storeAttributes, .user)
    }

    func testErrorsNameTheLineAndTheKey() {
        let found = Set(errors("""
            state = "/var/lib/custody"
            colour = "blue"
            log_levle = "info"
            [settings]
            MaxFileProtectionLevel = "ultra"
            MultiIdentity = "yes"
            multiidentity = true
            LockGracePeriod = -1
            [control]
            mode = "rwx"
            [[mount]]
            backing = "relative/path"
            mount_point = "/m"
            threads = 1000
            [[mount]]
            mount_point = "/m"
            store_attributes = "security"
            """))
        let expected: Set<String> = [
            "test.toml:2: colour: unknown key",
            "test.toml:3: log_levle: unknown key (did you mean log_level?)",
            "test.toml:5: settings.MaxFileProtectionLevel: unknown level ultra (NSFileProtectionComplete, NSFileProtectionCompleteUnlessOpen, NSFileProtectionCompleteUntilFirstUserAuthentication, NSFileProtectionNone, or complete, completeUnlessOpen, untilFirstAuth, none)",
            "test.toml:6: settings.MultiIdentity: must be true or false, not a string",
            "test.toml:7: settings.multiidentity: unknown key (did you mean MultiIdentity?)",
            "test.toml:8: settings.LockGracePeriod: must be a number of seconds, 0 or more",
            "test.toml:10: control.mode: must be octal permissions such as \"0660\", not rwx",
            "test.toml:12: mount[1].backing: must be an absolute path, not relative/path",
            "test.toml:14: mount[1].threads: must be between 1 and 256",
            "test.toml:15: mount[2]: missing key backing",
            "test.toml:17: mount[2].store_attributes: must be \"trusted\" or \"user\"",
        ]
        XCTAssertEqual(found.subtracting(expected).sorted(), [], "unexpected errors")
        XCTAssertEqual(expected.subtracting(found).sorted(), [], "missing errors")
    }

    func testSyntaxErrorsAndWrongTablesHaveLines() {
        let syntax = errors("state = \"/a\"\n[settings\nMultiIdentity = true\n")
        XCTAssertEqual(syntax.count, 1)
        XCTAssertTrue(syntax[0].hasPrefix("test.toml:2: invalid TOML"), syntax[0])
        XCTAssertEqual(errors("settings = 3\n"), ["test.toml:1: settings: must be a table ([settings]), not an integer"])
        XCTAssertEqual(errors("mount = 3\naccount = \"x\"\n"), ["test.toml:1: mount: must be an array of tables ([[mount]])",
                                                              "test.toml:2: account: must be an array of tables ([[account]])"])
        XCTAssertEqual(errors("mount = [1]\naccount = [2, 3]\n"), ["test.toml: mount[1]: each [[mount]] must be a table",
                                                                  "test.toml: account[1]: each [[account]] must be a table",
                                                                  "test.toml: account[2]: each [[account]] must be a table"])
        XCTAssertEqual(errors("[default_identities]\nalice = \"a@b.c\"\n"), ["test.toml:2: default_identities.alice: keys are uids (numbers), not alice"])
        XCTAssertEqual(errors("[[mount]]\nbacking = \"/a\"\nmount_point = \"/m\"\n[[mount]]\nbacking = \"/b\"\nmount_point = \"/m/\"\n"),
                       ["test.toml:6: mount[2].mount_point: /m is already mount 1"])
    }

    func testEnvironmentErrors() throws {
        let directory = try FileManager.default.url(for: .itemReplacementDirectory, in: .userDomainMask,
                                                    appropriateFor: URL(fileURLWithPath: "/tmp"), create: true).path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let text = """
            [control]
            group = "no-such-group-for-custody"
            [[mount]]
            backing = "\(directory)/missing"
            mount_point = "\(directory)"
            [[mount]]
            backing = "\(directory)"
            mount_point = "\(directory)/nowhere"
            """
        let configuration = try parse(text)
        XCTAssertEqual(Set(configuration.environmentErrors(file: "test.toml", text: text).map(\.description)), [
            "test.toml:2: control.group: no group named no-such-group-for-custody",
            "test.toml:4: mount[1].backing: backing directory \(directory)/missing does not exist or is not a directory",
            "test.toml:8: mount[2].mount_point: mount point \(directory)/nowhere does not exist or is not a directory",
        ])
    }
}

/// `[[account]]`: accounts provisioned from the configuration.
extension ConfigurationTests {
    func testAccountsWithTheirPolicyUserAndState() throws {
        let configuration = try DaemonConfiguration.parse("""
            [[account]]
            id = "alice-oid"
            upn = "alice@contoso.com"
            user = "root"
            [account.policy]
            protectionLevel = "NSFileProtectionCompleteUntilFirstUserAuthentication"
            saveToLocations = ["AccountDocument"]

            [[account]]
            id = "bob-oid"
            upn = "bob@contoso.com"
            uid = 1234
            enroll = false
            """, file: "test.toml")
        XCTAssertEqual(configuration.accounts.count, 2)
        var policy = Policy(protectionLevel: .untilFirstAuthentication)
        policy.saveToLocations = ["AccountDocument"]
        XCTAssertEqual(configuration.accounts[0], DeclaredAccount(id: "alice-oid", upn: "alice@contoso.com", policy: policy))
        XCTAssertEqual(configuration.accounts[1], DeclaredAccount(id: "bob-oid", upn: "bob@contoso.com", uid: 1234, enroll: false))
        XCTAssertEqual(configuration.declaredAccounts()[0].uid, 0, "the user is resolved on this machine")
        XCTAssertEqual(configuration.environmentErrors(file: "test.toml", text: ""), [])
    }

    func testMistakesAreRefusedByNameAndLine() {
        let found = errors("""
            [settings]
            AllowedAccounts = ["alice@contoso.com"]
            [[account]]
            id = "alice-oid"
            upn = "alice@contoso.com"
            usr = "alice"
            [account.policy]
            saveToLocation = ["AccountDocument"]

            [[account]]
            upn = "carol@contoso.com"

            [[account]]
            id = "mallory-oid"
            upn = "mallory@contoso.com"

            [[account]]
            id = "alice-oid"
            upn = "ALICE@contoso.com"
            enroll = false
            [account.policy]
            protectionLevel = "ultra"
            """)
        XCTAssertEqual(Set(found), [
            "test.toml:6: account[1].usr: unknown key (did you mean user?)",
            "test.toml:8: account[1].policy.saveToLocation: unknown field saveToLocation (did you mean saveToLocations?)",
            "test.toml:10: account[2]: missing key id",
            "test.toml:15: account[3].upn: mallory@contoso.com is declared managed but settings.AllowedAccounts does not name it",
            "test.toml:17: account[4]: alice-oid is already account[1]",
            "test.toml:21: account[4].policy: an account with enroll = false has no policy",
            "test.toml:22: account[4].policy.protectionLevel: unknown protection level ultra (complete, completeUnlessOpen, untilFirstAuth or none, or Apple's NSFileProtection names)",
        ], found.joined(separator: "\n"))
        XCTAssertTrue(found.allSatisfy { $0.hasPrefix("test.toml:") }, "\(found)")
    }

    func testAnUnknownUserIsAnEnvironmentError() throws {
        let text = "[[account]]\nid = \"a\"\nupn = \"a@b.c\"\nuser = \"no-such-user-custody\"\n"
        let configuration = try DaemonConfiguration.parse(text, file: "test.toml")
        let found = configuration.environmentErrors(file: "test.toml", text: text).map(\.description)
        XCTAssertEqual(found, ["test.toml:4: account[1].user: no local user named no-such-user-custody"])
        XCTAssertNil(configuration.declaredAccounts()[0].uid)
    }
}
