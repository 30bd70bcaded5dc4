//! The gateway's SOCKS5 port (`GATEWAY_SOCKS_LISTEN`): RFC 1928 with the user name and
//! password of RFC 1929, for clients that speak SOCKS rather than HTTP proxying.
//!
//! - **Who and which pool.** Only the user name and password method is offered: the user
//!   name is the HTTP gateway's (the pool and its options, see [`super::user`]), the
//!   password the worker token (any password without one, which startup allows only on
//!   loopback) or the token of a client that lists the pool. A wrong password, a client
//!   token for another pool or a malformed user name fails the authentication (its status
//!   is 1) and the connection is closed; a client that offers no user name and
//!   password, or speaks another version, is answered "no acceptable method" and closed.
//! - **What is dialled.** `CONNECT` to an IPv4, IPv6 or domain-name address: the address
//!   is the assign's `target` (so per-site bans and pacing apply) and is handed to the
//!   member, which resolves and dials it; the gateway never resolves or dials the target
//!   itself. `BIND` and `UDP ASSOCIATE` are answered 7 (command not supported), an unknown
//!   address type 8.
//! - **Attempts, outcomes, leases.** As a `CONNECT` on the HTTP port: a member that cannot
//!   be dialled is reported `failed` and the next one not tried yet is, up to the pool's
//!   attempts; the tunnel is reported `ok`, holds its lease for as long as it is open and
//!   counts against `GATEWAY_MAX_CONNECTIONS` and its client's share like any gateway
//!   connection. A SOCKS reply has no headers, so a tunnel here gets no ticket.
//! - **Deadlines.** The greeting, the credentials and the request must all arrive within
//!   the deadline of an HTTP request head on the gateway (the shorter of the header and
//!   the unauthenticated timeouts); the dial has the gateway's connect timeout per attempt.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::connections::Accepted;
use crate::domain::PoolId;
use crate::monitoring::OTHER_POOL;

use super::status::Tried;
use super::upstream::FailureKind;
use super::user::Selection;
use super::{Attempt, Gateway, Kind, Refusal};

/// The protocol version of every SOCKS5 message but the credentials'.
const VERSION: u8 = 5;
/// The version of the user name and password subnegotiation (RFC 1929).
const AUTH_VERSION: u8 = 1;
/// The user name and password method.
const USER_PASSWORD: u8 = 2;
/// "No acceptable methods".
const NO_ACCEPTABLE: u8 = 0xFF;
/// The `CONNECT` command.
const CONNECT: u8 = 1;

/// The address types of a request.
const IPV4: u8 = 1;
const DOMAIN: u8 = 3;
const IPV6: u8 = 4;

/// A reply's code (RFC 1928, section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// The tunnel is up.
    Succeeded = 0,
    /// General SOCKS server failure.
    GeneralFailure = 1,
    /// Connection not allowed by ruleset.
    NotAllowed = 2,
    /// Network unreachable.
    NetworkUnreachable = 3,
    /// Host unreachable.
    HostUnreachable = 4,
    /// Connection refused.
    ConnectionRefused = 5,
    /// TTL expired: used for a member that did not connect in time.
    TtlExpired = 6,
    /// Command not supported.
    CommandNotSupported = 7,
    /// Address type not supported.
    AddressTypeNotSupported = 8,
}

impl Reply {
    /// The reply to a request the gateway could not serve.
    fn of(refusal: &Refusal) -> Self {
        match refusal {
            Refusal::UpstreamFailed { last, .. } => match last.kind {
                FailureKind::Refused => Self::ConnectionRefused,
                FailureKind::TimedOut | FailureKind::ResponseTimedOut => Self::TtlExpired,
                FailureKind::ProxyAnswer | FailureKind::Unreachable => Self::HostUnreachable,
            },
            Refusal::PoolNotFound
            | Refusal::PoolNotAllowed
            | Refusal::Unauthenticated
            | Refusal::NotAProxy
            | Refusal::PrivateAddress => Self::NotAllowed,
            Refusal::NoEligible { .. } => Self::NetworkUnreachable,
            Refusal::Invalid(_) => Self::HostUnreachable,
            Refusal::Store | Refusal::TooManySessions => Self::GeneralFailure,
        }
    }

    /// The whole reply: its code and an unspecified bound address (`0.0.0.0:0`), which
    /// clients of a `CONNECT` do not use.
    fn bytes(self) -> [u8; 10] {
        [VERSION, self as u8, 0, IPV4, 0, 0, 0, 0, 0, 0]
    }
}

