//! The gateway benchmark's load generator and the local servers it measures through
//! (bench/gateway.sh runs it; it is not part of the service's build).
//!
//! ```text
//! tunnels serve [--target ADDR] [--upstreams ADDR,ADDR]
//! tunnels rate  --via ADDR[,ADDR] --to ADDR [--socks] [--concurrency 64] [--duration 5] [--count N]
//! tunnels bytes --via ADDR --to ADDR [--socks] [--bytes N]
//! tunnels hold  --via ADDR --to ADDR [--socks] --count N --pid PID
//! ```
//!
//! - `serve` runs plain HTTP `CONNECT` proxies (the upstream members every peer rotates
//!   over) and the target behind them. The target speaks plain HTTP, not TLS: a proxy only
//!   relays a tunnel's bytes, so TLS inside would cost every peer the same and spend the
//!   two cores on handshakes at the client and the target instead of on the proxy measured.
//!   `GET /` answers `ok` and closes, `GET /bytes/N` streams N bytes, `GET /hold` answers a
//!   head and keeps the connection until the client closes it.
//! - `rate` opens tunnels through `--via` (several are taken in turn), each with `CONCURRENCY`
//!   clients for `DURATION` seconds: connect, `CONNECT` (or the SOCKS5 handshake), one
//!   `GET /`, read to the end, close. It prints the tunnels per second and the setup latency
//!   (connect to the proxy's success reply) at p50 and p99. With `--count`, exactly that
//!   many tunnels are opened (then `--duration` is only an upper bound): a fixed amount of
//!   work, for counting instructions or system calls per tunnel in the proxy measured.
//! - `bytes` streams `BYTES` bytes over one tunnel and prints bytes per second.
//! - `hold` opens `COUNT` tunnels, keeps them open with one exchange done over each, and
//!   prints the resident memory of `--pid` before and after, and per tunnel.
//!
//! Every tunnel authenticates as `--user` / `--password` (HTTP Basic in
//! `Proxy-Authorization`, or SOCKS5's user name and password); results are one JSON line.
//! Runtime threads: `--threads` (default 1, so the generator takes at most one core).

use std::collections::HashMap;
use std::error::Error;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// Relay and read buffer size: large enough that the bench's own relays never cap a stream.
const CHUNK: usize = 64 * 1024;
/// Tunnels `hold` opens at once.
const HOLD_BATCH: usize = 256;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let command = args.next().unwrap_or_default();
    let result = Options::parse(args).and_then(|options| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.number("threads", 1)?)
            .enable_all()
            .build()?;
        runtime.block_on(async {
            match command.as_str() {
                "serve" => serve(&options).await,
                "rate" => rate(&options).await,
                "bytes" => bytes(&options).await,
                "hold" => hold(&options).await,
                _ => Err("usage: tunnels serve|rate|bytes|hold --option value ...".into()),
            }
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tunnels {command}: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `--name value` pairs, and flags (`--socks`) without a value.
struct Options(HashMap<String, String>);

impl Options {
    fn parse(args: impl Iterator<Item = String>) -> Result<Self> {
        let mut options = HashMap::new();
        let mut args = args.peekable();
        while let Some(arg) = args.next() {
            let name = arg
                .strip_prefix("--")
                .ok_or_else(|| format!("not an option: {arg}"))?;
            let value = match args.peek() {
                Some(next) if !next.starts_with("--") => args.next().unwrap_or_default(),
                _ => String::new(),
            };
            options.insert(name.to_owned(), value);
        }
        Ok(Self(options))
    }

    fn text(&self, name: &str) -> Result<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| format!("--{name} is required").into())
    }

    fn number<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T> {
        match self.0.get(name) {
            None => Ok(default),
            Some(value) => value
                .parse()
                .map_err(|_| format!("--{name}: not a number: {value}").into()),
        }
    }

    fn addresses(&self, name: &str) -> Result<Vec<SocketAddr>> {
        let list = self
            .text(name)?
            .split(',')
            .map(str::parse)
            .collect::<std::result::Result<Vec<_>, _>>();
        list.map_err(|error| format!("--{name}: {error}").into())
    }

    /// Where tunnels go and how they authenticate.
    fn route(&self) -> Result<Route> {
        Ok(Route {
            via: self.addresses("via")?,
            next: AtomicUsize::new(0),
            to: self.text("to")?.parse()?,
            socks: self.0.contains_key("socks"),
            user: self
                .0
                .get("user")
                .cloned()
                .unwrap_or_else(|| "bench".to_owned()),
            password: self.0.get("password").cloned().unwrap_or_default(),
        })
    }
}

