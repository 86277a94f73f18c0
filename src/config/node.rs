//! `[node]`: this node's identity, storage and HTTP API. Types, defaults
//! and the checks that need nothing but the values.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::problem::Problems;
pub use crate::tls::config::HttpTlsConfig;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Raft node id, unique in the cluster, never reused for another machine.
    pub id: u64,
    /// Availability zone name, shown in status and coverage.
    pub zone: String,
    /// Directory for sled, snapshots and the dead-letter store.
    pub data_dir: PathBuf,
    /// Address of the HTTP API (status, metrics, health).
    #[serde(default = "default_http_listen")]
    pub http_listen: SocketAddr,
    /// Free space kept on the data directory's filesystem. Below it the node
    /// stops writing new entries: it holds upstream acks (the broker keeps
    /// the messages), refuses replication, says so on `/readyz`, and resumes
    /// by itself when space returns. It must cover what a node writes after
    /// the check: a snapshot of the window and a few batches.
    #[serde(default = "default_disk_reserve")]
    pub disk_reserve_bytes: u64,
    /// Longest a shutdown (SIGTERM, SIGINT) takes, whatever the cluster's
    /// state. Unacked messages stay with the broker's persistent session.
    #[serde(default = "default_shutdown_timeout")]
    pub shutdown_timeout_secs: u64,
    /// TLS for the HTTP API (status, metrics, admin). Without it the API is
    /// plain HTTP.
    #[serde(default)]
    pub http_tls: Option<HttpTlsConfig>,
    /// Admin requests carry the cluster secret. Over plain HTTP they are
    /// accepted only from a loopback client, unless this is set: anyone on
    /// the path could read the secret, and with it join the cluster.
    #[serde(default)]
    pub allow_plaintext_admin: bool,
    /// The token admin requests must present. Without it they present the
    /// cluster secret, so whoever administers the cluster holds the key its
    /// members authenticate each other with; with it the two are apart, and
    /// the cluster secret no longer opens the admin API.
    #[serde(default)]
    pub admin_token_file: Option<PathBuf>,
}

fn default_disk_reserve() -> u64 {
    256 * 1024 * 1024
}
fn default_shutdown_timeout() -> u64 {
    10
}
fn default_http_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}
impl NodeConfig {
    pub fn new(id: u64, zone: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        Self {
            id,
            zone: zone.into(),
            data_dir: data_dir.into(),
            http_listen: default_http_listen(),
            disk_reserve_bytes: default_disk_reserve(),
            shutdown_timeout_secs: default_shutdown_timeout(),
            http_tls: None,
            allow_plaintext_admin: false,
            admin_token_file: None,
        }
    }
}

impl NodeConfig {
    /// What the stages know of this node.
    pub fn cx(&self) -> crate::context::NodeCx {
        crate::context::NodeCx {
            id: self.id,
            zone: self.zone.clone(),
            data_dir: self.data_dir.clone(),
            http: self.http_listen.to_string(),
            disk_reserve_bytes: self.disk_reserve_bytes,
        }
    }

    /// Adds every problem of `[node]` that needs no file to `p`.
    pub fn check(&self, p: &mut Problems) {
        if self.zone.trim().is_empty() {
            p.add("node.zone", "must not be empty");
        }
        if self.shutdown_timeout_secs == 0 {
            p.add("node.shutdown_timeout_secs", "must be at least 1");
        }
    }
}
