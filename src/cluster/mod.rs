//! The Raft group as the rest of the node sees it: start it, bootstrap it
//! idempotently, change membership, elect leaders ([`elect`]) and talk to
//! peers ([`wire`] the protocol, [`frames`] reading it off a connection,
//! [`server`] the listener and [`answer`] what it answers, [`lane`] a
//! connection's appends in order, [`peers`], and openraft's [`network`] over them); and
//! [`services`] the ones that run on the open group (the peer service,
//! elections, the lease watch). Proposing is not here: it is a step of the pipeline
//! (`crate::propose`), which uses this network to forward batches; the
//! network knows nothing of it.

pub mod answer;
pub mod config;
pub mod elect;
pub mod frames;
pub mod lane;
pub mod liveness;
pub mod network;
pub mod peers;
pub mod server;
pub mod services;

pub mod wire;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use firstseen_raft::{Member, NodeId, Raft};
use firstseen_store::StateStore;
use openraft::error::{InitializeError, RaftError};
use openraft::ChangeMembers;
use tokio_util::task::TaskTracker;

use crate::context::NodeCx;
use crate::Error;
use config::ClusterConfig;
use peers::Peers;
use wire::ClusterKey;

/// A running Raft node and its storage.
pub struct Cluster {
    pub raft: Raft,
    pub state: StateStore,
    /// Unpublished messages with their payloads, for the publisher.
    pub outbox: firstseen_raft::Outbox,
    /// Both databases and their durability.
    pub disk: firstseen_store::disk::Disk,
    pub node_id: NodeId,
    pub peers: Peers,
    pub key: ClusterKey,
    pub tls: Option<crate::tls::PeerTls>,
    /// Evidence of who is alive, for elections, readiness and status.
    pub liveness: Arc<liveness::Liveness>,
    pub timing: liveness::Timing,
    /// The log's reaper, for the node to run under its supervisor.
    pub reaper: Option<firstseen_raft::log_store::Reaper>,
    /// See [`Group::incoming`].
    pub incoming: firstseen_raft::state_machine::Incoming,
}

/// Raft timing from `[cluster]` (`heartbeat_ms`, `election_timeout_*`).
pub fn timing(section: &ClusterConfig) -> liveness::Timing {
    liveness::Timing {
        heartbeat: Duration::from_millis(section.heartbeat_ms()),
        election_min: Duration::from_millis(section.election_timeout_min_ms()),
        election_max: Duration::from_millis(section.election_timeout_max_ms()),
    }
}

/// openraft's config. Heartbeats every 100 ms and a lease of 800 ms by
/// default: the defaults of 250 ms and 1–2 s made openraft's own timer wait
/// its lease plus an election timeout, 3–4 s, after a leader died. openraft's
/// election timer is off: [`elect`] drives elections, after a pre-vote.
fn raft_config(section: &ClusterConfig, id: NodeId) -> Result<openraft::Config, Error> {
    openraft::Config {
        cluster_name: "firstseen".into(),
        heartbeat_interval: section.heartbeat_ms(),
        election_timeout_min: section.election_timeout_min_ms(),
        election_timeout_max: section.election_timeout_max_ms(),
        enable_elect: false,
        // openraft gives a whole AppendEntries (send, follower flush,
        // reply) one heartbeat interval. A catching-up follower is sent
        // this many entries at a time, so each append stays near a MiB and
        // fits that budget; live replication sends one entry at a time.
        max_payload_entries: 4,
        // Snapshots let the log be purged: disk is bounded by the window
        // (state), not by uptime (log).
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(snapshot_every(
            section.snapshot_logs,
            id,
        )),
        max_in_snapshot_log_to_keep: section.snapshot_logs.min(1_000),
        // A node that set its damaged log aside comes back with less than
        // the leader last knew it held (`firstseen_raft::rejoin`): the
        // leader must start its replication over instead of stopping on
        // the conflict. openraft 0.9 did so with the feature
        // `loosen-follower-log-revert`, which 0.10 replaced with this.
        allow_log_reversion: Some(true),
        ..Default::default()
    }
    .validate()
    .map_err(|e| Error::raft("config", e))
}

/// Entries between snapshots on node `id`: `snapshot_logs`, plus up to 3/16
/// more depending on the id. Nodes apply the same entries at nearly the same
/// moment, so with one threshold all of them exported and purged at once and
/// replication stalled everywhere together (the benchmark's p99 spikes); the
/// offsets spread the work over a few seconds.
fn snapshot_every(snapshot_logs: u64, id: NodeId) -> u64 {
    snapshot_logs + (id % 4) * (snapshot_logs / 16)
}

/// The initial membership: the configured members, or this node alone.
pub fn initial_members(section: &ClusterConfig, cx: &NodeCx) -> BTreeMap<NodeId, Member> {
    if section.members.is_empty() {
        let mut m = BTreeMap::new();
        m.insert(
            cx.id,
            Member {
                addr: section.listen.map(|a| a.to_string()).unwrap_or_default(),
                zone: cx.zone.clone(),
                http: cx.http.clone(),
            },
        );
        return m;
    }
    section
        .members
        .iter()
        .map(|m| {
            (
                m.id,
                Member {
                    addr: m.addr.clone(),
                    zone: m.zone.clone(),
                    http: m.http.clone(),
                },
            )
        })
        .collect()
}

