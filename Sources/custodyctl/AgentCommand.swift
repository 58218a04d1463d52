import ArgumentParser
import CSystemd
import CustodyAPI
import CustodyClient
import Foundation
import Glibc

/// `custodyctl agent`: follows the user's own events and tells the person at the keyboard, through
/// the desktop's notification service (org.freedesktop.Notifications on the session bus), what was
/// blocked, locked, unlocked or wiped. Started in the graphical session by the XDG autostart entry
/// or the systemd user unit that `make install` and the package install.
struct Agent: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show desktop notifications for the user's identities: blocked saves, opens and shares, locks, unlocks, wipes.",
        discussion: """
            Follows the events of the caller's own accounts on the control socket and shows each as a \
            notification on the session bus (DBUS_SESSION_BUS_ADDRESS), at most one per kind and \
            identity every --interval seconds (the rest are counted into the next). No notification \
            names a path. Reconnects when the daemon restarts. With --print, writes the notices to \
            standard output instead.
            """)
    @OptionGroup var global: Global
    @Option(help: ArgumentHelp("Seconds between two notifications of one kind for one identity.", valueName: "seconds")) var interval: Double = 10
    @Flag(help: "Print the notices instead of showing them.") var print = false

    func run() throws {
        var bus: OpaquePointer?
        if !print {
            let opened = sd_bus_open_user(&bus)
            guard opened >= 0, bus != nil else {
                printError("no session bus (\(String(cString: strerror(-opened)))): set DBUS_SESSION_BUS_ADDRESS, or use --print")
                throw ExitCode(1)
            }
        }
        defer { if let bus { sd_bus_flush_close_unref(bus) } }
        var limiter = NoticeLimiter(interval: interval)
        var wait = 1.0
        while true {
            var connected = false
            do throws(CustodyClientError) {
                try global.client.stream(Endpoint.events.path(query: [("after", "latest")])) { line in
                    connected = true
                    guard let event = try? JSONDecoder().decode(CustodyEvent.self, from: Data(line.utf8)),
                          let notice = limiter.admit(event, now: Date().timeIntervalSince1970) else { return true }
                    show(notice, bus)
                    return true
                }
            } catch {
                if !connected { printError("agent: \(error); trying again in \(Int(wait)) s") }
            }
            wait = connected ? 1 : min(wait * 2, 30)
            Thread.sleep(forTimeInterval: wait)
        }
    }

    private func show(_ notice: Notice, _ bus: OpaquePointer?) {
        guard let bus else {
            Swift.print("\(notice.summary): \(notice.body)")
            fflush(nil)
            return
        }
        let id = custody_notify(bus, "Custody", notice.urgent ? "dialog-warning" : "dialog-information", notice.summary, notice.body,
                                notice.urgent ? 2 : 1, -1)
        if id < 0 { printError("agent: the notification service refused (\(String(cString: strerror(Int32(-id)))))") }
    }
}
