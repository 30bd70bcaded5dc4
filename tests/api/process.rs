//! The service as a real process, so that it can receive signals.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::helpers::ADMIN;

/// A running `proxy-allocator` process; dropping it kills it.
pub struct ServiceProcess {
    child: Option<Child>,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// Every line the service wrote to standard output so far.
    lines: Arc<Mutex<Vec<String>>>,
}

/// The service binary with `env` on top of a clean test environment, its standard output
/// piped; run by the command `wrapper` when it is not empty.
fn command(wrapper: &[&str], env: &[(&str, String)]) -> Command {
    let binary = env!("CARGO_BIN_EXE_proxy-allocator");
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut cmd = Command::new(program);
            cmd.args(args).arg(binary);
            cmd
        }
        None => Command::new(binary),
    };
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("LISTEN_ADDR", "127.0.0.1:0")
        .env("ADMIN_TOKEN", ADMIN)
        .env("LOG_FORMAT", "json")
        .env("RUST_LOG", "warn,proxy_allocator::startup=info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (key, value) in env {
        cmd.env(key, value);
    }
    cmd
}

/// Runs the binary with `env` until it exits by itself (within 10 s, or it is killed):
/// its exit code and every line it wrote. For starts that must fail.
pub fn run_to_exit(env: &[(&str, String)]) -> (Option<i32>, Vec<String>) {
    let mut child = command(&[], env)
        .spawn()
        .expect("the service binary starts");
    let stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    let started = Instant::now();
    let code = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status.code();
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        code,
        reader.join().expect("the reader ends with the process"),
    )
}

impl ServiceProcess {
    /// Starts the binary on a free port with `env` on top of a clean test environment.
    pub fn start(env: &[(&str, String)]) -> Self {
        Self::start_via(&[], env)
    }

    /// Starts the binary as [`ServiceProcess::start`] does, run by the command `wrapper`
    /// (`prlimit --nofile=...`, to start it with other limits) when it is not empty.
    pub fn start_via(wrapper: &[&str], env: &[(&str, String)]) -> Self {
        Self::spawned(command(wrapper, env))
    }

    /// [`ServiceProcess::start`] in the working directory `dir`, where relative paths of
    /// its settings lead.
    pub fn start_in(dir: &std::path::Path, env: &[(&str, String)]) -> Self {
        let mut cmd = command(&[], env);
        cmd.current_dir(dir);
        Self::spawned(cmd)
    }

    fn spawned(mut cmd: Command) -> Self {
        let mut child = cmd.spawn().expect("the service binary starts");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&lines);
        // Read the bound address from the "listening" line, then keep draining the pipe so
        // that logging never blocks the service.
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                kept.lock().expect("lines").push(line.clone());
                if !sent && line.contains("\"listening\"") {
                    let value: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                    if let Some(addr) = value["addr"].as_str() {
                        let _ = tx.send(addr.to_owned());
                        sent = true;
                    }
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the service logs its address within 10 s");
        Self {
            child: Some(child),
            base: format!("http://{addr}"),
            lines,
        }
    }

    /// The lines written so far that contain `needle`, once at least `count` of them have
    /// arrived (the service flushes its log at least every 100 ms) or 5 s have passed.
    pub fn wait_lines(&self, needle: &str, count: usize) -> Vec<String> {
        let started = Instant::now();
        loop {
            let found: Vec<String> = self
                .lines
                .lock()
                .expect("lines")
                .iter()
                .filter(|line| line.contains(needle))
                .cloned()
                .collect();
            if found.len() >= count || started.elapsed() > Duration::from_secs(5) {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every line written so far.
    pub fn all_lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        if let Some(child) = &self.child {
            let status = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()
                .expect("kill runs");
            assert!(status.success());
        }
    }

    /// Kills the process with SIGKILL, as a crash would, and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits for the process to exit, at most `limit`; returns how long it took.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<Duration> {
        let started = Instant::now();
        let child = self.child.as_mut()?;
        while started.elapsed() < limit {
            if let Ok(Some(_)) = child.try_wait() {
                self.child = None;
                return Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
