//! `rediss://` URLs pass through: the service reaches a Redis that only speaks TLS, and
//! verifies its certificate unless the URL says otherwise.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{TestApp, test_config};

/// A redis-server listening with TLS only, with a self-signed certificate made for the test.
struct TlsRedis {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl TlsRedis {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("pa-tls-redis-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let made = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args([
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ])
            .arg("-keyout")
            .arg(dir.join("key.pem"))
            .arg("-out")
            .arg(dir.join("cert.pem"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl runs (apt-get install openssl)");
        assert!(made.success(), "openssl made a certificate");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let file = |name: &str| dir.join(name).to_string_lossy().into_owned();
        let child = Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .args([
                "--tls-cert-file",
                &file("cert.pem"),
                "--tls-key-file",
                &file("key.pem"),
            ])
            .args([
                "--tls-ca-cert-file",
                &file("cert.pem"),
                "--tls-auth-clients",
                "no",
            ])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        wait_for_port(port, &dir);
        Self { port, dir, child }
    }
}

fn wait_for_port(port: u16, dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "TLS Redis in {} never listened",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rediss_url_reaches_a_tls_only_redis() {
    let redis = TlsRedis::start();
    // `#insecure` is redis-rs's way to accept a certificate no authority signed.
    let url = format!("rediss://127.0.0.1:{}/#insecure", redis.port);
    let app = TestApp::spawn_with(test_config(Some(url))).await;
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a", "b"], Some(0)).await;
    assert_eq!(app.assigned("p").await, ("a".to_owned(), 1));
    assert_eq!(app.assigned("p").await, ("b".to_owned(), 1));
    let (status, body) = app.probe("/readyz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["store"], json!("redis"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rediss_url_checks_the_certificate_by_default() {
    let redis = TlsRedis::start();
    let mut config = test_config(Some(format!("rediss://127.0.0.1:{}/", redis.port)));
    config.store_timeout_ms = 2_000;
    let app = TestApp::spawn_with(config).await;
    // The self-signed certificate is trusted by nobody: the store is unreachable, not
    // silently used without verification.
    let (status, body) = app.probe("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], json!("store_unavailable"));
}