/// Reads the cluster secret. A group of one without a secret file gets a
/// random key: it has no peers to authenticate.
pub fn load_key(section: &ClusterConfig, cx: &NodeCx) -> Result<ClusterKey, Error> {
    match &section.secret_file {
        Some(f) => ClusterKey::read("cluster.secret_file", f),
        None => local_key(&cx.data_dir),
    }
}

/// The secret a node without `cluster.secret_file` (a group of one) keeps
/// for itself in its data directory. It names the cluster's producers and
/// proves its Pulsar messages, so it must outlive a restart: drawn at every
/// start, as before, the messages a node had published before a restart
/// were not its own any more.
pub const LOCAL_SECRET: &str = "cluster.secret";

/// The key of this node's own secret, made (durably) at its first start.
fn local_key(data_dir: &std::path::Path) -> Result<ClusterKey, Error> {
    if let Some(key) = read_local_key(data_dir)? {
        return Ok(key);
    }
    let path = data_dir.join(LOCAL_SECRET);
    firstseen_store::disk::create_dir_durable(data_dir)?;
    let tmp = data_dir.join(format!("{LOCAL_SECRET}.partial"));
    let secret = hex::encode(wire::nonce());
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(secret.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write().map_err(|source| Error::SettingFile {
        key: "node.data_dir".into(),
        path: path.clone(),
        source,
    })?;
    firstseen_store::disk::sync_dir(data_dir)?;
    tracing::info!(file = %path.display(), "made this node's own cluster secret (no cluster.secret_file is set)");
    Ok(ClusterKey::from_secret(secret.as_bytes()))
}

/// The key of the secret a node without `cluster.secret_file` keeps in
/// `data_dir`, if it has made one; nothing is written.
pub fn read_local_key(data_dir: &std::path::Path) -> Result<Option<ClusterKey>, Error> {
    let path = data_dir.join(LOCAL_SECRET);
    match std::fs::read(&path) {
        Ok(raw) if !raw.is_empty() => Ok(Some(ClusterKey::from_secret(&raw))),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::SettingFile {
            key: "node.data_dir".into(),
            path,
            source,
        }),
    }
}

/// The keys of the secrets the cluster had before a rotation
/// (`cluster.previous_secret_files`): messages proven under them are still
/// its own.
pub fn previous_keys(section: &ClusterConfig) -> Result<Vec<ClusterKey>, Error> {
    section
        .previous_secret_files
        .iter()
        .enumerate()
        .map(|(i, f)| ClusterKey::read(&format!("cluster.previous_secret_files[{i}]"), f))
        .collect()
}

/// The least free space a node needs to set a damaged log aside and rejoin.
const REJOIN_MIN_FREE_BYTES: u64 = 64 << 20;

/// A node's Raft group member: its storage and openraft on some network.
pub struct Group {
    pub raft: Raft,
    pub state: StateStore,
    pub outbox: firstseen_raft::Outbox,
    pub disk: firstseen_store::disk::Disk,
    pub reaper: firstseen_raft::log_store::Reaper,
    /// Where the peer server names the snapshot it receives, for the state
    /// machine to check it against (`firstseen_raft::state_machine`).
    pub incoming: firstseen_raft::state_machine::Incoming,
}

impl Group {
    /// Opens storage under `<data_dir>/raft`, starts Raft on `network` and
    /// bootstraps the group if it was never initialised. Starting every
    /// node with the same config is safe: a node that already has state
    /// skips bootstrap, and nodes bootstrapping together write the same
    /// membership entry. The node passes its TCP peers; the whole-cluster
    /// simulation passes its in-memory network.
    pub async fn open(
        section: &ClusterConfig,
        cx: &NodeCx,
        mut network: network::Network,
    ) -> Result<Self, Error> {
        // A damaged log can be set aside only where other voters hold what
        // it held; a group of one refuses it. The room asked for: the
        // node's reserve, and never less than a rebuilt state and a new log
        // need to get going.
        let on_damaged_log = if initial_members(section, cx).len() > 1 {
            firstseen_raft::OnDamagedLog::Rejoin {
                min_free_bytes: cx.disk_reserve_bytes.max(REJOIN_MIN_FREE_BYTES),
            }
        } else {
            firstseen_raft::OnDamagedLog::Refuse
        };
        let storage = firstseen_raft::open_with(&cx.data_dir.join("raft"), on_damaged_log).await?;
        network.appends = Some(storage.log.append_clock());
        network.pipeline = network::Pipelining {
            set: section.pipeline_appends,
            level: Some(storage.state.level_cell()),
        };
        let incoming = storage.state_machine.incoming();
        let raft = Raft::new(
            cx.id,
            Arc::new(raft_config(section, cx.id)?),
            network,
            storage.log,
            storage.state_machine,
        )
        .await
        .map_err(|e| Error::raft("start", e))?;
        let members = initial_members(section, cx);
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| Error::raft("read whether the group is initialised", e))?;
        if !initialized && !members.contains_key(&cx.id) {
            tracing::info!(
                "not among the initial members: waiting to be added with `firstseen members add`"
            );
        } else if !initialized {
            match raft.initialize(members.clone()).await {
                Ok(()) => tracing::info!(members = members.len(), "cluster bootstrapped"),
                Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
                    tracing::info!("cluster already initialised")
                }
                Err(e) => return Err(Error::raft("bootstrap", e)),
            }
        }
        Ok(Self {
            raft,
            state: storage.state,
            outbox: storage.outbox,
            disk: storage.disk,
            reaper: storage.reaper,
            incoming,
        })
    }
}

