//! Real proxies and an HTTPS target on loopback, for the active-check tests: an HTTP proxy
//! (absolute-form requests and CONNECT, optionally over TLS and with Basic credentials),
//! SOCKS5 (with or without a user name and password), SOCKS4 (and 4a), and a target that
//! serves TLS with a certificate from a test CA made here with OpenSSL (the servers' TLS
//! stack; the checks' client uses rustls).
//!
//! They relay bytes as real proxies do; none of them knows what the client under test
//! will send beyond the protocol itself.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{
    BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
};
use openssl::x509::{X509, X509NameBuilder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_native_tls::TlsAcceptor;

/// A certificate authority made for one test.
pub struct TestCa {
    cert: X509,
    key: PKey<Private>,
}

fn ec_key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).expect("a curve");
    PKey::from_ec_key(EcKey::generate(&group).expect("a key")).expect("a key")
}

/// A v3 certificate builder for `subject`, issued by `issuer`, for `key`, valid for a day.
fn certificate(
    subject: &openssl::x509::X509NameRef,
    issuer: &openssl::x509::X509NameRef,
    key: &PKey<Private>,
) -> openssl::x509::X509Builder {
    let mut builder = X509::builder().expect("a builder");
    builder.set_version(2).expect("v3");
    builder
        .set_serial_number(&serial())
        .expect("a serial number");
    builder.set_subject_name(subject).expect("a subject");
    builder.set_issuer_name(issuer).expect("an issuer");
    builder.set_pubkey(key).expect("a key");
    builder
        .set_not_before(&Asn1Time::days_from_now(0).expect("now"))
        .expect("not before");
    builder
        .set_not_after(&Asn1Time::days_from_now(1).expect("tomorrow"))
        .expect("not after");
    builder
}

fn serial() -> openssl::asn1::Asn1Integer {
    let mut serial = BigNum::new().expect("a number");
    serial
        .rand(64, MsbOption::MAYBE_ZERO, false)
        .expect("random");
    serial.to_asn1_integer().expect("a serial")
}

impl TestCa {
    /// A fresh CA, valid for a day.
    pub fn new() -> Self {
        let key = ec_key();
        let mut name = X509NameBuilder::new().expect("a name");
        // Each CA has a name of its own: a verifier that finds a trusted CA by the issuer
        // name of a stranger's certificate would report a bad signature, not an unknown CA.
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let cn = format!("test CA {}", MADE.fetch_add(1, Ordering::Relaxed));
        name.append_entry_by_text("CN", &cn).expect("a CN");
        let name = name.build();
        let mut builder = certificate(&name, &name, &key);
        builder
            .append_extension(BasicConstraints::new().critical().ca().build().expect("ca"))
            .expect("basic constraints");
        builder
            .append_extension(
                KeyUsage::new()
                    .critical()
                    .key_cert_sign()
                    .crl_sign()
                    .build()
                    .expect("usage"),
            )
            .expect("key usage");
        builder.sign(&key, MessageDigest::sha256()).expect("signed");
        Self {
            cert: builder.build(),
            key,
        }
    }

    /// The CA certificate as PEM text, for `check.ca_pem`.
    pub fn pem(&self) -> String {
        String::from_utf8(self.cert.to_pem().expect("pem")).expect("ascii")
    }

    /// A TLS acceptor with a server certificate for `names` (IP addresses or DNS names)
    /// signed by this CA.
    pub fn acceptor(&self, names: &[&str]) -> TlsAcceptor {
        let key = ec_key();
        let mut subject = X509NameBuilder::new().expect("a name");
        subject.append_entry_by_text("CN", names[0]).expect("a CN");
        let subject = subject.build();
        let mut builder = certificate(&subject, self.cert.subject_name(), &key);
        let mut alt = SubjectAlternativeName::new();
        for name in names {
            if name.parse::<std::net::IpAddr>().is_ok() {
                alt.ip(name);
            } else {
                alt.dns(name);
            }
        }
        let alt = alt
            .build(&builder.x509v3_context(Some(&self.cert), None))
            .expect("alt names");
        builder.append_extension(alt).expect("alt names");
        builder
            .append_extension(ExtendedKeyUsage::new().server_auth().build().expect("eku"))
            .expect("extended key usage");
        builder
            .sign(&self.key, MessageDigest::sha256())
            .expect("signed");
        let cert = builder.build().to_pem().expect("pem");
        let key = key.private_key_to_pem_pkcs8().expect("pem");
        let identity =
            tokio_native_tls::native_tls::Identity::from_pkcs8(&cert, &key).expect("an identity");
        TlsAcceptor::from(
            tokio_native_tls::native_tls::TlsAcceptor::new(identity).expect("an acceptor"),
        )
    }
}

