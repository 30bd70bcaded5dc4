//! `redis-server` processes started by tests on free loopback ports. Only the standard
//! library is used, so that the store's own unit tests (`src/store/redis/tests.rs`) start
//! their Redis with this same file.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` process owned by a test (or by the whole test binary).
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    aof: bool,
    /// A configuration file read before the arguments (Sentinel keeps its state in one).
    config_file: Option<PathBuf>,
    /// Arguments after the common ones: cluster mode, replication, Sentinel mode.
    extra: Vec<String>,
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn redis_server_missing() -> ! {
    panic!(
        "redis-server was not found on PATH. The Redis tests need it: install it with \
         `apt-get install redis-server` (Debian/Ubuntu) or `brew install redis`, or point \
         TEST_REDIS_URL at a Redis the tests may write to."
    )
}

impl RedisServer {
    /// Starts a throw-away Redis that keeps nothing on disk.
    pub fn start() -> Self {
        Self::launch(false)
    }

    /// Starts a Redis with an append-only file (fsync on every write), so that a restart
    /// after SIGKILL finds its data again.
    pub fn start_with_aof() -> Self {
        Self::launch(true)
    }

    /// Starts a throw-away Redis with more arguments (`--cluster-enabled yes`,
    /// `--replicaof 127.0.0.1 <port>`, ...). Relative file names land in its own directory.
    pub fn start_with(extra: &[String]) -> Self {
        Self::prepare(false, extra.to_vec()).started()
    }

    /// Starts a Sentinel that monitors the primary on `primary_port` as `master`, with a
    /// quorum of one, declares it down after `down_after_ms` and gives a failover
    /// `failover_timeout_ms`.
    pub fn start_sentinel(
        master: &str,
        primary_port: u16,
        down_after_ms: u64,
        failover_timeout_ms: u64,
    ) -> Self {
        let mut sentinel = Self::prepare(false, vec!["--sentinel".to_owned()]);
        let file = sentinel.dir.join("sentinel.conf");
        let config = format!(
            "sentinel monitor {master} 127.0.0.1 {primary_port} 1\n\
             sentinel down-after-milliseconds {master} {down_after_ms}\n\
             sentinel failover-timeout {master} {failover_timeout_ms}\n"
        );
        std::fs::write(&file, config).expect("a Sentinel configuration file");
        sentinel.config_file = Some(file);
        sentinel.started()
    }

    fn launch(aof: bool) -> Self {
        Self::prepare(aof, Vec::new()).started()
    }

    fn prepare(aof: bool, extra: Vec<String>) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("pa-test-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        Self {
            port,
            dir,
            child: None,
            aof,
            config_file: None,
            extra,
        }
    }

    fn started(mut self) -> Self {
        self.restart();
        self
    }

    /// (Re)starts the process on the same port and directory.
    pub fn restart(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.args(&self.config_file);
        cmd.args([
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--dir".as_ref(), self.dir.as_os_str()])
        .args(["--appendonly", if self.aof { "yes" } else { "no" }])
        .args(["--appendfsync", "always"])
        .args(&self.extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => redis_server_missing(),
            Err(e) => panic!("cannot start redis-server: {e}"),
        };
        self.child = Some(child);
        wait_for_redis(self.port);
    }

    /// Kills the process with SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The URL to give the service.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait_for_redis(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
            let mut buf = [0u8; 16];
            if stream.write_all(b"PING\r\n").is_ok()
                && stream
                    .read(&mut buf)
                    .is_ok_and(|n| buf[..n].starts_with(b"+PONG"))
            {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("redis-server on port {port} did not answer PING within 10 s");
}
