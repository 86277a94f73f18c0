//! firstseen: a replicated MQTT → Pulsar bridge that keeps the first copy.
//!
//! A message's way through a node, module by module:
//!
//! 1. [`ingest`]: one task per upstream broker; persistent session, manual
//!    acks. Each PUBLISH is bounded ([`ingest::bound`]), routed
//!    ([`ingest::route`]) and keyed ([`key`]).
//! 2. [`batch`]: observations are grouped by size, bytes and linger time.
//! 3. [`propose`]: the one door to the Raft log. A follower forwards its
//!    batch to the leader; the leader's coalescer merges waiting batches
//!    into one entry and stamps it.
//! 4. [`cluster`]: the Raft group (openraft, sled log; see the
//!    `firstseen-raft` crate) and its authenticated peer links. Commit
//!    applies an entry to the state machine (`firstseen-store`): first
//!    copies get a per-topic sequence and go to the outbox, later copies are
//!    counted as duplicates.
//! 5. [`ingest::ack`]: once the entry is committed the batcher acks the batch's
//!    messages upstream, in receive order (G4).
//! 6. [`publish`]: the leader moves the outbox into Pulsar with an exclusive
//!    producer and commits a `Published` watermark to trim it.
//! 7. [`verify`]: reads a topic back and audits duplicates, gaps and
//!    contents; and compares two topics over a time range (a shadow run
//!    beside another pipeline).
//!
//! Around them: [`node`] runs the stages' tasks in layers of one stop order, starts them
//! in order and stops them in reverse, failing fast when a task ends
//! early; [`http`] is the status page and API;
//! [`cli`] the binary's commands; [`config`] the configuration file as a
//! whole (each section's types and checks live in its stage's `config.rs`;
//! `config` loads, applies the environment, and adds the checks across
//! sections and on the files they name);
//! [`tls`] every TLS setting; [`telemetry`] the metrics and recent-errors
//! log; [`clock`] the wall clock the window reads; [`diskspace`] holds
//! writes while the data directory's filesystem is nearly full;
//! [`watchdog`] ends a node whose storage can no longer be trusted;
//! [`peraddr`] bounds what one address may hold open.
//!
//! Shared by the stages, importing none of them (so that no stage folder
//! reaches back into another, `tests/layout.rs`): [`context`] what a stage
//! knows of its node; [`dedup`] the `[dedup]` section (the window and the
//! bounds of a message); [`format`] how a route's messages look in Pulsar;
//! [`deadletter`] the store of messages not forwarded; [`secret`] the
//! cluster secret as a key; [`problem`] what is wrong with a config;
//! [`send`] what can go wrong sending to the output broker.

pub mod batch;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod context;
pub mod deadletter;
pub mod dedup;
pub mod diskspace;
pub mod format;
pub mod http;
pub mod ingest;
pub mod key;
pub mod node;
pub mod peraddr;
pub mod problem;
pub mod propose;
pub mod publish;
pub mod secret;
pub mod send;
pub mod telemetry;
pub mod tls;
pub mod verify;
pub mod watchdog;

/// What can go wrong in the firstseen crate across its stages (the config,
/// the store, Raft, the Pulsar client and its credentials, the broker's
/// answer). Each variant says what was being done (a config key, a Raft
/// action) and keeps the error underneath as its source. A stage's own
/// errors are its own (the publisher's are `publish::Error`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting that cannot be used as written, and why. `key` is its name
    /// in the config file (`cluster.tls.ca_file`, `upstreams[0].url`).
    #[error("configuration: {key}: {problem}")]
    Setting { key: String, problem: String },
    /// A file a setting names could not be read.
    #[error("configuration: {key} {}: {source}", path.display())]
    SettingFile {
        key: String,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An address a setting names could not be bound.
    #[error("configuration: {key} {addr}: {source}")]
    Bind {
        key: &'static str,
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// A TLS setting that cannot be used; its key is whole
    /// (`cluster.tls.ca_file`).
    #[error("configuration: {0}")]
    Tls(#[from] tls::TlsSettingError),
    #[error(transparent)]
    Store(#[from] firstseen_store::StoreError),
    #[error(transparent)]
    Storage(#[from] firstseen_raft::RaftError),
    /// openraft refused or failed `action` (start, bootstrap, a membership
    /// change).
    #[error("raft: {action}: {source}")]
    Raft {
        action: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("pulsar: {0}")]
    Pulsar(#[from] pulsar::Error),
    /// The Pulsar credentials could not be turned into a token.
    #[error("pulsar credentials: {0}")]
    Credentials(#[source] pulsar::error::AuthenticationError),
    /// A request to Pulsar's admin REST API failed.
    #[error("pulsar admin: {0}")]
    Admin(#[source] reqwest::Error),
    /// The broker, as the publisher's port reports it.
    #[error("broker: {0}")]
    Broker(#[from] send::SendError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    TaskEnded(#[from] Early),
}

impl Error {
    /// A setting's problem that has no error type of its own.
    pub fn setting(key: impl Into<String>, problem: impl std::fmt::Display) -> Self {
        Error::Setting {
            key: key.into(),
            problem: problem.to_string(),
        }
    }

    /// openraft's error `source` while doing `action`.
    pub fn raft(
        action: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Raft {
            action: action.into(),
            source: Box::new(source),
        }
    }
}

/// A task that ended before the node was asked to stop (the node's
/// supervisor reports it, `node::supervise`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Early {
    /// The task's name, as it was spawned.
    pub task: &'static str,
    /// The panic's message, when it panicked; `None` when it returned.
    pub panic: Option<String>,
}

impl std::error::Error for Early {}

impl std::fmt::Display for Early {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.panic {
            Some(p) => write!(f, "task `{}` panicked: {p}", self.task),
            None => write!(f, "task `{}` ended before the node was stopped", self.task),
        }
    }
}

/// Milliseconds since the Unix epoch on this node's clock.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}
