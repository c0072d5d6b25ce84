//! Shared by the tests that run the binary as a process: a free port, a child process that
//! is killed when the test ends, passed or failed, and the wait for `serve` to be ready.
#![allow(dead_code)] // each test binary uses a different subset

use std::net::TcpListener;
use std::process::Child;
use std::time::{Duration, Instant};

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

/// Waits (up to 45 s) until the `serve` in `child` answers 200 on its admin port's /readyz;
/// panics if it exits first. A kind RBAC forbids holds readiness back until the watch's 30 s
/// sync timeout.
pub async fn wait_ready(admin: u16, child: &mut Child) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        if let Ok(r) = client
            .get(format!("http://127.0.0.1:{admin}/readyz"))
            .send()
            .await
            && r.status() == 200
        {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("serve exited before it was ready: {status}");
        }
        assert!(Instant::now() < deadline, "serve not ready after 45 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
