//! A TCP proxy between the service and Redis that can delay, stall or cut traffic.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    evalshas: Arc<AtomicUsize>,
}

impl ChaosProxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bound");
        let addr = listener.local_addr().expect("an address");
        let (mode, _) = watch::channel(Mode::Pass);
        let mode = Arc::new(mode);
        let connections = Arc::new(Mutex::new(Vec::new()));
        let evalshas = Arc::new(AtomicUsize::new(0));
        let accept = {
            let mode = Arc::clone(&mode);
            let connections = Arc::clone(&connections);
            let evalshas = Arc::clone(&evalshas);
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        continue;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    let up = tokio::spawn(pump(
                        client_read,
                        server_write,
                        mode.subscribe(),
                        Some(Arc::clone(&evalshas)),
                    ));
                    let down =
                        tokio::spawn(pump(server_read, client_write, mode.subscribe(), None));
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
            evalshas,
        }
    }

    /// How many EVALSHA commands have arrived from the service so far, whether or not they
    /// were passed on yet: in `Stall` mode, the requests waiting for Redis inside the
    /// service.
    pub fn evalshas(&self) -> usize {
        self.evalshas.load(Ordering::SeqCst)
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

/// Forwards bytes from `from` to `to` under the current mode. Bytes are read as they
/// arrive, whatever the mode (and counted, when `evalshas` is given); what has piled up
/// while a chunk was held goes on together, as it would from a socket buffer.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    evalshas: Option<Arc<AtomicUsize>>,
) {
    const COMMAND: &[u8] = b"evalsha";
    let (chunks, mut pending) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        // The end of the previous chunk, so that a command name cut in two is counted.
        let mut tail: Vec<u8> = Vec::new();
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if let Some(evalshas) = &evalshas {
                let mut seen = std::mem::take(&mut tail);
                seen.extend_from_slice(&buf[..n]);
                let found = seen
                    .windows(COMMAND.len())
                    .filter(|w| w.eq_ignore_ascii_case(COMMAND))
                    .count();
                evalshas.fetch_add(found, Ordering::SeqCst);
                tail = seen[seen.len().saturating_sub(COMMAND.len() - 1)..].to_vec();
            }
            if chunks.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    };
    let write = async move {
        while let Some(mut batch) = pending.recv().await {
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
            while let Ok(more) = pending.try_recv() {
                batch.extend_from_slice(&more);
            }
            if to.write_all(&batch).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(read, write);
}
