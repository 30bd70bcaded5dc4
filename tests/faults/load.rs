//! Workers that assign in a loop and record every answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// One answer as a worker saw it.
#[derive(Debug, Clone)]
pub struct Answer {
    /// When the request was sent, from the start of the load.
    pub sent: Duration,
    /// How long the answer took.
    pub took: Duration,
    /// HTTP status, or `None` when the request failed at the connection level.
    pub status: Option<u16>,
    /// The error code of an error body.
    pub code: Option<String>,
    /// Whether `Retry-After` was present.
    pub retry_after: bool,
    /// The proxy of a 200.
    pub proxy: Option<String>,
    /// The member's count in a 200.
    pub assignments: Option<u64>,
}

/// A running load; `stop` ends it and returns every answer.
pub struct Load {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    workers: Vec<tokio::task::JoinHandle<Vec<Answer>>>,
    /// When the load started.
    pub started: Instant,
}

impl Load {
    /// Starts `clients` workers, each on its own connection, assigning from `pool` on the
    /// services at `bases` (worker `i` uses `bases[i % bases.len()]`).
    pub fn start(bases: &[String], pool: &str, clients: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let workers = (0..clients)
            .map(|i| {
                let url = format!("{}/pools/{pool}/assign", bases[i % bases.len()]);
                let stop = Arc::clone(&stop);
                let answered = Arc::clone(&answered);
                tokio::spawn(async move {
                    let client = reqwest::Client::builder()
                        .timeout(Duration::from_secs(10))
                        .build()
                        .expect("a client");
                    let mut answers = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let answer = one(&client, &url, started).await;
                        if answer.status.is_none() {
                            // Nobody listens (yet, or any more): do not spin.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        answers.push(answer);
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    answers
                })
            })
            .collect();
        Self {
            stop,
            answered,
            workers,
            started,
        }
    }

    /// How many answers (of any kind) have come back so far.
    pub fn answered(&self) -> usize {
        self.answered.load(Ordering::Relaxed)
    }

    /// Waits until `count` answers (of any kind) have come back; fails after `limit`.
    pub async fn await_answers(&self, count: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.answered.load(Ordering::Relaxed) < count {
            assert!(
                Instant::now() < deadline,
                "only {} of {count} answers within {limit:?}",
                self.answered.load(Ordering::Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops the workers and collects their answers.
    pub async fn stop(self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for worker in self.workers {
            all.extend(worker.await.expect("worker finished"));
        }
        all.sort_by_key(|a| a.sent);
        all
    }
}

async fn one(client: &reqwest::Client, url: &str, started: Instant) -> Answer {
    let sent = started.elapsed();
    let begun = Instant::now();
    match client.post(url).send().await {
        Err(_) => Answer {
            sent,
            took: begun.elapsed(),
            status: None,
            code: None,
            retry_after: false,
            proxy: None,
            assignments: None,
        },
        Ok(response) => {
            let status = response.status().as_u16();
            let retry_after = response.headers().contains_key("retry-after");
            let body: serde_json::Value = response.json().await.unwrap_or(serde_json::Value::Null);
            Answer {
                sent,
                took: begun.elapsed(),
                status: Some(status),
                code: body["error"]["code"].as_str().map(str::to_owned),
                retry_after,
                proxy: body["proxy"].as_str().map(str::to_owned),
                assignments: body["assignments"].as_u64(),
            }
        }
    }
}

/// How many answers had each status (`None` = connection error).
pub fn tally(answers: &[Answer]) -> std::collections::BTreeMap<Option<u16>, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for answer in answers {
        *counts.entry(answer.status).or_insert(0) += 1;
    }
    counts
}
