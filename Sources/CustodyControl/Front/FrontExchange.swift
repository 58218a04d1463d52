import NIOCore
import NIOEmbedded

/// The front's HTTP pipeline without a socket or a daemon: bytes in, the bytes it would send
/// out, with checked requests answered by `answer`. For the fuzzer and the tests; the same
/// handlers the front runs (`FrontPipeline`).
enum FrontExchange {
    struct InPlace: RequestForwarder {
        let answer: (HTTPRequest) -> HTTPResponse
        func forward(_ request: HTTPRequest, for connection: FrontConnection, context: ChannelHandlerContext) {
            connection.respond(answer(request), context)
        }
    }

    /// Sends `bytes` (in pieces of `pieceSize`, then end of input unless `keepOpen`) and returns
    /// what the front wrote back.
    static func run(_ bytes: [UInt8], pieceSize: Int = 4096, keepOpen: Bool = false,
                    answer: @escaping (HTTPRequest) -> HTTPResponse) -> [UInt8] {
        let channel = EmbeddedChannel()
        defer { _ = try? channel.finish(acceptAlreadyClosed: true) }
        guard (try? channel.pipeline.syncOperations.addHandlers(FrontPipeline.handlers(InPlace(answer: answer)))) != nil else { return [] }
        // Connecting an embedded channel makes it active (and fires channelActive).
        guard let address = try? SocketAddress(unixDomainSocketPath: "/"), (try? channel.connect(to: address).wait()) != nil else { return [] }
        var output: [UInt8] = []
        func drain() {
            while let data = try? channel.readOutbound(as: IOData.self) {
                if case .byteBuffer(let buffer) = data { output += buffer.readableBytesView }
            }
        }
        var offset = 0
        while offset < bytes.count, channel.isActive {
            let end = min(bytes.count, offset + max(1, pieceSize))
            _ = try? channel.writeInbound(channel.allocator.buffer(bytes: bytes[offset..<end]))
            offset = end
            drain()
        }
        if !keepOpen, channel.isActive { channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed) }
        drain()
        return output
    }
}
