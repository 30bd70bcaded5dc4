//! `proxy-allocator clients create|list|show|rotate|delete`: the clients of a running
//! service (`/clients`), with the admin token.

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::render::Report;
use super::service::{Body, Service};
use super::{Failure, Remote, print};
use crate::domain::ClientId;

/// `proxy-allocator clients ...`.
#[derive(Debug, Args)]
pub struct ClientsArgs {
    /// How to reach the service.
    #[command(flatten)]
    pub remote: Remote,
    /// What to do with clients.
    #[command(subcommand)]
    pub command: ClientsCommand,
}

/// Client commands.
#[derive(Debug, Subcommand)]
pub enum ClientsCommand {
    /// Create a client (its token is printed this once) or replace what it may use.
    Create {
        /// The client.
        #[arg(value_parser = ClientId::parse)]
        client: ClientId,
        /// A pool it may use: an id, or a prefix followed by `*`; repeat for more.
        #[arg(long = "pool", value_name = "POOL")]
        pools: Vec<String>,
        /// Its rate limit: assigns a second in each pool it uses (1 to 100,000).
        #[arg(long, value_name = "N")]
        rate_per_second: Option<u64>,
        /// The most assigns it may make at once in a pool (1 to 1,000,000; the rate when
        /// left out).
        #[arg(long, value_name = "N", requires = "rate_per_second")]
        burst: Option<u64>,
    },
    /// List every client with its pools.
    List,
    /// Show one client.
    Show {
        /// The client.
        #[arg(value_parser = ClientId::parse)]
        client: ClientId,
    },
    /// Give a client a new token (printed this once); the old one stops working at once.
    Rotate {
        /// The client.
        #[arg(value_parser = ClientId::parse)]
        client: ClientId,
    },
    /// Delete a client; its token stops working at once.
    Delete {
        /// The client.
        #[arg(value_parser = ClientId::parse)]
        client: ClientId,
    },
}

/// A client's line: its id, its pools and, when it has one, its rate limit.
fn line(client: &Value) -> String {
    let pools: Vec<&str> = client["pools"]
        .as_array()
        .map(|pools| pools.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let rate = match (client["rate_per_second"].as_u64(), client["burst"].as_u64()) {
        (Some(rate), Some(burst)) => format!("\t{rate}/s burst {burst}"),
        _ => String::new(),
    };
    format!(
        "{}\t{}{rate}\n",
        client["client"].as_str().unwrap_or_default(),
        pools.join(",")
    )
}

/// The token lines of an answer that carries one: shown once, so said so.
fn token_lines(client: &ClientId, answer: &Value) -> String {
    format!(
        "client {client}: token {}\n(shown this once: the service keeps only its hash)\n",
        answer["token"].as_str().unwrap_or_default()
    )
}

pub(super) async fn run(remote: &Remote, command: ClientsCommand) -> Result<(), Failure> {
    let service = Service::new(remote)?;
    match command {
        ClientsCommand::Create {
            client,
            pools,
            rate_per_second,
            burst,
        } => {
            let mut body = json!({ "pools": pools });
            if let Some(rate) = rate_per_second {
                body["rate_per_second"] = json!(rate);
            }
            if let Some(burst) = burst {
                body["burst"] = json!(burst);
            }
            let (_, answer) = service
                .send(
                    reqwest::Method::PUT,
                    &format!("/clients/{client}"),
                    Body::Json(body),
                )
                .await?;
            let answer = answer.unwrap_or_default();
            let text = if answer.get("token").is_some() {
                token_lines(&client, &answer)
            } else {
                format!("client {client}: configuration replaced, token kept\n")
            };
            print(remote, &answer, Report::done(text))
        }
        ClientsCommand::List => {
            let answer = service.get("/clients").await?;
            let text: String = answer["clients"]
                .as_array()
                .map(|clients| clients.iter().map(line).collect())
                .unwrap_or_default();
            print(remote, &answer, Report::done(text))
        }
        ClientsCommand::Show { client } => {
            let answer = service.get(&format!("/clients/{client}")).await?;
            print(remote, &answer, Report::done(line(&answer)))
        }
        ClientsCommand::Rotate { client } => {
            let (_, answer) = service
                .send(
                    reqwest::Method::POST,
                    &format!("/clients/{client}/token"),
                    Body::None,
                )
                .await?;
            let answer = answer.unwrap_or_default();
            let text = token_lines(&client, &answer);
            print(remote, &answer, Report::done(text))
        }
        ClientsCommand::Delete { client } => {
            service
                .send(
                    reqwest::Method::DELETE,
                    &format!("/clients/{client}"),
                    Body::None,
                )
                .await?;
            let answer = json!({ "client": client, "deleted": true });
            print(
                remote,
                &answer,
                Report::done(format!("deleted client {client}\n")),
            )
        }
    }
}
