//! Test harness for topologies of several Redis processes: a Redis Cluster built with
//! `redis-cli --cluster create`, and a primary with a replica watched by a Sentinel.
//! Dropping either stops every process it started.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::helpers::redis_server::free_port;
use crate::helpers::{RedisServer, redis_cli};

/// Polls `ready` every 50 ms until it holds; panics naming `what` after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The text of a reply (`INFO`, `CLUSTER NODES`), or an empty string for anything else.
fn reply_text(value: redis::Value) -> String {
    match value {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        redis::Value::VerbatimString { text, .. } | redis::Value::SimpleString(text) => text,
        _ => String::new(),
    }
}

/// Sends one command, or `None` when the server does not answer (it may be killed).
fn try_cli(url: &str, args: &[&str]) -> Option<redis::Value> {
    let client = redis::Client::open(url).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut conn).ok()
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
pub struct ClusterNode {
    /// The node id.
    pub id: String,
    /// Its client port.
    pub port: u16,
    /// Whether it is a primary not marked failed.
    pub serving_primary: bool,
    /// The id of its primary, for a replica.
    pub primary_id: Option<String>,
    /// The slot ranges it serves, inclusive.
    pub slots: Vec<(u16, u16)>,
}

fn parse_nodes(listing: &str) -> Vec<ClusterNode> {
    listing
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = fields
                .get(1)?
                .split(['@', ','])
                .next()?
                .rsplit(':')
                .next()?;
            let flags: Vec<&str> = fields.get(2)?.split(',').collect();
            let slots = fields
                .iter()
                .skip(8)
                .filter(|range| !range.starts_with('['))
                .filter_map(|range| {
                    let (low, high) = range.split_once('-').unwrap_or((range, range));
                    Some((low.parse().ok()?, high.parse().ok()?))
                })
                .collect();
            Some(ClusterNode {
                id: fields[0].to_owned(),
                port: port.parse().ok()?,
                serving_primary: flags.contains(&"master") && !flags.contains(&"fail"),
                primary_id: fields
                    .get(3)
                    .filter(|id| **id != "-")
                    .map(|id| (*id).to_owned()),
                slots,
            })
        })
        .collect()
}

