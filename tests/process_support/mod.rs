//! Shared by the tests that run the binary as a process: a free port, and a child process that
//! is killed when the test ends, passed or failed.
#![allow(dead_code)] // each test binary uses a different subset

use std::net::TcpListener;
use std::process::Child;

/// A port nothing listens on at the moment (the OS's choice for an ephemeral bind).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed (and reaped) when dropped.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
