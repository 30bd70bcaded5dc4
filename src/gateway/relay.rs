//! A tunnel's two-way copy between the client and the member, with its idle and shutdown
//! ends.
//!
//! tokio's `copy_bidirectional` would do the copying, but it allocates each direction's
//! buffer zeroed and at one size: 8 KiB by default, whose 16 KiB of zeroing were a sixth
//! of a short tunnel's instructions, and whose size makes a bulk transfer take eight system
//! calls per 64 KiB. Here a direction's buffer is allocated uninitialised, only when its
//! first read is due, starts at [`FIRST_BUFFER`] and doubles each time one read fills it,
//! up to [`LARGEST_BUFFER`]: a short exchange keeps its small buffers (the memory per open
//! tunnel stays as it was), a download grows its own within a few reads.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::time::Instant;

use super::upstream::Connection;

/// A direction's buffer at its first read.
pub const FIRST_BUFFER: usize = 8 * 1024;

/// The most a direction's buffer grows to.
pub const LARGEST_BUFFER: usize = 64 * 1024;

/// What a relayed tunnel carried and why it ended.
#[derive(Debug, Default)]
pub(super) struct Relayed {
    /// Bytes from the client to the member.
    pub sent: u64,
    /// Bytes from the member to the client.
    pub received: u64,
    /// Why it ended: `closed`, `reset`, `idle` or `shutdown`.
    pub ended: &'static str,
}

/// Copies bytes both ways until either side closes, the tunnel is idle for `idle`, or
/// shutdown closes it.
pub(super) async fn relay<C: AsyncRead + AsyncWrite + Unpin>(
    mut client: C,
    mut upstream: Connection,
    idle: Duration,
    mut closing: watch::Receiver<bool>,
) -> Relayed {
    // Read by the idle check while the copy runs, in the same task.
    let counts = Counts::default();
    let ended = {
        let copy = copy_both_ways(&mut client, &mut upstream, &counts);
        let mut copy = std::pin::pin!(copy);
        let shutdown = closing.wait_for(|closing| *closing);
        let mut shutdown = std::pin::pin!(shutdown);
        let tick = (idle / 4).max(Duration::from_millis(10));
        let mut ticker = tokio::time::interval(tick);
        let mut last = 0;
        let mut quiet_since = Instant::now();
        loop {
            tokio::select! {
                copied = &mut copy => break if copied.is_ok() { "closed" } else { "reset" },
                _ = &mut shutdown => break "shutdown",
                _ = ticker.tick() => {
                    let total = counts.total();
                    if total != last {
                        last = total;
                        quiet_since = Instant::now();
                    } else if quiet_since.elapsed() >= idle {
                        break "idle";
                    }
                }
            }
        }
    };
    Relayed {
        sent: counts.sent.load(Ordering::Relaxed),
        received: counts.received.load(Ordering::Relaxed),
        ended,
    }
}

#[derive(Default)]
struct Counts {
    /// From the client to the upstream.
    sent: AtomicU64,
    /// From the upstream to the client.
    received: AtomicU64,
}

impl Counts {
    fn total(&self) -> u64 {
        self.sent.load(Ordering::Relaxed) + self.received.load(Ordering::Relaxed)
    }
}

/// Copies `a` to `b` and `b` to `a` until both have ended (each end shuts down the other
/// side's writing once its reading side is done, as `copy_bidirectional` does), counting
/// into `counts` as bytes are written.
///
/// # Errors
/// The first read, write, flush or shutdown error of either direction.
async fn copy_both_ways<A, B>(a: &mut A, b: &mut B, counts: &Counts) -> io::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let mut a_to_b = OneWay::new(&counts.sent);
    let mut b_to_a = OneWay::new(&counts.received);
    poll_fn(|cx| {
        let a_to_b = a_to_b.poll(cx, &mut *a, &mut *b)?;
        let b_to_a = b_to_a.poll(cx, &mut *b, &mut *a)?;
        // Both directions registered their wake-ups above before either result is used.
        ready!(a_to_b);
        ready!(b_to_a);
        Poll::Ready(Ok(()))
    })
    .await
}

/// Where one direction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Reading and writing.
    Copying,
    /// Its reader ended and every byte is written: the writer is being shut down.
    ShuttingDown,
    /// Finished.
    Done,
}