/// A byte stream a server reads and writes, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A server on a loopback port; stops when dropped.
pub struct Server {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it saw, one line per request or handshake, in order.
    pub seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    /// What the server saw so far.
    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().expect("lock").clone()
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    async fn start<F, Fut>(tls: Option<TlsAcceptor>, handle: F) -> Self
    where
        F: Fn(Box<dyn Io>, Arc<Mutex<Vec<String>>>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = std::io::Result<()>> + Send + 'static,
    {
        Self::start_at(IpAddr::from([127, 0, 0, 1]), tls, handle).await
    }

    /// [`Server::start`] on a port of `ip` (any loopback address, `127.0.0.x`).
    async fn start_at<F, Fut>(ip: IpAddr, tls: Option<TlsAcceptor>, handle: F) -> Self
    where
        F: Fn(Box<dyn Io>, Arc<Mutex<Vec<String>>>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = std::io::Result<()>> + Send + 'static,
    {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .await
            .expect("bound");
        let addr = listener.local_addr().expect("an address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&seen);
        let handle = Arc::new(handle);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (handle, seen, tls) = (Arc::clone(&handle), Arc::clone(&recorded), tls.clone());
                tokio::spawn(async move {
                    let io: Box<dyn Io> = match tls {
                        Some(tls) => match tls.accept(stream).await {
                            Ok(stream) => Box::new(stream),
                            Err(_) => {
                                seen.lock().expect("lock").push("tls refused".to_owned());
                                return;
                            }
                        },
                        None => Box::new(stream),
                    };
                    let _ = handle(io, seen).await;
                });
            }
        });
        Self { addr, seen, task }
    }
}

/// Reads up to the end of an HTTP head; returns it and whatever came after it.
async fn read_head(io: &mut Box<dyn Io>) -> std::io::Result<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&buf).into_owned(), rest));
        }
        let n = io.read(&mut chunk).await?;
        if n == 0 || buf.len() > 16 * 1024 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

async fn relay(
    mut client: Box<dyn Io>,
    target: &str,
    first: &[u8],
    exit: Option<IpAddr>,
) -> std::io::Result<()> {
    let mut upstream = match exit {
        // The connection to the target leaves from `exit`: what the target sees.
        Some(exit) => {
            let target: SocketAddr = tokio::net::lookup_host(target)
                .await?
                .find(SocketAddr::is_ipv4)
                .ok_or(std::io::ErrorKind::AddrNotAvailable)?;
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(exit, 0))?;
            socket.connect(target).await?
        }
        None => TcpStream::connect(target).await?,
    };
    upstream.write_all(first).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// The target (HTTPS with `tls`, plain HTTP without): `/health` answers 200 with a page naming the target, `/blocked` 200
/// with a block page, `/limited` 429, `/echo` the request's body, anything else 404. It records each request line and `User-Agent`.
pub async fn target(tls: Option<TlsAcceptor>) -> Server {
    Server::start(tls, |mut io, seen| async move {
        let (head, mut rest) = read_head(&mut io).await?;
        let line = head.lines().next().unwrap_or_default().to_owned();
        let agent = header(&head, "user-agent").unwrap_or("-").to_owned();
        seen.lock().expect("lock").push(format!("{line} | {agent}"));
        if line.split(' ').nth(1) == Some("/echo") {
            // The request's body back, byte for byte.
            let length: usize = header(&head, "content-length")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let mut chunk = [0u8; 4096];
            while rest.len() < length {
                let n = io.read(&mut chunk).await?;
                if n == 0 {
                    break;
                }
                rest.extend_from_slice(&chunk[..n]);
            }
            let mut answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                rest.len()
            )
            .into_bytes();
            answer.extend_from_slice(&rest);
            io.write_all(&answer).await?;
            return io.shutdown().await;
        }
        let (status, body) = match line.split(' ').nth(1) {
            Some("/health") => ("200 OK", "<title>target</title> all is well"),
            Some("/blocked") => ("200 OK", "<title>Access denied</title>"),
            Some("/limited") => ("429 Too Many Requests", "slow down"),
            _ => ("404 Not Found", "no such page"),
        };
        let answer = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        io.write_all(answer.as_bytes()).await?;
        io.shutdown().await
    })
    .await
}