/// What a client asked for, once it has authenticated.
#[derive(Debug, PartialEq, Eq)]
pub struct Asked {
    /// The pool and the pick's options, from the user name.
    pub selection: Selection,
    /// The destination's host, as the member is asked to dial it (an IPv6 literal in
    /// brackets).
    pub host: String,
    /// The destination's port.
    pub port: u16,
}

/// How a handshake ended without a request to serve: what the metric counts it as.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The client spoke another protocol or broke this one, or went away.
    Invalid,
    /// The client offered no method the gateway takes, or its credentials were wrong.
    Unauthenticated,
    /// The password is a client's token, and its client does not list the pool.
    NotAllowed,
    /// The store could not say whose token the password is.
    StoreUnavailable,
    /// The client asked for something other than a `CONNECT`, or an unknown address type
    /// (answered, then closed).
    Unsupported,
}

impl Gateway {
    /// Serves one connection of the SOCKS5 port until its tunnel is up (the tunnel is then
    /// relayed in a task of its own), counting it in `pa_gateway_requests_total` with
    /// `listener="socks5"`.
    pub async fn serve_socks(self, accepted: Accepted) {
        let deadline = accepted.handshake_deadline();
        let Accepted { mut stream, .. } = accepted;
        let asked = deadline
            .within(handshake(&mut stream, |pool, password| {
                let gateway = self.clone();
                async move {
                    match gateway.admit(&password, &pool).await {
                        Ok(()) => Ok(()),
                        Err(Refusal::PoolNotAllowed) => Err(Ended::NotAllowed),
                        Err(Refusal::Store) => Err(Ended::StoreUnavailable),
                        Err(_) => Err(Ended::Unauthenticated),
                    }
                }
            }))
            .await;
        let mut label = OTHER_POOL.to_owned();
        let outcome = match asked {
            // Closed at the deadline: counted as a timeout by the listener.
            None => return,
            Some(Err(ended)) => ended.code(),
            Some(Ok(asked)) => match self.connect(asked, &mut label).await {
                Ok((held, connection)) => {
                    // A client gone before its reply gives its lease back as `held` drops.
                    if stream.write_all(&Reply::Succeeded.bytes()).await.is_ok() {
                        held.relay(std::future::ready(Some(stream)), connection, None, "socks5");
                    }
                    metrics::counter!("pa_gateway_requests_total", "listener" => "socks5", "pool" => label, "outcome" => "tunnel")
                        .increment(1);
                    return;
                }
                Err(refusal) => {
                    tracing::debug!(pool = label.as_str(), error = %refusal, "gateway: SOCKS5 request refused");
                    let _ = stream.write_all(&Reply::of(&refusal).bytes()).await;
                    refusal.code()
                }
            },
        };
        metrics::counter!("pa_gateway_requests_total", "listener" => "socks5", "pool" => label, "outcome" => outcome)
            .increment(1);
        linger(&mut stream).await;
    }

    /// Picks and dials members for `asked` until one is up, as for a `CONNECT` on the HTTP
    /// port.
    async fn connect(
        &self,
        asked: Asked,
        label: &mut String,
    ) -> Result<(super::Held, super::upstream::Connection), Refusal> {
        let Asked {
            selection,
            host,
            port,
        } = asked;
        let mut tried = Tried::default();
        let mut attempts = self
            .attempts(selection, Kind::Tunnel, &host, port, label)
            .await?;
        for _ in 0..attempts.most {
            match attempts.next(&mut tried).await? {
                Attempt::Dialled(dialled) => {
                    let (held, _, connection) = *dialled;
                    return Ok((held, connection));
                }
                Attempt::DialFailed => {}
                Attempt::Exhausted(next_return) => {
                    return Err(attempts.give_up(&tried, next_return));
                }
            }
        }
        Err(attempts.give_up(&tried, None))
    }
}

impl Ended {
    /// The outcome `pa_gateway_requests_total` counts it as.
    fn code(&self) -> &'static str {
        match self {
            Self::Invalid => "invalid_request",
            Self::Unauthenticated => "proxy_auth_required",
            Self::NotAllowed => "pool_not_allowed",
            Self::StoreUnavailable => "store_unavailable",
            Self::Unsupported => "not_supported",
        }
    }
}

/// Longest a refused connection is kept to read what its client still sends.
const LINGER: Duration = Duration::from_secs(1);

/// Most bytes read from a refused connection before it is closed regardless.
const MAX_LINGER_BYTES: usize = 64 * 1024;

