//! `proxy-allocator demo`: the service as `serve` runs it (embedded store in memory, the
//! gateway on, the dashboard), with a pool `demo` of forward proxies it runs itself on
//! loopback ([`local`]), some of them slow or failing on purpose, so that a newcomer sees
//! assignments, outcome reports, trips and bans without proxies of their own.
//!
//! It sits above [`crate::startup`]: it starts the same [`Application`], seeds the pool
//! through the API like any operator would, and prints what to try in plain text.

pub mod local;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};

use self::local::{Behaviour, Network};
use crate::cli::DemoArgs;
use crate::config::Config;
use crate::startup::{self, Application, StartupError};

/// The pool the demo creates.
pub const POOL: &str = "demo";

/// How long the slow proxy waits before it forwards a request.
pub const SLOW_DELAY: Duration = Duration::from_millis(1_500);

/// The demo's proxies, in the order they are seeded.
pub const BEHAVIOURS: [Behaviour; 4] = [
    Behaviour::Healthy,
    Behaviour::Healthy,
    Behaviour::Slow(SLOW_DELAY),
    Behaviour::Failing,
];

/// Why the demo could not start.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The local proxies or the site could not be bound.
    #[error("cannot start the local proxies: {0}")]
    Network(#[source] std::io::Error),
    /// The service could not start.
    #[error(transparent)]
    Startup(#[from] StartupError),
    /// The service refused or did not answer the pool's creation or seeding.
    #[error("cannot set up pool {POOL}: {0}")]
    Seed(String),
    /// The server failed while running.
    #[error("server failed: {0}")]
    Server(#[source] std::io::Error),
}

/// The configuration the demo runs the service with: every default of `serve` (as its
/// environment gives them), but always the embedded store in memory, no worker token (so
/// only loopback addresses start) and the gateway on.
pub fn config(args: &DemoArgs, admin_token: String) -> Config {
    let mut config = Config::defaults();
    config.listen = args.listen;
    config.gateway_listen = Some(args.gateway_listen);
    config.admin_token = Some(admin_token);
    config.admin_token_file = None;
    config.worker_token = None;
    config.worker_token_file = None;
    config.allow_anonymous_workers = false;
    config.redis_url = None;
    config.redis_cluster_urls = None;
    config.redis_sentinel_urls = None;
    config.data_dir = None;
    config.log_format = args.log_format;
    config
}

/// The demo pool's configuration: loopback members allowed; two failures in a row trip a
/// member for 10 s, doubling with each repeated trip up to a minute, so that the failing
/// proxy is seen going out and coming back within a minute.
pub fn pool_config() -> Value {
    json!({
        "rules": {"allow_private": true},
        "health": {
            "max_consecutive_failures": 2,
            "cooldown_ms": 10_000,
            "max_cooldown_ms": 60_000
        }
    })
}

/// Runs the demo until `shutdown` completes: starts the local proxies and the service,
/// creates and seeds the pool, prints what to try, and serves.
///
/// # Errors
/// A [`DemoError`] when something cannot start, or the server fails.
pub async fn run(
    args: DemoArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DemoError> {
    let network = Network::start(&BEHAVIOURS)
        .await
        .map_err(DemoError::Network)?;
    let admin_token = args
        .admin_token
        .clone()
        .unwrap_or_else(startup::random_token);
    let app = Application::build(config(&args, admin_token.clone())).await?;
    let api = app.local_addr();
    // Present whenever the configuration names it, which `config` always does.
    let gateway = app.gateway_addr().unwrap_or(args.gateway_listen);
    let server = tokio::spawn(app.run_until_stopped(shutdown));
    // The listeners are bound already: the seeding waits in their backlog until they
    // serve.
    if let Err(error) = seed(api, &admin_token, &network).await {
        server.abort();
        return Err(error);
    }
    print!("{}", banner(api, gateway, &admin_token, &network));
    let result = server
        .await
        .map_err(|error| DemoError::Server(std::io::Error::other(error)))?;
    drop(network);
    result.map_err(DemoError::Server)
}

/// Creates the pool and adds the local proxies, each labelled `kind=` its behaviour.
async fn seed(api: SocketAddr, admin_token: &str, network: &Network) -> Result<(), DemoError> {
    let failure = |error: reqwest::Error| DemoError::Seed(error.to_string());
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(failure)?;
    let members: Vec<Value> = network
        .proxies
        .iter()
        .map(|proxy| json!({"member": proxy.member(), "labels": {"kind": proxy.behaviour.kind()}}))
        .collect();
    let requests = [
        (
            reqwest::Method::PUT,
            format!("/pools/{POOL}"),
            pool_config(),
        ),
        (
            reqwest::Method::POST,
            format!("/pools/{POOL}/members"),
            json!({"members": members}),
        ),
    ];
    for (method, path, body) in requests {
        let response = http
            .request(method, format!("http://{api}{path}"))
            .bearer_auth(admin_token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(failure)?;
        if !response.status().is_success() {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            return Err(DemoError::Seed(format!("{path} answered {status}: {text}")));
        }
    }
    Ok(())
}

/// What the demo prints once it serves: the pool, the dashboard with the admin token, and
/// the commands to try, each line a label and a text to copy.
pub fn banner(
    api: SocketAddr,
    gateway: SocketAddr,
    admin_token: &str,
    network: &Network,
) -> String {
    let count = |kind: &str| {
        network
            .proxies
            .iter()
            .filter(|proxy| proxy.behaviour.kind() == kind)
            .count()
    };
    let proxies: Vec<String> = network
        .proxies
        .iter()
        .map(|proxy| format!("{} ({})", proxy.member(), proxy.behaviour.kind()))
        .collect();
    let dashboard = startup::dashboard_url(api);
    let site = network.site;
    format!(
        "proxy-allocator demo: pool \"{POOL}\" with {total} local proxies ({healthy} healthy, \
         {slow} slow, {failing} failing)\n\
         proxies:    {proxies}\n\
         dashboard:  {dashboard}  (admin token: {admin_token})\n\
         assign:     curl -s -X POST http://{api}/pools/{POOL}/assign\n\
         gateway:    curl -x http://{POOL}:any@{gateway} http://{site}/\n\
         members:    ADMIN_TOKEN={admin_token} proxy-allocator members list {POOL} --url http://{api}\n\
         Stop it with Ctrl-C; nothing is kept.\n",
        total = network.proxies.len(),
        healthy = count("healthy"),
        slow = count("slow"),
        failing = count("failing"),
        proxies = proxies.join(", "),
    )
}