/// A target that answers every request with the caller's address as it saw it: as plain
/// text on `/ip`, as `{"origin": ...}` on `/json`, and with `garbage` (a page that holds
/// no address) on `/garbage`. It records each request line.
pub async fn ip_echo(garbage: &'static str) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bound");
    let addr = listener.local_addr().expect("an address");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&seen);
    let task = tokio::spawn(async move {
        while let Ok((stream, peer)) = listener.accept().await {
            let seen = Arc::clone(&recorded);
            tokio::spawn(async move {
                let mut io: Box<dyn Io> = Box::new(stream);
                let (head, _) = read_head(&mut io).await?;
                let line = head.lines().next().unwrap_or_default().to_owned();
                seen.lock().expect("lock").push(line.clone());
                let body = match line.split(' ').nth(1) {
                    Some("/json") => format!(r#"{{"origin": "{}"}}"#, peer.ip()),
                    Some("/garbage") => garbage.to_owned(),
                    _ => format!("{}\n", peer.ip()),
                };
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                io.write_all(answer.as_bytes()).await?;
                io.shutdown().await
            });
        }
    });
    Server { addr, seen, task }
}

/// How an HTTP proxy behaves.
#[derive(Clone, Default)]
pub struct HttpProxy {
    /// Serve the proxy itself over TLS (an `https` proxy).
    pub tls: Option<TlsAcceptor>,
    /// The `Proxy-Authorization` value required (`407` without it).
    pub authorization: Option<&'static str>,
    /// How long to wait before relaying each request.
    pub delay: Duration,
    /// Read `Proxy-Authorization` only in that capitalisation, as some real proxies do
    /// (pproxy's HTTP listener ignores `proxy-authorization`).
    pub case_sensitive: bool,
    /// An answer this proxy gives plain-HTTP requests itself, as a site does that blocks
    /// the proxy's exit address (a whole HTTP/1.1 response).
    pub answer: Option<&'static str>,
    /// The loopback address it listens on (`127.0.0.1` when `None`).
    pub listen: Option<IpAddr>,
    /// The loopback address its connections to targets leave from, which the target sees
    /// as the caller's (the system's choice when `None`).
    pub exit: Option<IpAddr>,
}

impl HttpProxy {
    /// Starts the proxy. It records `CONNECT host:port` or the absolute-form request line,
    /// followed by ` | ` and the `Proxy-Authorization` it was sent (`-` for none).
    pub async fn start(self) -> Server {
        let tls = self.tls.clone();
        let listen = self.listen.unwrap_or(IpAddr::from([127, 0, 0, 1]));
        Server::start_at(listen, tls, move |mut io, seen| {
            let this = self.clone();
            async move {
                let (head, rest) = read_head(&mut io).await?;
                let line = head.lines().next().unwrap_or_default().to_owned();
                let credentials = if this.case_sensitive {
                    head.lines()
                        .skip(1)
                        .find_map(|line| line.strip_prefix("Proxy-Authorization: "))
                } else {
                    header(&head, "proxy-authorization")
                }
                .unwrap_or("-");
                seen.lock()
                    .expect("lock")
                    .push(format!("{line} | {credentials}"));
                if this
                    .authorization
                    .is_some_and(|expected| expected != credentials)
                {
                    let refusal = "HTTP/1.1 407 Proxy Authentication Required\r\n\
                                   Content-Length: 0\r\nConnection: close\r\n\r\n";
                    return io.write_all(refusal.as_bytes()).await;
                }
                tokio::time::sleep(this.delay).await;
                let mut words = line.split(' ');
                let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                if let (Some(answer), false) = (this.answer, method == "CONNECT") {
                    io.write_all(answer.as_bytes()).await?;
                    return io.shutdown().await;
                }
                if method == "CONNECT" {
                    io.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                        .await?;
                    return relay(io, target, &rest, this.exit).await;
                }
                // Absolute form: forward the request in origin form, without the proxy's
                // own header.
                let url = target.strip_prefix("http://").unwrap_or(target);
                let (authority, path) = url.split_at(url.find('/').unwrap_or(url.len()));
                let path = if path.is_empty() { "/" } else { path };
                let mut forwarded = format!("{method} {path} HTTP/1.1\r\n");
                for line in head.lines().skip(1).filter(|l| !l.is_empty()) {
                    if !line
                        .to_ascii_lowercase()
                        .starts_with("proxy-authorization:")
                    {
                        forwarded.push_str(line);
                        forwarded.push_str("\r\n");
                    }
                }
                forwarded.push_str("\r\n");
                let mut first = forwarded.into_bytes();
                first.extend_from_slice(&rest);
                relay(io, authority, &first, this.exit).await
            }
        })
        .await
    }
}

