//! Free loopback ports for the test kits' real servers (Redis, NATS).

/// A loopback port nobody listens on right now.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Runs `start` on a free loopback port, and on another while the port turns out taken
/// (`start` says so with an `AddrInUse` error): between asking for a free port and a server
/// binding it, another test's listener or outgoing connection may take it.
pub fn on_free_port<T>(
    mut start: impl FnMut(u16) -> std::io::Result<T>,
) -> std::io::Result<(T, u16)> {
    let mut attempts = 0;
    loop {
        let port = free_port()?;
        match start(port) {
            Ok(started) => return Ok((started, port)),
            Err(error) if error.kind() == std::io::ErrorKind::AddrInUse && attempts < 8 => {
                attempts += 1;
            }
            Err(error) => return Err(error),
        }
    }
}
