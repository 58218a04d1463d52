import CustodyCore
import Synchronization

/// What the daemon plugs in for `GET /v1/metrics`: its metrics as Prometheus text. The argument
/// says whether series naming identities may be included (an administrator asks, and the daemon
/// decides whether identities are scrubbed).
public final class MetricsHooks: Sendable {
    private let render = Mutex<(@Sendable (_ administrator: Bool) -> [UInt8])?>(nil)

    public func set(_ render: @escaping @Sendable (_ administrator: Bool) -> [UInt8]) {
        self.render.withLock { $0 = render }
    }

    func text(administrator: Bool) -> [UInt8]? { render.withLock { $0 }?(administrator) }
}

extension ControlServer {
    /// Hooks for `GET /v1/metrics`.
    public var metrics: MetricsHooks { api.metrics }
}

extension ControlAPI {
    /// The Prometheus text exposition format's content type.
    static let metricsContentType = "text/plain; version=0.0.4; charset=utf-8"

    /// `GET /v1/metrics`: anyone may read it (no series names an identity unless an administrator
    /// asks and identities are not scrubbed).
    func metricsAnswer(_ caller: Caller) -> HTTPResponse {
        guard let text = metrics.text(administrator: caller.isAdmin) else {
            return Self.failure(404, 404, "UnknownRoute", "this daemon serves no metrics")
        }
        return HTTPResponse(status: 200, body: text, contentType: Self.metricsContentType)
    }
}