// ---- the client ---------------------------------------------------------------------------

/// The proxies to go through (taken in turn), the target, and the credentials.
struct Route {
    via: Vec<SocketAddr>,
    next: AtomicUsize,
    to: SocketAddr,
    socks: bool,
    user: String,
    password: String,
}

impl Route {
    /// Connects to the next proxy and opens a tunnel to the target through it.
    async fn open(&self) -> Result<TcpStream> {
        let via = self.via[self.next.fetch_add(1, Ordering::Relaxed) % self.via.len()];
        let mut stream = TcpStream::connect(via).await?;
        stream.set_nodelay(true)?;
        if self.socks {
            self.socks5(&mut stream).await?;
        } else {
            self.connect(&mut stream).await?;
        }
        Ok(stream)
    }

    /// HTTP `CONNECT` with Basic credentials; the tunnel is up at a 2xx answer.
    async fn connect(&self, stream: &mut TcpStream) -> Result<()> {
        let credentials = base64(format!("{}:{}", self.user, self.password).as_bytes());
        let request = format!(
            "CONNECT {to} HTTP/1.1\r\nHost: {to}\r\nProxy-Authorization: Basic {credentials}\r\n\r\n",
            to = self.to
        );
        stream.write_all(request.as_bytes()).await?;
        // Nothing follows the answer's head until the client speaks, so reading past it
        // cannot swallow tunnel bytes.
        let head = read_head(stream).await?;
        if head.get(9) != Some(&b'2') {
            let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
            return Err(format!("CONNECT answered {}", String::from_utf8_lossy(line)).into());
        }
        Ok(())
    }

    /// The SOCKS5 greeting, user name and password (RFC 1929), and `CONNECT` to an IPv4
    /// or IPv6 address, one step at a time as common clients do.
    async fn socks5(&self, stream: &mut TcpStream) -> Result<()> {
        stream.write_all(&[5, 1, 2]).await?;
        let mut choice = [0; 2];
        stream.read_exact(&mut choice).await?;
        if choice != [5, 2] {
            return Err(format!("SOCKS5 greeting answered {choice:?}").into());
        }
        let (user, password) = (self.user.as_bytes(), self.password.as_bytes());
        let mut auth = vec![1, u8::try_from(user.len())?];
        auth.extend_from_slice(user);
        auth.push(u8::try_from(password.len())?);
        auth.extend_from_slice(password);
        stream.write_all(&auth).await?;
        let mut status = [0; 2];
        stream.read_exact(&mut status).await?;
        if status[1] != 0 {
            return Err("SOCKS5 authentication failed".into());
        }
        let mut request = vec![5, 1, 0];
        match self.to.ip() {
            IpAddr::V4(ip) => {
                request.push(1);
                request.extend_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                request.push(4);
                request.extend_from_slice(&ip.octets());
            }
        }
        request.extend_from_slice(&self.to.port().to_be_bytes());
        stream.write_all(&request).await?;
        let mut reply = [0; 4];
        stream.read_exact(&mut reply).await?;
        if reply[1] != 0 {
            return Err(format!("SOCKS5 CONNECT answered {}", reply[1]).into());
        }
        // The bound address: its length depends on its type.
        let rest = match reply[3] {
            1 => 4 + 2,
            4 => 16 + 2,
            3 => usize::from(stream.read_u8().await?) + 2,
            other => return Err(format!("SOCKS5 reply with address type {other}").into()),
        };
        let mut bound = vec![0; rest];
        stream.read_exact(&mut bound).await?;
        Ok(())
    }
}

