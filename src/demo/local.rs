//! The demo's own network on loopback: small HTTP forward proxies (`CONNECT` tunnels and
//! absolute-form requests, one request per connection) that behave well, slowly or badly on
//! purpose, and a one-page site for them to fetch, so that the demo needs no internet.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Largest request head a local proxy or the site reads; a longer one is dropped.
const MAX_HEAD: usize = 16 * 1024;

/// What the site answers to every request.
pub const PAGE: &str = "hello from the proxy-allocator demo site\n";

/// How a local proxy behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Forwards every request at once.
    Healthy,
    /// Waits this long before it forwards a request.
    Slow(Duration),
    /// Never forwards: reads the request and closes the connection without an answer, as
    /// a proxy whose own upstream is gone does.
    Failing,
}

impl Behaviour {
    /// The word the demo labels a member with (`kind=...`).
    pub fn kind(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Slow(_) => "slow",
            Self::Failing => "failing",
        }
    }
}

/// A running local proxy.
#[derive(Debug, Clone, Copy)]
pub struct LocalProxy {
    /// Where it listens.
    pub addr: SocketAddr,
    /// How it behaves.
    pub behaviour: Behaviour,
}

impl LocalProxy {
    /// Its member id, as the pool holds it.
    pub fn member(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// The local proxies and the site, serving until this is dropped.
#[derive(Debug)]
pub struct Network {
    /// The proxies, in the order they were asked for.
    pub proxies: Vec<LocalProxy>,
    /// The site's address.
    pub site: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl Network {
    /// Binds the site and one proxy per behaviour on 127.0.0.1 ephemeral ports.
    ///
    /// # Errors
    /// When a port cannot be bound.
    pub async fn start(behaviours: &[Behaviour]) -> std::io::Result<Self> {
        let mut tasks = Vec::with_capacity(behaviours.len() + 1);
        let site = bind().await?;
        let site_addr = site.local_addr()?;
        tasks.push(tokio::spawn(accept_each(site, serve_page)));
        let mut proxies = Vec::with_capacity(behaviours.len());
        for &behaviour in behaviours {
            let listener = bind().await?;
            proxies.push(LocalProxy {
                addr: listener.local_addr()?,
                behaviour,
            });
            tasks.push(tokio::spawn(accept_each(listener, move |stream| {
                proxy(stream, behaviour)
            })));
        }
        Ok(Self {
            proxies,
            site: site_addr,
            tasks,
        })
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn bind() -> std::io::Result<TcpListener> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await
}

/// Accepts connections for ever, each handled in a task of its own; an accept error (out
/// of files) is waited out rather than ending the server.
async fn accept_each<F, Fut>(listener: TcpListener, handle: F)
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = std::io::Result<()>> + Send + 'static,
{
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                // A connection's failure is the client's business: the demo's proxies
                // behave like real ones and just close.
                tokio::spawn(handle(stream));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// A request head and whatever arrived after it.
struct Head {
    method: String,
    target: String,
    /// The header lines, without the request line and the blank line.
    headers: Vec<String>,
    rest: Vec<u8>,
}

/// Reads up to the end of a request head; `None` when the client closed first or the head
/// is too long or not text.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<Head>> {
    let mut bytes = Vec::with_capacity(1024);
    let mut chunk = [0_u8; 4096];
    let end = loop {
        if let Some(at) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        if bytes.len() > MAX_HEAD {
            return Ok(None);
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        bytes.extend_from_slice(&chunk[..read]);
    };
    let rest = bytes.split_off(end + 4);
    let Ok(text) = std::str::from_utf8(&bytes[..end]) else {
        return Ok(None);
    };
    let mut lines = text.split("\r\n");
    let mut words = lines.next().unwrap_or_default().split(' ');
    let (Some(method), Some(target)) = (words.next(), words.next()) else {
        return Ok(None);
    };
    Ok(Some(Head {
        method: method.to_owned(),
        target: target.to_owned(),
        headers: lines.map(str::to_owned).collect(),
        rest,
    }))
}

/// Answers every request with [`PAGE`], and closes.
async fn serve_page(mut stream: TcpStream) -> std::io::Result<()> {
    if read_head(&mut stream).await?.is_none() {
        return Ok(());
    }
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{PAGE}",
        PAGE.len()
    );
    stream.write_all(answer.as_bytes()).await?;
    stream.shutdown().await
}

const BAD_GATEWAY: &[u8] =
    b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// One client connection of a proxy behaving as `behaviour`.
async fn proxy(mut client: TcpStream, behaviour: Behaviour) -> std::io::Result<()> {
    let Some(head) = read_head(&mut client).await? else {
        return Ok(());
    };
    match behaviour {
        Behaviour::Healthy => {}
        Behaviour::Slow(delay) => tokio::time::sleep(delay).await,
        Behaviour::Failing => return Ok(()),
    }
    if head.method.eq_ignore_ascii_case("CONNECT") {
        let Ok(mut upstream) = TcpStream::connect(head.target.as_str()).await else {
            return client.write_all(BAD_GATEWAY).await;
        };
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        upstream.write_all(&head.rest).await?;
        tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
        return Ok(());
    }
    // An absolute-form request: to its host in origin form, without the proxy's own
    // headers, for one request only.
    let Some((authority, path)) = head
        .target
        .strip_prefix("http://")
        .map(|rest| rest.split_at(rest.find('/').unwrap_or(rest.len())))
    else {
        return client.write_all(BAD_GATEWAY).await;
    };
    let address = if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let Ok(mut upstream) = TcpStream::connect(address.as_str()).await else {
        return client.write_all(BAD_GATEWAY).await;
    };
    let path = if path.is_empty() { "/" } else { path };
    let mut request = format!("{} {path} HTTP/1.1\r\n", head.method);
    for line in &head.headers {
        let name = line.split(':').next().unwrap_or_default().trim();
        let hop = [
            "proxy-authorization",
            "proxy-connection",
            "connection",
            "keep-alive",
        ];
        if !hop.iter().any(|hop| name.eq_ignore_ascii_case(hop)) {
            request.push_str(line);
            request.push_str("\r\n");
        }
    }
    request.push_str("connection: close\r\n\r\n");
    upstream.write_all(request.as_bytes()).await?;
    upstream.write_all(&head.rest).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn exchange(proxy: SocketAddr, request: String) -> String {
        let mut stream = TcpStream::connect(proxy).await.expect("connected");
        stream
            .write_all(request.as_bytes())
            .await
            .expect("request sent");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer).await;
        answer
    }

    #[tokio::test]
    async fn a_healthy_proxy_forwards_an_absolute_form_request_and_a_tunnel_to_the_site() {
        let network = Network::start(&[Behaviour::Healthy]).await.expect("bound");
        let (proxy, site) = (network.proxies[0].addr, network.site);
        let plain = exchange(
            proxy,
            format!("GET http://{site}/ HTTP/1.1\r\nhost: {site}\r\n\r\n"),
        )
        .await;
        assert!(plain.starts_with("HTTP/1.1 200 OK\r\n"), "{plain}");
        assert!(plain.ends_with(PAGE), "{plain}");
        let tunnelled = exchange(
            proxy,
            format!("CONNECT {site} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nhost: {site}\r\n\r\n"),
        )
        .await;
        assert!(
            tunnelled.starts_with("HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK"),
            "{tunnelled}"
        );
        assert!(tunnelled.ends_with(PAGE), "{tunnelled}");
    }

    #[tokio::test]
    async fn a_failing_proxy_reads_the_request_and_closes_without_an_answer() {
        let network = Network::start(&[Behaviour::Failing]).await.expect("bound");
        let (proxy, site) = (network.proxies[0].addr, network.site);
        for request in [
            format!("GET http://{site}/ HTTP/1.1\r\nhost: {site}\r\n\r\n"),
            format!("CONNECT {site} HTTP/1.1\r\n\r\n"),
        ] {
            assert_eq!(exchange(proxy, request).await, "");
        }
    }
}
