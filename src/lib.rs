//! firstseen: a replicated MQTT → Pulsar bridge that keeps the first copy.
//!
//! A message's way through a node, module by module:
//!
//! 1. [`ingest`]: one task per upstream broker; persistent session, manual
//!    acks. Each PUBLISH is routed ([`ingest::route`]) and keyed ([`key`]).
//! 2. [`batch`]: observations are grouped by size, bytes and linger time.
//! 3. [`cluster`]: each batch is one Raft entry (openraft, sled log; see the
//!    `firstseen-raft` crate). Commit applies it to the state machine
//!    (`firstseen-store`): first copies get a per-topic sequence and go to
//!    the outbox, later copies are counted as duplicates.
//! 4. [`ack`]: once the entry is committed the batcher acks the batch's
//!    messages upstream, in receive order (G4).
//! 5. [`publish`]: the leader moves the outbox into Pulsar with an exclusive
//!    producer and commits a `Published` watermark to trim it.
//! 6. [`verify`]: reads a topic back and audits duplicates and gaps.
//!
//! [`node`] wires these together and stops them in that order; [`http`] is
//! the status page and API; [`telemetry`] the metrics and recent-errors log;
//! [`config`] is the validated configuration; [`diskspace`] holds writes
//! while the data directory's filesystem is nearly full.

pub mod ack;
pub mod batch;
pub mod cluster;
pub mod config;
pub mod diskspace;
pub mod http;
pub mod ingest;
pub mod key;
pub mod node;
pub mod pem;
pub mod propose;
pub mod publish;
pub mod supervise;
pub mod telemetry;
pub mod verify;
pub mod watchdog;

/// Everything that can go wrong in the firstseen crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Store(#[from] firstseen_store::StoreError),
    #[error(transparent)]
    Storage(#[from] firstseen_raft::RaftError),
    #[error("raft: {0}")]
    Raft(String),
    #[error("pulsar: {0}")]
    Pulsar(#[from] pulsar::Error),
    #[error("publish: {0}")]
    Publish(String),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    TaskEnded(#[from] supervise::Early),
}

/// Milliseconds since the Unix epoch on this node's clock.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}
