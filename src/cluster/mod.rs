//! The Raft group as the rest of the node sees it: start it, bootstrap it
//! idempotently, and propose batches to it.

use std::collections::BTreeMap;
use std::sync::Arc;

use firstseen_raft::network::NoPeers;
use firstseen_raft::{Command, Member, Raft, Response};
use firstseen_store::{Observation, Outcome, StateStore};
use openraft::error::{InitializeError, RaftError};

use crate::config::Config;
use crate::{now_ms, Error};

/// A running Raft node and its storage.
pub struct Cluster {
    pub raft: Raft,
    pub state: StateStore,
    pub db: sled::Db,
    pub node_id: u64,
    pub members: BTreeMap<u64, Member>,
}

/// Raft timing. Heartbeats every 250 ms and elections after 1–2 s keep a
/// leader kill to a few seconds of unavailability while tolerating the
/// scheduling hiccups of a loaded 2-core machine.
fn raft_config() -> Result<openraft::Config, Error> {
    openraft::Config {
        cluster_name: "firstseen".into(),
        heartbeat_interval: 250,
        election_timeout_min: 1_000,
        election_timeout_max: 2_000,
        // A snapshot every 20k entries lets the log be purged, bounding disk
        // by the window (state) rather than by uptime (log).
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(20_000),
        max_in_snapshot_log_to_keep: 1_000,
        ..Default::default()
    }
    .validate()
    .map_err(|e| Error::Raft(format!("raft config: {e}")))
}

/// The initial membership: the configured members, or this node alone.
pub fn initial_members(config: &Config) -> BTreeMap<u64, Member> {
    if config.cluster.members.is_empty() {
        let mut m = BTreeMap::new();
        m.insert(
            config.node.id,
            Member {
                addr: String::new(),
                zone: config.node.zone.clone(),
            },
        );
        return m;
    }
    config
        .cluster
        .members
        .iter()
        .map(|m| {
            (
                m.id,
                Member {
                    addr: m.addr.clone(),
                    zone: m.zone.clone(),
                },
            )
        })
        .collect()
}

impl Cluster {
    /// Opens storage under `<data_dir>/raft`, starts Raft and bootstraps the
    /// group if it was never initialised. Starting every node with the same
    /// config is safe: a node that already has state skips bootstrap.
    pub async fn start(config: &Config) -> Result<Self, Error> {
        let storage = firstseen_raft::open(&config.node.data_dir.join("raft")).await?;
        let raft = Raft::new(
            config.node.id,
            Arc::new(raft_config()?),
            NoPeers,
            storage.log,
            storage.state_machine,
        )
        .await
        .map_err(|e| Error::Raft(e.to_string()))?;
        let members = initial_members(config);
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| Error::Raft(e.to_string()))?;
        if !initialized {
            match raft.initialize(members.clone()).await {
                Ok(()) => tracing::info!(members = members.len(), "cluster bootstrapped"),
                Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
                    tracing::info!("cluster already initialised")
                }
                Err(e) => return Err(Error::Raft(format!("bootstrap: {e}"))),
            }
        }
        Ok(Self {
            raft,
            state: storage.state,
            db: storage.db,
            node_id: config.node.id,
            members,
        })
    }

    /// Stops Raft and makes the state durable.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        if let Err(e) = self.db.flush_async().await {
            tracing::error!(error = %e, "final flush failed");
        }
    }
}

/// Proposes observation batches to the group.
#[derive(Clone)]
pub struct Proposer {
    pub raft: Raft,
    /// Dedup window stamped into each entry.
    pub window_ms: u64,
}

impl Proposer {
    /// Appends one batch as one entry and returns once it is committed and
    /// applied, with one outcome per observation. The time stamped into the
    /// entry is this node's clock; only the leader can append, so it is the
    /// leader's stamp that the window uses.
    pub async fn propose(&self, observations: Vec<Observation>) -> Result<Vec<Outcome>, Error> {
        let cmd = Command::Observe {
            stamped_ms: now_ms(),
            window_ms: self.window_ms,
            observations,
        };
        let resp = self
            .raft
            .client_write(cmd)
            .await
            .map_err(|e| Error::Raft(e.to_string()))?;
        match resp.data {
            Response::Observed(outcomes) => Ok(outcomes),
            other => Err(Error::Raft(format!(
                "unexpected response to a batch: {other:?}"
            ))),
        }
    }
}
