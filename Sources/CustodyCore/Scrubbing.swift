import CustodyCrypto
import CustodySystem
import Synchronization

/// Takes identities and configured values out of text the daemon writes where others may read
/// it: its log, its journal entries, support bundles. Each is replaced by `[scrubbed:xxxxxxxx]`,
/// a hash keyed per daemon run (the same value gives the same token, whatever its case), so the
/// lines about one identity can be matched without naming it.
///
/// Identities are scrubbed unless the administrator turns it off (`ScrubAccountIdentities =
/// false`): every word shaped like a UPN (`name@domain`), whether the daemon knows it or not (a
/// refused enrolment, an unmanaged owner), and every identity the daemon has seen (accounts,
/// default identities, allowed accounts, and whatever an event names), also where it is not
/// shaped like a UPN (an object ID). An identity of fewer than three characters is scrubbed only
/// where it is a whole field (`scrubIdentity`). Configured values (`ValuesToScrubFromLogging`)
/// are replaced wherever they occur, in every mode.
public final class Scrubber: Sendable {
    private struct Rules {
        var values: [String] = []
        var scrubsIdentities = true
        /// Known identities without a separator in them, lowercased: looked up word by word.
        var words = Set<[UInt8]>()
        /// Known identities with separators (spaces, slashes): replaced as substrings.
        var phrases: [String] = []
    }

    private let rules = Mutex(Rules())
    private let salt: [UInt8] = (0..<16).map { _ in UInt8.random(in: 0...255) }

    public init() {}

    /// Whether identities are scrubbed (the default).
    public var scrubsIdentities: Bool { rules.withLock { $0.scrubsIdentities } }

    /// The configured values to replace everywhere, and whether identities are scrubbed.
    public func configure(values: [String], scrubsIdentities: Bool) {
        let cleaned = Set(values.map { $0.trimmingWhitespace() }.filter { $0.utf8.count >= 3 })
        rules.withLock { rules in
            rules.values = cleaned.sorted { $0.utf8.count > $1.utf8.count }
            rules.scrubsIdentities = scrubsIdentities
        }
    }

    /// Identities seen: from now on they are scrubbed wherever they occur.
    public func note(_ identities: [String]) {
        let fresh = identities.map { $0.trimmingWhitespace() }.filter { $0.utf8.count >= 3 }
        guard !fresh.isEmpty else { return }
        rules.withLock { rules in
            for identity in fresh {
                let lowered = Self.lowercased(Array(identity.utf8))
                if lowered.contains(where: Self.isSeparator) {
                    if !rules.phrases.contains(where: { $0.lowercased() == identity.lowercased() }) {
                        rules.phrases.append(identity)
                        rules.phrases.sort { $0.utf8.count > $1.utf8.count }
                    }
                } else {
                    rules.words.insert(lowered)
                }
            }
        }
    }

    /// The token that stands for `value`.
    public func token(for value: String) -> String {
        let digest = (salt + Self.lowercased(Array(value.utf8))).withUnsafeBytes { sha256($0) }
        return "[scrubbed:\(hexString(digest.prefix(4)))]"
    }

    /// An identity given as a whole field (a journal entry's `CUSTODY_IDENTITY`): its token
    /// whenever identities are scrubbed, whatever its length.
    public func scrubIdentity(_ identity: String) -> String {
        scrubsIdentities ? token(for: identity.trimmingWhitespace()) : scrub(identity)
    }

    /// `text` without the configured values and (unless turned off) identities.
    public func scrub(_ text: String) -> String {
        let rules = self.rules.withLock { $0 }
        var result = text
        for value in rules.values { result = result.replacingCaseInsensitive(value, with: token(for: value)) }
        guard rules.scrubsIdentities else { return result }
        for phrase in rules.phrases { result = result.replacingCaseInsensitive(phrase, with: token(for: phrase)) }
        return scrubWords(result, known: rules.words)
    }

    /// Replaces each word that is UPN-shaped or a known identity. A word is a run of bytes
    /// without separators; its trailing dots (a sentence's end) stay outside it, and a known
    /// identity is also found before a suffix (`alice-oid.json`).
    private func scrubWords(_ text: String, known: Set<[UInt8]>) -> String {
        let bytes = Array(text.utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var changed = false
        var index = 0
        while index < bytes.count {
            guard !Self.isSeparator(bytes[index]) else {
                out.append(bytes[index])
                index += 1
                continue
            }
            var end = index
            while end < bytes.count, !Self.isSeparator(bytes[end]) { end += 1 }
            var wordEnd = end
            while wordEnd > index, bytes[wordEnd - 1] == UInt8(ascii: ".") { wordEnd -= 1 }
            let word = Array(bytes[index..<wordEnd])
            if let length = identityLength(word, known: known) {
                out += Array(token(for: String(decoding: word[..<length], as: UTF8.self)).utf8)
                out += bytes[(index + length)..<end]
                changed = true
            } else {
                out += bytes[index..<end]
            }
            index = end
        }
        return changed ? String(decoding: out, as: UTF8.self) : text
    }

    /// How much of `word`, from its start, is an identity: all of a UPN-shaped word, a known
    /// identity, or a known identity before a `.suffix`; nil when none.
    private func identityLength(_ word: [UInt8], known: Set<[UInt8]>) -> Int? {
        guard word.count >= 3 else { return nil }
        if let at = word.firstIndex(of: UInt8(ascii: "@")), at > 0, at < word.count - 1 { return word.count }
        guard !known.isEmpty else { return nil }
        var length = word.count
        while length >= 3 {
            if known.contains(Self.lowercased(Array(word[..<length]))) { return length }
            guard let dot = word[..<length].lastIndex(of: UInt8(ascii: ".")) else { return nil }
            length = dot
        }
        return nil
    }

    /// Bytes that end a word: ASCII whitespace, controls and punctuation that does not occur in
    /// UPNs or object IDs (they hold letters, digits, `.`, `-`, `_`, `@`, `+`, `%`, `!`, `#`,
    /// `$`, `&`, `*`, `~`, `^`, and any non-ASCII character).
    static func isSeparator(_ byte: UInt8) -> Bool {
        if byte < 0x21 || byte == 0x7F { return true }
        return "\"'`()[]{}<>,;:=/\\|?".utf8.contains(byte)
    }

    static func lowercased(_ bytes: [UInt8]) -> [UInt8] {
        bytes.map { $0 >= 65 && $0 <= 90 ? $0 + 32 : $0 }
    }
}

extension String {
    /// Replaces every occurrence of `target`, compared without case (ASCII), with `replacement`.
    public func replacingCaseInsensitive(_ target: String, with replacement: String) -> String {
        let haystack = Array(utf8), needle = Scrubber.lowercased(Array(target.utf8))
        guard !needle.isEmpty, haystack.count >= needle.count else { return self }
        func lower(_ byte: UInt8) -> UInt8 { byte >= 65 && byte <= 90 ? byte + 32 : byte }
        var out: [UInt8] = []
        var index = 0
        var changed = false
        while index < haystack.count {
            if index + needle.count <= haystack.count, lower(haystack[index]) == needle[0],
               needle.indices.allSatisfy({ lower(haystack[index + $0]) == needle[$0] }) {
                out += Array(replacement.utf8)
                index += needle.count
                changed = true
            } else {
                out.append(haystack[index])
                index += 1
            }
        }
        return changed ? String(decoding: out, as: UTF8.self) : self
    }
}