/// Reads until the end of an HTTP head (at most 8 KiB) and returns what was read.
async fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>> {
    let mut head = Vec::with_capacity(256);
    let mut buffer = [0; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buffer).await?;
        if n == 0 || head.len() + n > 8192 {
            return Err("no complete HTTP head".into());
        }
        head.extend_from_slice(&buffer[..n]);
    }
    Ok(head)
}

/// Standard base64 with padding, for the Basic credentials.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// New tunnels per second, each carrying one request, with their setup latencies.
async fn rate(options: &Options) -> Result<()> {
    let route = Arc::new(options.route()?);
    let concurrency = options.number("concurrency", 64)?;
    let count: Option<usize> = options
        .0
        .get("count")
        .map(|_| options.number("count", 0))
        .transpose()?;
    let default_duration = if count.is_some() { 3600.0 } else { 5.0 };
    let duration = Duration::from_secs_f64(options.number("duration", default_duration)?);
    // Tunnels started so far, when their number is fixed.
    let started_count = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let mut clients = JoinSet::new();
    for _ in 0..concurrency {
        let route = Arc::clone(&route);
        let started_count = Arc::clone(&started_count);
        clients.spawn(async move {
            let (mut setups, mut errors, mut first_error) = (Vec::new(), 0u64, None);
            while Instant::now() < deadline
                && count.is_none_or(|count| started_count.fetch_add(1, Ordering::Relaxed) < count)
            {
                let opened = Instant::now();
                let outcome = async {
                    let mut stream = route.open().await?;
                    let setup = opened.elapsed();
                    stream
                        .write_all(b"GET / HTTP/1.1\r\nHost: target\r\n\r\n")
                        .await?;
                    let mut answer = Vec::with_capacity(128);
                    stream.read_to_end(&mut answer).await?;
                    if !answer.ends_with(b"\r\n\r\nok") {
                        return Err("the target's answer did not arrive whole".into());
                    }
                    Result::Ok(setup)
                }
                .await;
                match outcome {
                    Ok(setup) => setups.push(setup),
                    Err(error) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| error.to_string());
                    }
                }
            }
            (setups, errors, first_error)
        });
    }
    let (mut setups, mut errors) = (Vec::new(), 0);
    while let Some(client) = clients.join_next().await {
        let (client_setups, client_errors, first_error) = client?;
        setups.extend(client_setups);
        errors += client_errors;
        if let Some(error) = first_error {
            eprintln!("tunnels rate: {error}");
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    setups.sort_unstable();
    let percentile = |p: f64| {
        let index = ((setups.len() as f64 * p) as usize).min(setups.len().saturating_sub(1));
        setups
            .get(index)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
    };
    println!(
        r#"{{"tunnels": {}, "errors": {errors}, "per_second": {:.1}, "p50_ms": {:.3}, "p99_ms": {:.3}}}"#,
        setups.len(),
        setups.len() as f64 / elapsed,
        percentile(0.50),
        percentile(0.99),
    );
    Ok(())
}

/// Bytes per second over one tunnel.
async fn bytes(options: &Options) -> Result<()> {
    let route = options.route()?;
    let wanted: u64 = options.number("bytes", 512 << 20)?;
    let mut stream = route.open().await?;
    let started = Instant::now();
    stream
        .write_all(format!("GET /bytes/{wanted} HTTP/1.1\r\nHost: target\r\n\r\n").as_bytes())
        .await?;
    let mut buffer = vec![0; CHUNK];
    let mut got = 0u64;
    loop {
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    let elapsed = started.elapsed().as_secs_f64();
    if got < wanted {
        return Err(format!("only {got} of {wanted} bytes arrived").into());
    }
    println!(
        r#"{{"bytes": {got}, "per_second": {:.0}}}"#,
        got as f64 / elapsed
    );
    Ok(())
}

/// The resident memory of a process per open tunnel through it.
async fn hold(options: &Options) -> Result<()> {
    let route = Arc::new(options.route()?);
    let count: usize = options.number("count", 10_000)?;
    let pid: u32 = options.number("pid", 0)?;
    let before = rss_kib(pid)?;
    let mut held = Vec::with_capacity(count);
    while held.len() < count {
        let mut batch = JoinSet::new();
        for _ in 0..HOLD_BATCH.min(count - held.len()) {
            let route = Arc::clone(&route);
            batch.spawn(async move {
                let mut stream = route.open().await?;
                // One exchange, so that the tunnel has carried bytes both ways.
                stream
                    .write_all(b"GET /hold HTTP/1.1\r\nHost: target\r\n\r\n")
                    .await?;
                read_head(&mut stream).await?;
                Result::Ok(stream)
            });
        }
        while let Some(stream) = batch.join_next().await {
            held.push(stream??);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(pid)?;
    println!(
        r#"{{"open": {count}, "rss_before_kib": {before}, "rss_after_kib": {after}, "per_tunnel_kib": {:.2}}}"#,
        (after as f64 - before as f64) / count as f64
    );
    Ok(())
}

/// A process's resident set size in KiB, from /proc.
fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .ok_or("no VmRSS")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .ok_or("no VmRSS value")?
        .parse()?)
}

// ---- the servers --------------------------------------------------------------------------

/// The target and the upstream `CONNECT` proxies asked for, until killed.
async fn serve(options: &Options) -> Result<()> {
    let mut servers = JoinSet::new();
    if options.0.contains_key("target") {
        let target = TcpListener::bind(options.text("target")?.parse::<SocketAddr>()?).await?;
        servers.spawn(accept(target, answer));
    }
    if options.0.contains_key("upstreams") {
        for address in options.addresses("upstreams")? {
            servers.spawn(accept(TcpListener::bind(address).await?, relay));
        }
    }
    println!("serving");
    match servers.join_next().await {
        Some(finished) => finished?,
        None => Ok(()),
    }
}

/// Accepts connections for ever, one task each; a connection's failure ends only it.
async fn accept<F, Fut>(listener: TcpListener, handle: F) -> Result<()>
where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let connection = handle(stream);
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
}

/// An upstream member: `CONNECT host:port`, dial, 200, then relay both ways.
async fn relay(mut client: TcpStream) -> Result<()> {
    let head = read_head(&mut client).await?;
    let end = head
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(head.len())
        + 4;
    let line = std::str::from_utf8(&head[..end])?
        .lines()
        .next()
        .unwrap_or_default();
    let target = match line.split(' ').collect::<Vec<_>>()[..] {
        ["CONNECT", target, _] => target,
        _ => {
            client
                .write_all(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
                .await?;
            return Ok(());
        }
    };
    let Ok(mut upstream) = TcpStream::connect(target).await else {
        client
            .write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
            .await?;
        return Ok(());
    };
    upstream.set_nodelay(true)?;
    client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    // Bytes a client sent right behind its request head belong to the tunnel.
    upstream.write_all(&head[end.min(head.len())..]).await?;
    tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, CHUNK, CHUNK).await?;
    Ok(())
}

/// The target: `GET /`, `GET /bytes/N` or `GET /hold`.
async fn answer(mut stream: TcpStream) -> Result<()> {
    let head = read_head(&mut stream).await?;
    let path = head.split(|&b| b == b' ').nth(1).unwrap_or_default();
    if path == b"/hold" {
        stream.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await?;
        let mut rest = [0; 64];
        while stream.read(&mut rest).await? > 0 {}
    } else if let Some(count) = path.strip_prefix(b"/bytes/") {
        let count: u64 = std::str::from_utf8(count)?.parse()?;
        stream
            .write_all(format!("HTTP/1.1 200 OK\r\ncontent-length: {count}\r\n\r\n").as_bytes())
            .await?;
        let chunk = vec![b'x'; CHUNK];
        let mut left = count;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            stream.write_all(&chunk[..n]).await?;
            left -= n as u64;
        }
    } else {
        stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            .await?;
    }
    stream.shutdown().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_pads_as_the_standard_alphabet_does() {
        assert_eq!(base64(b"bench:s3cret"), "YmVuY2g6czNjcmV0");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
    }
}
