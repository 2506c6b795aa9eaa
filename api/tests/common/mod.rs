//! Shared by the CLI tests: a loopback stand-in for a destination.

use std::io::Read;
use std::net::TcpListener;

/// A loopback server answering 200 "ok" to up to `max` connections; returns its port.
pub fn ok_sink(max: usize) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().take(max).flatten() {
            let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(2)));
            let mut buf = [0u8; 65536];
            let _ = c.read(&mut buf);
            let _ = std::io::Write::write_all(
                &mut c,
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
            );
        }
    });
    port
}
