//! A TCP proxy between the service and Redis that can delay, stall or cut traffic.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// What the proxy does with bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward at once.
    Pass,
    /// Hold every chunk this long before forwarding it.
    Delay(Duration),
    /// Forward nothing until the mode changes.
    Stall,
}

/// The proxy; dropping it closes everything.
pub struct ChaosProxy {
    addr: SocketAddr,
    mode: Arc<watch::Sender<Mode>>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl ChaosProxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bound");
        let addr = listener.local_addr().expect("an address");
        let (mode, _) = watch::channel(Mode::Pass);
        let mode = Arc::new(mode);
        let connections = Arc::new(Mutex::new(Vec::new()));
        let accept = {
            let mode = Arc::clone(&mode);
            let connections = Arc::clone(&connections);
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        continue;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    let up = tokio::spawn(pump(client_read, server_write, mode.subscribe()));
                    let down = tokio::spawn(pump(server_read, client_write, mode.subscribe()));
                    let mut open = connections.lock().expect("not poisoned");
                    open.push(up.abort_handle());
                    open.push(down.abort_handle());
                }
            })
            .abort_handle()
        };
        Self {
            addr,
            mode,
            connections,
            accept,
        }
    }

    /// `redis://` URL of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Changes what happens to bytes from now on, on every connection.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Closes every open connection at once, as a network failure would.
    pub fn cut(&self) {
        for handle in self.connections.lock().expect("not poisoned").drain(..) {
            handle.abort();
        }
    }
}

impl Drop for ChaosProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            let current = *mode.borrow_and_update();
            match current {
                Mode::Pass => break,
                Mode::Delay(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Mode::Stall => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
