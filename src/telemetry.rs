//! Logging setup: `tracing` with JSON lines when not on a terminal.
//!
//! Every line written while a request is served carries its request id: the log layer
//! runs the request inside [`serving_request`], and both formats read the id from there.
//! (A tracing span per request did the same at several times the cost.)
//!
//! The service writes one line per request, so a line must not cost the request a system
//! call or a wake-up of another thread: lines are appended to one shared 64 KiB buffer,
//! written out when it fills up and at least every 100 ms by a background task, and once
//! more when the returned guard is dropped at exit. (Standard output on its own flushes
//! every line; a channel to a writer thread wakes that thread for every line.)

use std::cell::Cell;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::http::HeaderValue;
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

use crate::config::LogFormat;

mod json_lines;

/// The request the current task is serving, as the log layer and the log lines see it.
struct Serving {
    /// Its request id.
    id: HeaderValue,
    /// What its handler did (see [`set_outcome`]).
    outcome: Cell<Option<&'static str>>,
}

tokio::task_local! {
    /// The request the current task is serving.
    static SERVING: Serving;
}

/// Runs `serve` with `id` as the request id of every line it logs.
pub async fn serving_request<F: Future>(id: HeaderValue, serve: F) -> F::Output {
    let serving = Serving {
        id,
        outcome: Cell::new(None),
    };
    SERVING.scope(serving, serve).await
}

/// Notes what the handler of the request being served did (`assigned`, `released`, ...)
/// for its log line and metrics; outside [`serving_request`] it is dropped. A task-local
/// rather than a response extension: the extension cost every assign a map of its own.
pub fn set_outcome(outcome: &'static str) {
    let _ = SERVING.try_with(|serving| serving.outcome.set(Some(outcome)));
}

/// What [`set_outcome`] noted for the request being served, if anything.
pub fn outcome() -> Option<&'static str> {
    SERVING
        .try_with(|serving| serving.outcome.get())
        .ok()
        .flatten()
}

/// Runs `with` on the id of the request being served, if any.
fn with_request_id<R>(with: impl FnOnce(&HeaderValue) -> R) -> Option<R> {
    SERVING.try_with(|serving| with(&serving.id)).ok()
}

/// The text format with the request id, when there is one, as the last field.
struct TextWithRequestId<F>(F);

impl<S, N, F> FormatEvent<S, N> for TextWithRequestId<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let Some(id) = with_request_id(HeaderValue::clone) else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        writer.write_str(line.trim_end_matches('\n'))?;
        writer.write_str(" request_id=")?;
        writer.write_str(id.to_str().unwrap_or_default())?;
        writer.write_str("\n")
    }
}

/// How much log text is gathered before it is written out.
const BUFFER_BYTES: usize = 64 * 1024;
/// The longest a line waits in the buffer.
const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// Standard output behind one buffer shared by every thread.
#[derive(Clone)]
struct BufferedStdout(Arc<Mutex<std::io::BufWriter<std::io::Stdout>>>);

impl BufferedStdout {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(std::io::BufWriter::with_capacity(
            BUFFER_BYTES,
            std::io::stdout(),
        ))))
    }

    fn flush(&self) {
        // A poisoned lock only means a panic while a line was appended: keep logging.
        let mut out = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = out.flush();
    }
}

/// One line being appended; the buffer writes itself out when full.
struct Line<'a>(std::sync::MutexGuard<'a, std::io::BufWriter<std::io::Stdout>>);

impl Write for Line<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.write(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // Flushing per line is exactly what this writer avoids; the task flushes.
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BufferedStdout {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Line(self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Flushes the log buffer when dropped; keep it alive for as long as the service runs.
#[must_use = "dropping the guard stops the periodic flush"]
pub struct LogGuard {
    out: Option<BufferedStdout>,
    flusher: Option<std::thread::JoinHandle<()>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(flusher) = self.flusher.take() {
            flusher.thread().unpark();
            let _ = flusher.join();
        }
        if let Some(out) = &self.out {
            out.flush();
        }
    }
}

fn filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
}

/// Whether the service logs in the text format, for a person at a terminal; set once by
/// [`init`]. Off until then (tests, and the JSON format), so that a line written only for
/// readers of text never reaches a log pipeline.
static TEXT_FORMAT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether log lines go out in the text format: startup then says in plain words what a
/// person needs first (where the dashboard is, the generated admin token), which the JSON
/// format carries in fields.
pub fn is_text() -> bool {
    TEXT_FORMAT.load(std::sync::atomic::Ordering::Relaxed)
}

/// Installs the global subscriber for the service, writing to standard output through the
/// shared buffer.
pub fn init(format: LogFormat) -> LogGuard {
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stdout().is_terminal(),
    };
    TEXT_FORMAT.store(!json, std::sync::atomic::Ordering::Relaxed);
    let out = BufferedStdout::new();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(out.clone());
    // Ignore the error of a second installation: the first subscriber stays.
    let _ = if json {
        builder.event_format(json_lines::JsonLines).try_init()
    } else {
        // Set on the format, not the builder: `TextWithRequestId` hands the format a writer
        // of its own, which knows nothing of the builder's setting.
        let text = tracing_subscriber::fmt::format().with_ansi(std::io::stdout().is_terminal());
        builder.event_format(TextWithRequestId(text)).try_init()
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let out = out.clone();
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("log-flush".to_owned())
            .spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::park_timeout(FLUSH_EVERY);
                    out.flush();
                }
            })
            .ok()
    };
    LogGuard {
        out: Some(out),
        flusher,
        stop,
    }
}

/// Installs a subscriber that writes synchronously through the test harness's capture, for
/// tests that start many applications in one process. Calling it again is harmless.
pub fn init_for_tests() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_test_writer()
        .try_init();
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::http::HeaderValue;
    use tracing_subscriber::fmt::format::DefaultFields;
    use tracing_subscriber::registry::Registry;

    use super::*;

    /// What `emit` logs through a subscriber using `format`.
    pub(super) fn captured<E>(format: E, emit: impl FnOnce()) -> String
    where
        E: FormatEvent<Registry, DefaultFields> + Send + Sync + 'static,
    {
        let buffer = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = Arc::clone(&buffer);
        let subscriber = tracing_subscriber::fmt()
            .event_format(format)
            .with_writer(move || Sink(Arc::clone(&sink)))
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = buffer.lock().expect("buffer").clone();
        String::from_utf8(bytes).expect("utf-8")
    }

    /// A writer into a shared buffer.
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("buffer").extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn text_lines_written_while_serving_a_request_end_with_its_id() {
        let format = tracing_subscriber::fmt::format()
            .with_ansi(false)
            .without_time();
        let text = captured(TextWithRequestId(format), || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a runtime");
            runtime.block_on(serving_request(HeaderValue::from_static("abc-1"), async {
                tracing::info!(n = 1, "inside");
            }));
            tracing::info!("outside");
        });
        assert_eq!(
            text.lines().collect::<Vec<_>>(),
            [
                " INFO proxy_allocator::telemetry::tests: inside n=1 request_id=abc-1",
                " INFO proxy_allocator::telemetry::tests: outside",
            ]
        );
    }
}