/// Closes a refused connection so that its answer arrives: the gateway's side is shut down
/// (the client reads the answer, then the end) and what the client still sends is read and
/// dropped, for at most [`LINGER`] and [`MAX_LINGER_BYTES`]; closing with unread bytes
/// would reset the connection, and a reset can destroy the answer before it is read.
async fn linger<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S) {
    let _ = stream.shutdown().await;
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut read = 0;
        while read < MAX_LINGER_BYTES {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// Reads the greeting, the credentials and the request, answering each step; `Ok` once the
/// client asked for a `CONNECT`, which is still to be answered.
///
/// # Errors
/// How the handshake ended otherwise (the client has had its answer, when it is owed one).
pub async fn handshake<S, F, A>(stream: &mut S, admit: A) -> Result<Asked, Ended>
where
    S: AsyncRead + AsyncWrite + Unpin,
    A: Fn(PoolId, Vec<u8>) -> F,
    F: Future<Output = Result<(), Ended>>,
{
    // The greeting: the version and the methods the client offers.
    let [version, count] = read_array(stream).await?;
    let mut methods = vec![0; usize::from(count)];
    if version == VERSION {
        stream
            .read_exact(&mut methods)
            .await
            .map_err(|_| Ended::Invalid)?;
    }
    if version != VERSION || !methods.contains(&USER_PASSWORD) {
        let _ = stream.write_all(&[VERSION, NO_ACCEPTABLE]).await;
        return Err(if version == VERSION {
            Ended::Unauthenticated
        } else {
            Ended::Invalid
        });
    }
    write(stream, &[VERSION, USER_PASSWORD]).await?;
    // The credentials.
    let [auth_version, user_len] = read_array(stream).await?;
    if auth_version != AUTH_VERSION {
        let _ = stream.write_all(&[AUTH_VERSION, 1]).await;
        return Err(Ended::Invalid);
    }
    let user = read_vec(stream, user_len).await?;
    let [password_len] = read_array(stream).await?;
    let password = read_vec(stream, password_len).await?;
    let selection = std::str::from_utf8(&user)
        .ok()
        .and_then(|user| Selection::parse(user).ok());
    let Some(selection) = selection else {
        let _ = stream.write_all(&[AUTH_VERSION, 1]).await;
        return Err(Ended::Unauthenticated);
    };
    if let Err(ended) = admit(selection.pool.clone(), password).await {
        let _ = stream.write_all(&[AUTH_VERSION, 1]).await;
        return Err(ended);
    }
    write(stream, &[AUTH_VERSION, 0]).await?;
    // The request.
    let [version, command, _reserved, address_type] = read_array(stream).await?;
    if version != VERSION {
        return Err(Ended::Invalid);
    }
    let host = match address_type {
        IPV4 => Ipv4Addr::from(read_array::<4, _>(stream).await?).to_string(),
        IPV6 => format!("[{}]", Ipv6Addr::from(read_array::<16, _>(stream).await?)),
        DOMAIN => {
            let [len] = read_array(stream).await?;
            let name = read_vec(stream, len).await?;
            // Not a host name: the assign's target check refuses it below, as it refuses
            // any name that is not one.
            String::from_utf8(name).unwrap_or_default()
        }
        _ => {
            let _ = stream
                .write_all(&Reply::AddressTypeNotSupported.bytes())
                .await;
            return Err(Ended::Unsupported);
        }
    };
    let port = u16::from_be_bytes(read_array(stream).await?);
    if command != CONNECT {
        let _ = stream.write_all(&Reply::CommandNotSupported.bytes()).await;
        return Err(Ended::Unsupported);
    }
    Ok(Asked {
        selection,
        host,
        port,
    })
}

async fn read_array<const N: usize, S: AsyncRead + Unpin>(
    stream: &mut S,
) -> Result<[u8; N], Ended> {
    let mut bytes = [0; N];
    stream
        .read_exact(&mut bytes)
        .await
        .map_err(|_| Ended::Invalid)?;
    Ok(bytes)
}

async fn read_vec<S: AsyncRead + Unpin>(stream: &mut S, len: u8) -> Result<Vec<u8>, Ended> {
    let mut bytes = vec![0; usize::from(len)];
    stream
        .read_exact(&mut bytes)
        .await
        .map_err(|_| Ended::Invalid)?;
    Ok(bytes)
}

async fn write<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) -> Result<(), Ended> {
    stream.write_all(bytes).await.map_err(|_| Ended::Invalid)
}
