import CLinux
import CustodySystem
import Glibc
import NIOCore
import NIOPosix

/// One frame of `Forwarding.swift`'s protocol, as the front's event loop reads it.
struct Frame {
    var kind: FrameKind
    var payload: [UInt8]
}

/// Frames out of the bytes of a request's pair; a frame of an unknown kind or over the limit is
/// an error (the relay then closes both sides).
struct FrameDecoder: ByteToMessageDecoder {
    typealias InboundOut = Frame
    let maxPayload: Int

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        guard let byte = buffer.getInteger(at: buffer.readerIndex, as: UInt8.self),
              let length = buffer.getInteger(at: buffer.readerIndex + 1, endianness: .little, as: UInt32.self) else { return .needMoreData }
        let kind = try FrameKind.checked(byte, length: Int(length), maxPayload: maxPayload)
        guard buffer.readableBytes >= 5 + Int(length) else { return .needMoreData }
        buffer.moveReaderIndex(forwardBy: 5)
        guard let payload = buffer.readBytes(length: Int(length)) else { return .needMoreData }
        context.fireChannelRead(wrapInboundOut(Frame(kind: kind, payload: payload)))
        return .continue
    }
}

/// The front's end of one request's pair: sends the request frame, then turns the daemon's
/// answer frames into the client connection's answer.
final class AnswerRelay: ChannelInboundHandler {
    typealias InboundIn = Frame
    typealias OutboundOut = ByteBuffer

    private enum Phase { case awaitingAnswer, streaming, done }
    private var phase = Phase.awaitingAnswer
    private let client: NIOLoopBound<(FrontConnection, ChannelHandlerContext)>
    private let request: [UInt8]

    init(client: NIOLoopBound<(FrontConnection, ChannelHandlerContext)>, request: [UInt8]) {
        self.client = client
        self.request = request
    }

    func channelActive(context: ChannelHandlerContext) {
        context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(bytes: request)), promise: nil)
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        let (connection, clientContext) = client.value
        switch (phase, frame.kind) {
        case (.awaitingAnswer, .response):
            phase = .done
            if let response = try? HTTPResponse(forwarded: frame.payload, streamed: false) {
                connection.respond(response, clientContext)
            } else {
                connection.upstreamFailed(clientContext)
            }
            context.close(promise: nil)
        case (.awaitingAnswer, .streamHead):
            guard let response = try? HTTPResponse(forwarded: frame.payload, streamed: true) else { return fail(context) }
            phase = .streaming
            connection.beginStream(response, clientContext)
        case (.streaming, .chunk):
            connection.streamChunk(frame.payload, clientContext)
        case (.streaming, .end):
            phase = .done
            connection.endStream(clientContext)
            context.close(promise: nil)
        default:
            fail(context)
        }
    }

    private func fail(_ context: ChannelHandlerContext) {
        guard phase != .done else { return }
        phase = .done
        let (connection, clientContext) = client.value
        connection.upstreamFailed(clientContext)
        context.close(promise: nil)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) { fail(context) }

    func channelInactive(context: ChannelHandlerContext) {
        fail(context)
        context.fireChannelInactive()
    }
}

/// Hands each checked request to the daemon: a fresh socket pair per request, the client's
/// connection and the pair's other end passed over the channel (SCM_RIGHTS), so the daemon reads
/// the caller's credentials from the kernel; then `AnswerRelay` on the front's end.
struct DaemonForwarder: RequestForwarder {
    /// The front's end of the channel to the daemon (non-blocking).
    let channel: Int32
    /// The client's connection, as the event loop's channel holds it (valid while it is open).
    let connection: Int32

    /// The largest answer frame relayed (a listing of many files is the largest answer).
    static let maxAnswerBytes = 256 * 1024 * 1024

    func forward(_ request: HTTPRequest, for front: FrontConnection, context: ChannelHandlerContext) {
        guard context.channel.isActive else { return }
        var pair: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
            return front.respond(ControlAPI.failure(503, 503, "ServiceBusy", "cannot reach the daemon (\(Errno.current)); try again"), context)
        }
        let (ours, theirs) = (pair[0], pair[1])
        let handed = [connection, theirs].withUnsafeBufferPointer { clinux_send_descriptors(channel, $0.baseAddress, 2) }
        let error = errno
        Glibc.close(theirs)
        guard handed == 0 else {
            Glibc.close(ours)
            if error == EAGAIN || error == EWOULDBLOCK {
                return front.respond(ControlAPI.failure(503, 503, "ServiceBusy", "the daemon is busy; try again"), context)
            }
            // The daemon's end is gone: it is stopping (or died; then so do we, by PR_SET_PDEATHSIG).
            front.respond(ControlAPI.failure(503, 503, "ServiceBusy", "the daemon is stopping"), context)
            context.eventLoop.scheduleTask(in: .milliseconds(50)) { exit(0) }
            return
        }
        let client = NIOLoopBound((front, context), eventLoop: context.eventLoop)
        let frame = FrameChannel.frame(.request, request.forwardedPayload())
        ClientBootstrap(group: context.eventLoop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder(maxPayload: Self.maxAnswerBytes)))
                    try channel.pipeline.syncOperations.addHandler(AnswerRelay(client: client, request: frame))
                }
            }
            .withConnectedSocket(ours)
            .whenComplete { result in
                let (front, context) = client.value
                switch result {
                case .success(let upstream):
                    if context.channel.isActive { front.upstream = upstream } else { upstream.close(promise: nil) }
                case .failure:
                    front.upstreamFailed(context)
                }
            }
    }
}