/// A Redis Cluster of three primaries with one replica each, on loopback.
///
/// Nodes run with `cluster-node-timeout 1000` so that a failover takes seconds, and with
/// `cluster-require-full-coverage no` so that the other primaries keep serving while one
/// slot range has no primary (with the default `yes` the whole cluster refuses commands
/// until the failover completes).
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts six nodes, joins them with `redis-cli --cluster create --cluster-replicas 1`
    /// and waits until every node reports `cluster_state:ok` and knows all six.
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled".to_owned(),
                    "yes".to_owned(),
                    "--cluster-config-file".to_owned(),
                    "nodes.conf".to_owned(),
                    "--cluster-node-timeout".to_owned(),
                    "1000".to_owned(),
                    "--cluster-require-full-coverage".to_owned(),
                    "no".to_owned(),
                    // The bus port defaults to port + 10000, which may be taken or too high.
                    "--cluster-port".to_owned(),
                    free_port().to_string(),
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli runs (apt-get install redis-tools)");
        assert!(
            created.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        let cluster = Self { nodes };
        wait_until(
            "every node sees a whole cluster",
            Duration::from_secs(15),
            || {
                cluster.nodes.iter().all(|node| {
                    let info = reply_text(redis_cli(&node.url(), &["CLUSTER", "INFO"]));
                    info.contains("cluster_state:ok")
                        && parse_nodes(&reply_text(redis_cli(&node.url(), &["CLUSTER", "NODES"])))
                            .len()
                            == 6
                })
            },
        );
        // A replica must have synchronised before it can take over.
        wait_until("every replica in sync", Duration::from_secs(15), || {
            cluster.nodes.iter().all(|node| {
                let info = reply_text(redis_cli(&node.url(), &["INFO", "replication"]));
                info.contains("role:master") || info.contains("master_link_status:up")
            })
        });
        cluster
    }

    /// Comma-separated URLs of every node, for `REDIS_CLUSTER_URLS`.
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `CLUSTER NODES` as seen by the first node still answering.
    pub fn nodes(&self) -> Vec<ClusterNode> {
        self.nodes
            .iter()
            .find_map(|node| try_cli(&node.url(), &["CLUSTER", "NODES"]))
            .map(|listing| parse_nodes(&reply_text(listing)))
            .expect("a node that answers")
    }

    /// The hash slot of `key` (of its hash tag, when it has one).
    pub fn slot(&self, key: &str) -> u16 {
        let reply = self
            .nodes
            .iter()
            .find_map(|node| try_cli(&node.url(), &["CLUSTER", "KEYSLOT", key]));
        match reply {
            Some(redis::Value::Int(slot)) => u16::try_from(slot).expect("a slot"),
            other => panic!("unexpected KEYSLOT reply {other:?}"),
        }
    }

    /// The port of the primary that serves `slot` now.
    pub fn primary_for(&self, slot: u16) -> u16 {
        self.nodes()
            .iter()
            .find(|node| {
                node.serving_primary
                    && node
                        .slots
                        .iter()
                        .any(|(low, high)| (*low..=*high).contains(&slot))
            })
            .map(|node| node.port)
            .expect("a primary serving the slot")
    }

    /// The port of the replica of the primary on `primary_port`.
    pub fn replica_of(&self, primary_port: u16) -> u16 {
        let nodes = self.nodes();
        let primary = nodes
            .iter()
            .find(|node| node.port == primary_port)
            .expect("the primary");
        nodes
            .iter()
            .find(|node| node.primary_id.as_deref() == Some(primary.id.as_str()))
            .map(|node| node.port)
            .expect("a replica")
    }

    /// The ports of the primaries serving slots now.
    pub fn primaries(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .nodes()
            .iter()
            .filter(|node| node.serving_primary && !node.slots.is_empty())
            .map(|node| node.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The URL of the node on `port`.
    pub fn url(&self, port: u16) -> String {
        format!("redis://127.0.0.1:{port}")
    }

    /// Kills the node on `port` with SIGKILL, as a crash would.
    pub fn kill(&mut self, port: u16) {
        self.nodes
            .iter_mut()
            .find(|node| node.port() == port)
            .expect("a node on that port")
            .kill();
    }
}

/// A primary, its replica and one Sentinel watching them as `master`, on loopback. The
/// Sentinel declares the primary down after one second and promotes the replica.
pub struct SentinelGroup {
    /// The primary at start.
    pub primary: RedisServer,
    /// Its replica, promoted by the failover.
    pub replica: RedisServer,
    /// The Sentinel.
    pub sentinel: RedisServer,
}

/// The name the Sentinel monitors the primary under.
pub const MASTER_NAME: &str = "main";

impl SentinelGroup {
    /// Starts the three processes and waits until the replica is in sync and the Sentinel
    /// knows it (it can only promote a replica it knows).
    pub fn start() -> Self {
        let primary = RedisServer::start();
        let replica = RedisServer::start_with(&[
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            primary.port().to_string(),
        ]);
        wait_until("the replica in sync", Duration::from_secs(10), || {
            reply_text(redis_cli(&replica.url(), &["INFO", "replication"]))
                .contains("master_link_status:up")
        });
        let sentinel = RedisServer::start_sentinel(MASTER_NAME, primary.port(), 1000, 3000);
        let group = Self {
            primary,
            replica,
            sentinel,
        };
        wait_until(
            "the Sentinel knows the replica",
            Duration::from_secs(15),
            || match redis_cli(
                &group.sentinel.url(),
                &["SENTINEL", "REPLICAS", MASTER_NAME],
            ) {
                redis::Value::Array(replicas) => !replicas.is_empty(),
                _ => false,
            },
        );
        group
    }

    /// `host:port` of the primary the Sentinel names now.
    pub fn master_addr(&self) -> String {
        match redis_cli(
            &self.sentinel.url(),
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
        ) {
            redis::Value::Array(parts) => parts
                .into_iter()
                .map(reply_text)
                .collect::<Vec<_>>()
                .join(":"),
            other => panic!("unexpected reply {other:?}"),
        }
    }
}
