/// The known name a misspelt one most resembles, for errors that name both ("unknown field
/// saveToLocation (did you mean saveToLocations?)"): request bodies and the configuration file.
public enum Spelling {
    /// The closest of `candidates` to `name`: case-insensitive edit distance at most a third of its
    /// length (and at least 1); nil when none is that close.
    public static func closest(to name: String, in candidates: some Sequence<String>) -> String? {
        let limit = max(1, name.count / 3), folded = name.lowercased()
        let scored = candidates.map { ($0, distance(folded, $0.lowercased())) }.filter { $0.1 <= limit }
        return scored.min { $0.1 < $1.1 || ($0.1 == $1.1 && $0.0 < $1.0) }?.0
    }

    /// Edit distance by characters, a swap of two neighbours counting as one edit (optimal string
    /// alignment): "nmae" is one edit from "name".
    static func distance(_ a: String, _ b: String) -> Int {
        let a = Array(a), b = Array(b)
        guard !a.isEmpty else { return b.count }
        var before = [Int](repeating: 0, count: b.count + 1), previous = Array(0...b.count)
        for i in 1...a.count {
            var current = [i] + [Int](repeating: 0, count: b.count)
            for j in stride(from: 1, through: b.count, by: 1) {
                let cost = a[i - 1] == b[j - 1] ? 0 : 1
                current[j] = Swift.min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
                if i > 1, j > 1, a[i - 1] == b[j - 2], a[i - 2] == b[j - 1] { current[j] = Swift.min(current[j], before[j - 2] + 1) }
            }
            (before, previous) = (previous, current)
        }
        return previous[b.count]
    }
}
