//! The `serve` and `certs` commands as processes: start-up errors, SIGTERM, and the certificates
//! `certs` writes being served by `serve`.

mod process_support;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use process_support::{KillOnDrop as Serve, free_port, wait_ready};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-deploy-guard");

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/reviews/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// Runs `certs` into `out` (for localhost and 127.0.0.1), checks what it printed and wrote, and
/// returns the CA certificate.
fn write_certs(out: &std::path::Path) -> String {
    let o = run(&[
        "certs",
        "--out",
        out.to_str().unwrap(),
        "--dns",
        "localhost",
        "--ip",
        "127.0.0.1",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let ca = std::fs::read_to_string(out.join("ca.crt")).unwrap();
    let printed = String::from_utf8(o.stdout).unwrap();
    use base64::Engine as _;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(printed.trim())
        .unwrap();
    assert_eq!(
        decoded,
        ca.as_bytes(),
        "stdout is the base64 caBundle of ca.crt"
    );
    let mode = std::fs::metadata(out.join("tls.key"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);

    // A second run refuses to overwrite, naming the file.
    let o = run(&[
        "certs",
        "--out",
        out.to_str().unwrap(),
        "--dns",
        "localhost",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("ca.crt"), "{}", stderr(&o));
    ca
}

/// Sends SIGTERM to `serve` and waits (at most 20 s) for it to exit.
async fn sigterm_and_wait(serve: &mut Serve) -> std::process::ExitStatus {
    let pid = serve.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = serve.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "serve did not exit after SIGTERM"
        );
        // Yield to the runtime: the client's HTTP/2 connection must answer the server's
        // GOAWAY ping for the drain to end early.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn certs_written_by_certs_are_served_and_sigterm_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tls");
    let ca = write_certs(&out);

    let (port, admin) = (free_port(), free_port());
    let child = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-listen",
            &format!("127.0.0.1:{admin}"),
            "--tls-cert",
            out.join("tls.crt").to_str().unwrap(),
            "--tls-key",
            out.join("tls.key").to_str().unwrap(),
            "--shutdown-delay",
            "0s",
            "--no-cluster-watch",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut serve = Serve(child);
    wait_ready(admin, &mut serve.0).await;

    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
        .build()
        .unwrap();
    let resp = client
        .post(format!("https://localhost:{port}/validate"))
        .header("content-type", "application/json")
        .body(fixture("lab-node-2-device-plugin-only.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["response"]["allowed"], false);

    let stopping = Instant::now();
    let status = sigterm_and_wait(&mut serve).await;
    assert_eq!(status.code(), Some(0));
    // The client's idle keep-alive connection must not hold the drain open.
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "{:?}",
        stopping.elapsed()
    );
    drop(client);
    let log: Vec<String> = BufReader::new(serve.0.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .collect();
    assert!(log.iter().any(|l| l.contains("denied")), "{log:?}");
}

#[test]
fn serve_refuses_to_start_on_bad_files_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let bad_cfg = dir.path().join("config.yaml");
    std::fs::write(&bad_cfg, "rules:\n  device-plugin-without-tookit: warn\n").unwrap();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let port = free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let admin = format!("127.0.0.1:{}", free_port());
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["--config", bad_cfg.to_str().unwrap()],
            "unknown rule \"device-plugin-without-tookit\"".to_owned(),
        ),
        (
            vec![
                "--tls-cert",
                "/nonexistent/tls.crt",
                "--tls-key",
                "/nonexistent/tls.key",
            ],
            "/nonexistent/tls.crt".to_owned(),
        ),
        (
            vec![
                "--tls-cert",
                garbage.to_str().unwrap(),
                "--tls-key",
                garbage.to_str().unwrap(),
            ],
            garbage.display().to_string(),
        ),
        (vec!["--tls-cert", "/x/tls.crt"], "--tls-key".to_owned()),
        (
            vec!["--header-timeout", "soon"],
            "not a duration".to_owned(),
        ),
    ];
    for (extra, needle) in cases {
        let mut args = vec![
            "serve",
            "--no-cluster-watch",
            "--listen",
            &listen,
            "--admin-listen",
            &admin,
        ];
        args.extend(extra.iter());
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(&needle), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn certs_needs_a_name() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(&["certs", "--out", dir.path().join("x").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--dns NAME or --ip IP"),
        "{}",
        stderr(&o)
    );
}