/// One direction of a tunnel: what is read from one side is written to the other.
struct OneWay<'a> {
    stage: Stage,
    /// Read and not written yet; empty (and unallocated until the first read) otherwise.
    buffer: BytesMut,
    /// The buffer's size at its next allocation.
    size: usize,
    /// The size of the buffer allocated (0: none yet).
    allocated: usize,
    /// The reader ended.
    read_done: bool,
    /// Bytes were written since the writer was last flushed.
    need_flush: bool,
    written: &'a AtomicU64,
}

impl<'a> OneWay<'a> {
    fn new(written: &'a AtomicU64) -> Self {
        Self {
            stage: Stage::Copying,
            buffer: BytesMut::new(),
            size: FIRST_BUFFER,
            allocated: 0,
            read_done: false,
            need_flush: false,
            written,
        }
    }

    fn poll<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        reader: &mut R,
        writer: &mut W,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        loop {
            match self.stage {
                Stage::Copying => {
                    ready!(self.poll_copy(cx, reader, writer))?;
                    self.stage = Stage::ShuttingDown;
                }
                Stage::ShuttingDown => {
                    ready!(Pin::new(&mut *writer).poll_shutdown(cx))?;
                    self.stage = Stage::Done;
                    // Nothing to read any more: the buffer's memory goes back now.
                    self.buffer = BytesMut::new();
                }
                Stage::Done => return Poll::Ready(Ok(())),
            }
        }
    }

    /// Copies until the reader ends and everything read is written and flushed.
    fn poll_copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        reader: &mut R,
        writer: &mut W,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        loop {
            if self.buffer.is_empty() && !self.read_done {
                // An empty buffer keeps its allocation: reserving takes it back from its
                // start rather than allocating.
                self.buffer.reserve(self.size);
                self.allocated = self.size;
                let room = self.buffer.capacity();
                match tokio_util::io::poll_read_buf(Pin::new(&mut *reader), cx, &mut self.buffer) {
                    Poll::Ready(Ok(0)) => self.read_done = true,
                    Poll::Ready(Ok(read)) => {
                        // One read filled the buffer: more is waiting, so a larger one
                        // takes it in fewer calls (allocated when this one is written out).
                        if read == room && self.size < LARGEST_BUFFER {
                            self.size = (self.size * 2).min(LARGEST_BUFFER);
                        }
                    }
                    Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                    Poll::Pending => {
                        // Nothing more to read for now: what was written must not wait in
                        // a writer's buffer (TLS to an `https` member) for the next read.
                        if self.need_flush {
                            ready!(Pin::new(&mut *writer).poll_flush(cx))?;
                            self.need_flush = false;
                        }
                        return Poll::Pending;
                    }
                }
            }
            while !self.buffer.is_empty() {
                let wrote = ready!(Pin::new(&mut *writer).poll_write(cx, &self.buffer))?;
                if wrote == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.buffer.advance(wrote);
                self.written.fetch_add(wrote as u64, Ordering::Relaxed);
                self.need_flush = true;
            }
            if self.allocated < self.size {
                // Grown: the next read gets the larger buffer, newly allocated.
                self.buffer = BytesMut::new();
            }
            if self.read_done {
                ready!(Pin::new(&mut *writer).poll_flush(cx))?;
                self.need_flush = false;
                return Poll::Ready(Ok(()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    /// Copies between the far ends of two in-memory pipes, as a tunnel between a client
    /// and a member.
    async fn tunnel(
        pipe: usize,
    ) -> (
        tokio::io::DuplexStream,
        tokio::io::DuplexStream,
        tokio::task::JoinHandle<(io::Result<()>, u64, u64)>,
    ) {
        let (client, mut client_far) = duplex(pipe);
        let (member, mut member_far) = duplex(pipe);
        let copying = tokio::spawn(async move {
            let counts = Counts::default();
            let copied = copy_both_ways(&mut client_far, &mut member_far, &counts).await;
            (
                copied,
                counts.sent.load(Ordering::Relaxed),
                counts.received.load(Ordering::Relaxed),
            )
        });
        (client, member, copying)
    }

    #[tokio::test]
    async fn bytes_cross_both_ways_in_order_and_each_end_is_passed_on() {
        let (mut client, mut member, copying) = tunnel(1024).await;
        // More than the largest buffer, through pipes smaller than the first: many reads
        // and partial writes each way.
        let upload: Vec<u8> = (0..200_000_u32).map(|i| (i % 251) as u8).collect();
        let download: Vec<u8> = (0..300_000_u32).map(|i| (i % 241) as u8).collect();
        let (sent, received) = {
            let (upload, download) = (upload.clone(), download.clone());
            let (mut client_read, mut client_write) = tokio::io::split(&mut client);
            let (mut member_read, mut member_write) = tokio::io::split(&mut member);
            // Each side sends and reads at once, as a real client and member do: one that
            // only read after sending all would wait on the other for ever.
            let client_side = async {
                let sending = async {
                    client_write.write_all(&upload).await.expect("uploaded");
                    client_write.shutdown().await.expect("client done");
                };
                let mut got = Vec::new();
                let reading = client_read.read_to_end(&mut got);
                let ((), read) = tokio::join!(sending, reading);
                read.expect("downloaded");
                got
            };
            let member_side = async {
                let sending = async {
                    member_write.write_all(&download).await.expect("served");
                    member_write.shutdown().await.expect("member done");
                };
                let mut got = Vec::new();
                let reading = member_read.read_to_end(&mut got);
                let ((), read) = tokio::join!(sending, reading);
                read.expect("received");
                got
            };
            let (downloaded, uploaded) = tokio::join!(client_side, member_side);
            (uploaded, downloaded)
        };
        assert!(sent == upload, "the upload arrived whole and in order");
        assert!(
            received == download,
            "the download arrived whole and in order"
        );
        let (copied, up, down) = copying.await.expect("the copy ran");
        assert!(copied.is_ok(), "{copied:?}");
        assert_eq!((up, down), (200_000, 300_000));
    }

    #[tokio::test]
    async fn a_direction_keeps_working_after_the_other_has_ended() {
        let (mut client, mut member, copying) = tunnel(64 * 1024).await;
        client
            .write_all(b"GET / HTTP/1.1\r\n\r\n")
            .await
            .expect("sent");
        client.shutdown().await.expect("the client is done sending");
        let mut request = [0; 18];
        member.read_exact(&mut request).await.expect("request");
        let mut end = [0; 1];
        let read = tokio::time::timeout(Duration::from_secs(10), member.read(&mut end)).await;
        assert_eq!(
            read.expect("the end, in time").expect("the end"),
            0,
            "the end passed on"
        );
        member
            .write_all(b"HTTP/1.1 200 OK\r\n\r\nok")
            .await
            .expect("answered");
        drop(member);
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.expect("the answer");
        assert_eq!(answer, b"HTTP/1.1 200 OK\r\n\r\nok");
        let (copied, up, down) = copying.await.expect("the copy ran");
        assert!(copied.is_ok(), "{copied:?}");
        assert_eq!((up, down), (18, 21));
    }

    /// The size a direction's buffer ends at after copying `bytes` bytes that are all
    /// ready at once.
    fn final_size(bytes: usize) -> usize {
        let counted = AtomicU64::new(0);
        let mut way = OneWay::new(&counted);
        let data = vec![7; bytes];
        let mut reader: &[u8] = &data;
        let mut writer = Vec::new();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // A slice and a Vec are always ready: one poll copies everything.
        assert!(way.poll(&mut cx, &mut reader, &mut writer).is_ready());
        assert_eq!(writer, data);
        assert_eq!(counted.load(Ordering::Relaxed), bytes as u64);
        way.size
    }

    #[test]
    fn a_buffer_that_one_read_fills_doubles_up_to_the_largest_and_a_short_one_stays() {
        assert_eq!(final_size(100), FIRST_BUFFER);
        assert_eq!(final_size(FIRST_BUFFER), 2 * FIRST_BUFFER);
        assert_eq!(
            final_size(FIRST_BUFFER + 2 * FIRST_BUFFER),
            4 * FIRST_BUFFER
        );
        assert_eq!(final_size(1 << 20), LARGEST_BUFFER);
    }
}