/// A SOCKS5 proxy, requiring `user`/`pass` when given. It records `socks5 <how> <target>`,
/// where `how` is `ip` or `name` (the address type the client sent).
pub async fn socks5(credentials: Option<(&'static str, &'static str)>) -> Server {
    Server::start(None, move |mut io, seen| async move {
        let mut greeting = [0u8; 2];
        io.read_exact(&mut greeting).await?;
        let mut methods = vec![0u8; usize::from(greeting[1])];
        io.read_exact(&mut methods).await?;
        match credentials {
            Some((user, pass)) => {
                if !methods.contains(&2) {
                    return io.write_all(&[5, 0xff]).await;
                }
                io.write_all(&[5, 2]).await?;
                let mut version_len = [0u8; 2];
                io.read_exact(&mut version_len).await?;
                let mut name = vec![0u8; usize::from(version_len[1])];
                io.read_exact(&mut name).await?;
                let mut len = [0u8; 1];
                io.read_exact(&mut len).await?;
                let mut password = vec![0u8; usize::from(len[0])];
                io.read_exact(&mut password).await?;
                if name != user.as_bytes() || password != pass.as_bytes() {
                    seen.lock()
                        .expect("lock")
                        .push("socks5 bad credentials".to_owned());
                    return io.write_all(&[1, 1]).await;
                }
                io.write_all(&[1, 0]).await?;
            }
            None => io.write_all(&[5, 0]).await?,
        }
        let mut request = [0u8; 4];
        io.read_exact(&mut request).await?;
        let (how, host) = match request[3] {
            1 => {
                let mut ip = [0u8; 4];
                io.read_exact(&mut ip).await?;
                ("ip", std::net::Ipv4Addr::from(ip).to_string())
            }
            3 => {
                let mut len = [0u8; 1];
                io.read_exact(&mut len).await?;
                let mut name = vec![0u8; usize::from(len[0])];
                io.read_exact(&mut name).await?;
                ("name", String::from_utf8_lossy(&name).into_owned())
            }
            _ => {
                let mut ip = [0u8; 16];
                io.read_exact(&mut ip).await?;
                ("ip", format!("[{}]", std::net::Ipv6Addr::from(ip)))
            }
        };
        let mut port = [0u8; 2];
        io.read_exact(&mut port).await?;
        let target = format!("{host}:{}", u16::from_be_bytes(port));
        seen.lock()
            .expect("lock")
            .push(format!("socks5 {how} {target}"));
        io.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
        relay(io, &target, &[], None).await
    })
    .await
}

/// A SOCKS4 proxy (and 4a, for names). It records `socks4 <target>`.
pub async fn socks4() -> Server {
    Server::start(None, |mut io, seen| async move {
        let mut request = [0u8; 8];
        io.read_exact(&mut request).await?;
        let port = u16::from_be_bytes([request[2], request[3]]);
        let ip = std::net::Ipv4Addr::new(request[4], request[5], request[6], request[7]);
        read_nul_terminated(&mut io).await?;
        let host = if ip.octets()[..3] == [0, 0, 0] {
            read_nul_terminated(&mut io).await?
        } else {
            ip.to_string()
        };
        let target = format!("{host}:{port}");
        seen.lock().expect("lock").push(format!("socks4 {target}"));
        io.write_all(&[0, 0x5a, 0, 0, 0, 0, 0, 0]).await?;
        relay(io, &target, &[], None).await
    })
    .await
}

/// Reads a NUL-terminated SOCKS4 field (the user id, or a 4a host name).
async fn read_nul_terminated(io: &mut Box<dyn Io>) -> std::io::Result<String> {
    let mut text = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        io.read_exact(&mut byte).await?;
        if byte[0] == 0 {
            return Ok(String::from_utf8_lossy(&text).into_owned());
        }
        text.push(byte[0]);
    }
}

/// A loopback port nothing listens on.
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bound");
    listener.local_addr().expect("an address").port()
}
