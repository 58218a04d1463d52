import NIOCore
import NIOHTTP1

/// What the front does with a request that passed its checks. In the front process it is handed
/// to the daemon (`DaemonForwarder`); the tests and the fuzzer answer it in place. Either way the
/// answer goes back through the connection's `respond`, `beginStream`, `streamChunk`, `endStream`.
protocol RequestForwarder {
    func forward(_ request: HTTPRequest, for connection: FrontConnection, context: ChannelHandlerContext)
}

/// The control front's channel pipeline for one client connection: SwiftNIO's HTTP/1.1 decoder
/// and encoder with the control socket's limits, and `FrontConnection` over them.
enum FrontPipeline {
    static var decoderLimits: NIOHTTPDecoderLimitConfiguration {
        var limits = NIOHTTPDecoderLimitConfiguration()
        limits.maxHeaderListSize = ControlLimits.maxHeaderBytes
        limits.maxHeaderFieldSize = ControlLimits.maxHeaderBytes
        limits.maxHeaderFieldCount = ControlLimits.maxHeaders
        return limits
    }

    static func handlers(_ forwarder: any RequestForwarder) -> [any ChannelHandler] {
        let limit = HeadLimit()
        return [
            limit,
            ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .dropBytes, informationalResponseStrategy: .drop,
                                                    limitConfiguration: decoderLimits)),
            HTTPResponseEncoder(),
            FrontConnection(forwarder: forwarder, headLimit: limit),
        ]
    }
}

/// Counts what arrives before a request head is complete. The decoder limits the header fields
/// but not the request line, so without this a client could send an endless target.
final class HeadLimit: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    /// Bytes received since the current request began (while its head is incomplete).
    private(set) var received = 0
    private var awaitingHead = true
    private var tripped = false

    func headComplete() { awaitingHead = false }

    func nextRequest() {
        awaitingHead = true
        received = 0
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !tripped else { return }
        if awaitingHead {
            // What came before this read did not complete the head: all of it is head.
            if received > ControlLimits.maxHeaderBytes + 1024 {
                tripped = true
                context.fireErrorCaught(HTTPParserError.headerOverflow)
                return
            }
            received += unwrapInboundIn(data).readableBytes
        }
        context.fireChannelRead(data)
    }
}