impl Cluster {
    /// Connects to the peers over TCP (or TLS) and opens the node's
    /// [`Group`] on them.
    ///
    /// Connection tasks are spawned on `tasks`, the node's supervisor's.
    pub async fn start(
        section: &ClusterConfig,
        cx: &NodeCx,
        tasks: TaskTracker,
    ) -> Result<Self, Error> {
        let key = load_key(section, cx)?;
        let source_ip: Option<IpAddr> = section
            .listen
            .map(|a| a.ip())
            .filter(|ip| !ip.is_unspecified());
        let tls = section
            .tls
            .as_ref()
            .map(crate::tls::PeerTls::load)
            .transpose()?;
        let liveness = Arc::new(liveness::Liveness::new());
        let peers = Peers::new(
            cx.id,
            key.clone(),
            source_ip,
            tls.clone(),
            liveness.clone(),
            tasks,
        );
        let group =
            Group::open(section, cx, network::Network::new(Arc::new(peers.clone()))).await?;
        Ok(Self {
            raft: group.raft,
            state: group.state,
            outbox: group.outbox,
            disk: group.disk,
            node_id: cx.id,
            peers,
            key,
            tls,
            liveness,
            timing: timing(section),
            reaper: Some(group.reaper),
            incoming: group.incoming,
        })
    }

    /// Stops Raft and makes the state durable.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        self.peers.close();
        let (state, disk) = (self.state.clone(), self.disk.clone());
        let synced = tokio::task::spawn_blocking(move || {
            // The checkpoint syncs the log before it is written.
            state.flush()?;
            disk.log.sync()
        })
        .await;
        match synced {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "final sync failed"),
            Err(e) => tracing::error!(error = %e, "final sync task failed"),
        }
    }
}

/// Adds a node: first as a learner (it catches up, by snapshot if the log
/// was purged), then as a voter. Must run on the leader.
pub async fn add_member(raft: &Raft, id: NodeId, member: Member) -> Result<(), Error> {
    raft.add_learner(id, member, true)
        .await
        .map_err(|e| Error::raft(format!("add learner {id}"), e))?;
    let mut ids = BTreeSet::new();
    ids.insert(id);
    raft.change_membership(ChangeMembers::AddVoterIds(ids), false)
        .await
        .map_err(|e| Error::raft(format!("promote {id} to voter"), e))?;
    Ok(())
}

/// Removes a node from the group. Must run on the leader.
pub async fn remove_member(raft: &Raft, id: NodeId) -> Result<(), Error> {
    let mut ids = BTreeSet::new();
    ids.insert(id);
    raft.change_membership(ChangeMembers::RemoveVoters(ids), false)
        .await
        .map_err(|e| Error::raft(format!("remove {id}"), e))?;
    Ok(())
}

/// A leader whose disk is below its reserve stops sending heartbeats (and
/// commits nothing, and stops publishing), so that the followers elect a
/// leader that has room; heartbeats resume once the space is back.
pub async fn follow_disk(
    raft: Raft,
    disk: Arc<crate::diskspace::DiskSpace>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut beating = true;
    loop {
        let want = !disk.is_low();
        if want != beating {
            raft.runtime_config().heartbeat(want);
            beating = want;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = shutdown.cancelled() => break,
        }
    }
    if !beating {
        raft.runtime_config().heartbeat(true);
    }
}

/// Logs one line per leadership change, as operators want to see them.
pub async fn log_leadership(raft: Raft, shutdown: tokio_util::sync::CancellationToken) {
    let mut rx = raft.metrics();
    let mut last: Option<(u64, Option<NodeId>)> = None;
    loop {
        let now = {
            let m = rx.borrow_and_update();
            (m.current_term, m.current_leader)
        };
        if last.map(|l| l.1) != Some(now.1) {
            match now.1 {
                Some(leader) => tracing::info!(term = now.0, leader, "leader elected"),
                None if last.is_some() => tracing::warn!(term = now.0, "no leader"),
                None => {}
            }
        }
        last = Some(now);
        tokio::select! {
            r = rx.changed() => if r.is_err() {
                // openraft's core stopped (a storage error): the storage
                // watchdog exits with its own status for that, and this task
                // ending first would stop the node with a vaguer one.
                shutdown.cancelled().await;
                break;
            },
            _ = shutdown.cancelled() => break,
        }
    }
}
