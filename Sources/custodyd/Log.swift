enum CustodyVersion {
    static let string = "0.3.0"
}