/// One client connection of the control socket, on the front's event loop: reads requests
/// within the limits and deadlines (`ControlLimits`), answers bad ones itself, checks good ones
/// (`ControlAPI.check`), forwards them one at a time and writes the answers, streamed ones as
/// chunks. Reading is on demand: nothing more is read while a request is being answered, except
/// on a stream, where reading only notices the client leaving.
final class FrontConnection: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private enum State { case awaitingHead, receivingBody, answering, streaming, closed }

    private var state = State.awaitingHead
    private var head: HTTPRequestHead?
    private var body = ByteBuffer()
    private var keepAlive = false
    private var inputClosed = false
    private var answered = 0
    private var deadline: Scheduled<Void>?
    /// Parts of pipelined requests read while one was being answered.
    private var queued: [HTTPServerRequestPart] = []
    private let forwarder: any RequestForwarder
    private let headLimit: HeadLimit
    /// The daemon's side of the request being answered: closed when the client goes, paused
    /// while the client does not read.
    var upstream: Channel?

    init(forwarder: any RequestForwarder, headLimit: HeadLimit) {
        self.forwarder = forwarder
        self.headLimit = headLimit
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { begin(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        begin(context)
        context.fireChannelActive()
    }

    private func begin(_ context: ChannelHandlerContext) {
        guard deadline == nil, state == .awaitingHead, answered == 0 else { return }
        awaitHead(context)
        context.read()
    }

    private func arm(_ context: ChannelHandlerContext, seconds: Int64, _ expired: @escaping () -> Void) {
        deadline?.cancel()
        deadline = context.eventLoop.assumeIsolated().scheduleTask(in: .seconds(seconds)) { expired() }
    }

    private func disarm() {
        deadline?.cancel()
        deadline = nil
    }

    /// Waits for the next request head: an answer on a connection that sent nothing of it is a
    /// quiet close, one that sent part of it (or is new) is answered 408.
    private func awaitHead(_ context: ChannelHandlerContext) {
        arm(context, seconds: ControlLimits.headSeconds) { [self] in
            guard state == .awaitingHead else { return }
            if answered > 0, headLimit.received == 0 {
                close(context)
            } else {
                fail(context, ControlAPI.failure(408, 408, "RequestTimeout", "no request head within \(ControlLimits.headSeconds) s"))
            }
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        switch state {
        case .awaitingHead, .receivingBody: take(part, context)
        case .answering:
            // Pipelined requests wait their turn; reading stopped, so at most a read's worth.
            queued.append(part)
        case .streaming, .closed: break
        }
    }

    private func take(_ part: HTTPServerRequestPart, _ context: ChannelHandlerContext) {
        switch part {
        case .head(let requestHead):
            guard state == .awaitingHead else { return fail(context, ControlAPI.failure(400, 400, "BadRequest", "a request head inside a body")) }
            headLimit.headComplete()
            state = .receivingBody
            head = requestHead
            keepAlive = requestHead.isKeepAlive
            body.clear()
            arm(context, seconds: ControlLimits.bodySeconds) { [self] in
                guard state == .receivingBody else { return }
                fail(context, ControlAPI.failure(408, 408, "RequestTimeout", "no whole request within \(ControlLimits.bodySeconds) s of its head"))
            }
            if let refusal = Self.refusal(of: requestHead) { fail(context, refusal) }
        case .body(var chunk):
            guard state == .receivingBody else { return }
            guard body.readableBytes + chunk.readableBytes <= ControlLimits.maxBodyBytes else { return fail(context, Self.tooLarge) }
            body.writeBuffer(&chunk)
        case .end:
            guard state == .receivingBody, let requestHead = head else { return }
            disarm()
            state = .answering
            let request = Self.request(requestHead, body: Array(body.readableBytesView))
            body.clear()
            #if DEBUG
            // Test builds only: a request can make the front trap as a parsing bug would (an index
            // out of range), so the tests see a real Swift trap contained.
            if request.headers["x-custody-test-trap"] == "index-out-of-range" { Self.trapForTests(request.body.count + 1) }
            #endif
            do throws(ControlAPI.Failure) {
                try ControlAPI.check(request)
            } catch {
                return respond(ControlAPI.answer(error), context)
            }
            forwarder.forward(request, for: self, context: context)
        }
    }

    static let tooLarge = ControlAPI.failure(413, 413, "RequestTooLarge", "request body over \(ControlLimits.maxBodyBytes) bytes")

    /// What is wrong with a head the decoder accepted, for the control socket.
    static func refusal(of head: HTTPRequestHead) -> HTTPResponse? {
        guard head.version.major == 1, head.version.minor <= 1 else { return ControlAPI.failure(400, 400, "BadRequest", "unsupported HTTP version") }
        guard head.method.rawValue.utf8.count <= 16 else { return ControlAPI.failure(400, 400, "BadRequest", "bad method") }
        guard RequestTarget.isValid(head.uri) else { return ControlAPI.failure(400, 400, "BadRequest", "bad request target") }
        guard head.headers.count <= ControlLimits.maxHeaders else {
            return ControlAPI.failure(431, 431, "HeadersTooLarge", "more than \(ControlLimits.maxHeaders) header fields")
        }
        if let length = head.headers.first(name: "content-length") {
            guard let value = Int(length), value >= 0 else { return ControlAPI.failure(400, 400, "BadRequest", "bad Content-Length") }
            if value > ControlLimits.maxBodyBytes { return tooLarge }
        }
        return nil
    }

    /// The request as the routes see it: header names in lower case, repeated fields joined.
    static func request(_ head: HTTPRequestHead, body: [UInt8]) -> HTTPRequest {
        var headers: [String: String] = [:]
        for (name, value) in head.headers {
            let key = name.lowercased()
            headers[key] = headers[key].map { $0 + ", " + value } ?? value
        }
        let (path, query) = RequestTarget.split(head.uri)
        return HTTPRequest(method: head.method.rawValue, path: path, query: RequestTarget.query(query), headers: headers, body: body)
    }

    // MARK: Answers

    private func responseHead(_ response: HTTPResponse, streamed: Bool) -> HTTPResponseHead {
        let staying = keepAlive && !streamed && !(inputClosed && queued.isEmpty)
        let headers = HTTPHeaders(response.headerFields(streamed: streamed, keepAlive: staying))
        let status = HTTPResponseStatus.custom(code: UInt(clamping: response.status), reasonPhrase: HTTPResponse.reason(response.status))
        return HTTPResponseHead(version: .http1_1, status: status, headers: headers)
    }

    /// Answers the request being served (or a bad one), then reads the next or closes.
    func respond(_ response: HTTPResponse, _ context: ChannelHandlerContext) {
        guard state != .closed, state != .streaming else { return }
        upstream = nil
        let head = responseHead(response, streamed: false)
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        if !response.body.isEmpty {
            context.write(wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(bytes: response.body)))), promise: nil)
        }
        guard keepAlive, !(inputClosed && queued.isEmpty) else {
            state = .closed
            disarm()
            let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
            context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in bound.value.close(promise: nil) }
            return
        }
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        answered += 1
        state = .awaitingHead
        headLimit.nextRequest()
        awaitHead(context)
        // Requests that arrived meanwhile, in order, until one needs an answer again.
        while state == .awaitingHead || state == .receivingBody, !queued.isEmpty {
            take(queued.removeFirst(), context)
        }
        if state == .awaitingHead || state == .receivingBody { context.read() }
    }

    /// A bad request: answered, and the connection closed (what follows it cannot be trusted).
    private func fail(_ context: ChannelHandlerContext, _ response: HTTPResponse) {
        keepAlive = false
        state = .answering
        respond(response, context)
    }

    /// The start of a streamed answer (the event stream); the connection closes when it ends.
    func beginStream(_ response: HTTPResponse, _ context: ChannelHandlerContext) {
        guard state == .answering else { return }
        keepAlive = false
        state = .streaming
        context.writeAndFlush(wrapOutboundOut(.head(responseHead(response, streamed: true))), promise: nil)
        // Reading on: end of file is how a streaming client says it has gone.
        context.read()
    }

    func streamChunk(_ bytes: [UInt8], _ context: ChannelHandlerContext) {
        guard state == .streaming, !bytes.isEmpty else { return }
        context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(bytes: bytes)))), promise: nil)
        // A client that does not read holds the daemon's side back, not the front's memory.
        if !context.channel.isWritable { upstream?.setOption(ChannelOptions.autoRead, value: false).whenFailure { _ in } }
    }

    func endStream(_ context: ChannelHandlerContext) {
        guard state == .streaming else { return }
        state = .closed
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in bound.value.close(promise: nil) }
    }

    /// The daemon gave no (whole) answer.
    func upstreamFailed(_ context: ChannelHandlerContext) {
        switch state {
        case .answering:
            keepAlive = false
            respond(ControlAPI.failure(502, 502, "DaemonError", "the daemon gave no answer"), context)
        case .streaming: close(context)
        default: break
        }
    }

    private func close(_ context: ChannelHandlerContext) {
        guard state != .closed else { return }
        state = .closed
        disarm()
        context.close(promise: nil)
    }

    // MARK: Events

    func channelReadComplete(context: ChannelHandlerContext) {
        switch state {
        case .awaitingHead, .receivingBody, .streaming: context.read()
        case .answering, .closed: break
        }
        context.fireChannelReadComplete()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { upstream?.setOption(ChannelOptions.autoRead, value: true).whenFailure { _ in } }
        context.fireChannelWritabilityChanged()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard case ChannelEvent.inputClosed = event else { return context.fireUserInboundEventTriggered(event) }
        inputClosed = true
        switch state {
        case .awaitingHead where queued.isEmpty, .streaming: close(context)
        case .receivingBody: fail(context, ControlAPI.failure(400, 400, "BadRequest", "connection closed inside the body"))
        default: break // the answer is written, then the connection closes
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        switch state {
        case .awaitingHead, .receivingBody:
            if let parse = error as? HTTPParserError {
                if parse == .headerOverflow {
                    fail(context, ControlAPI.failure(431, 431, "HeadersTooLarge",
                                                     "request head over \(ControlLimits.maxHeaderBytes) bytes or \(ControlLimits.maxHeaders) fields"))
                } else {
                    fail(context, ControlAPI.failure(400, 400, "BadRequest", "malformed HTTP request (\(parse))"))
                }
            } else {
                close(context)
            }
        case .answering:
            // Garbage after a good request: that one is still answered, then the connection closes.
            keepAlive = false
            queued.removeAll()
        case .streaming, .closed: break
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        state = .closed
        disarm()
        upstream?.close(promise: nil)
        upstream = nil
        context.fireChannelInactive()
    }

    #if DEBUG
    private static func trapForTests(_ index: Int) {
        let nothing: [UInt8] = []
        writeStandardError("custodyd: control front: trapping on request (test builds only)\n")
        _ = nothing[index]
    }
    #endif
}
