/// A count of bytes as people read it: `512 B`, `1.5 KiB`, `20.0 MiB` (binary units, one decimal,
/// rounded down), as custodyctl prints sizes.
public func humanBytes(_ count: UInt64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"]
    var value = Double(count)
    var unit = 0
    while value >= 1024, unit < units.count - 1 {
        value /= 1024
        unit += 1
    }
    guard unit > 0 else { return "\(count) B" }
    let tenths = Int(value * 10)
    return "\(tenths / 10).\(tenths % 10) \(units[unit])"
}
