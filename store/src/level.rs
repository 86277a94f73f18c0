//! The cluster level: which formats and rules every member has agreed to.
//!
//! A release reads every format of the levels it supports and writes only
//! those of the cluster's level, which rises through the log
//! ([`crate::Command::Level`]) once every member runs a release that has
//! the next one. Until then a cluster of mixed releases works as the oldest
//! of them does. The level never goes back: after it rose, a node of an
//! older release cannot read the log, and stops with an error saying so.
//!
//! - **Level 1**: every format up to the release that added levels.
//! - **Level 2** ([`KINDS`]): copies carry their key's kind
//!   ([`crate::Command::ObserveKinds`]), and the window tells keys apart by
//!   Pulsar topic and kind ([`crate::window::identity`]): a key is first
//!   seen per topic. Messages the publisher sets aside are kept in the
//!   replicated state ([`crate::Command::SetAside`]). The publisher trusts
//!   only messages that carry the cluster's proof at the end of a topic.
//! - **Level 3** ([`NAMES`]): a Pulsar topic has one name, its canonical
//!   one ([`crate::topic::canonical`]): the leader writes copies' topics so,
//!   apply names topics so, and the rise moves what the state held under
//!   another spelling (`state/names.rs`).
//! - **Level 4** ([`PIPELINED`]): every member's peer server hands a
//!   connection's appends to Raft in the order they arrived
//!   (`cluster::lane` in the `firstseen` crate), so a leader sends the next
//!   append before the previous one is answered. Nothing in the state
//!   changes.

/// The level of a cluster that never agreed on one: every release reads it.
pub const BASE: u32 = 1;

/// Copies carry their kind, and the window is scoped by topic and kind.
pub const KINDS: u32 = 2;

/// Topics are named by their canonical name ([`crate::topic::canonical`]):
/// `fs` and `persistent://public/default/fs` are one topic in the window,
/// the outbox, the sequences and the publishers.
pub const NAMES: u32 = 3;

/// Leaders pipeline their appends (openraft 0.10's `stream_append`).
pub const PIPELINED: u32 = 4;

/// The highest level this release runs.
pub const SUPPORTED: u32 = PIPELINED;

/// The lowest level this release runs: it reads every format of the
/// release before levels.
pub const OLDEST: u32 = BASE;

/// The level and what its change left behind, kept with the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Levels {
    /// The cluster's level.
    pub level: u32,
    /// Window records below this id may hold keys stored bare (under level
    /// 1's rule, or by a copy of unknown kind): until they have all expired,
    /// a copy is also looked up by its bare key, so a message whose first
    /// copy came before the level rose is still a duplicate after it.
    pub bare_below: u64,
}

impl Default for Levels {
    fn default() -> Self {
        Self {
            level: BASE,
            bare_below: 0,
        }
    }
}

/// The cluster level as the state applied it last, readable without
/// holding the state (and its databases) open. Cheap to clone.
#[derive(Clone, Debug)]
pub struct LevelCell(std::sync::Arc<std::sync::atomic::AtomicU32>);

impl Default for LevelCell {
    fn default() -> Self {
        Self(std::sync::Arc::new(std::sync::atomic::AtomicU32::new(BASE)))
    }
}

impl LevelCell {
    pub fn get(&self) -> u32 {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn set(&self, level: u32) {
        self.0.store(level, std::sync::atomic::Ordering::Release)
    }
}

/// Why a node cannot run the cluster's level.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the cluster runs at level {cluster}, and this release supports levels {OLDEST} to {SUPPORTED}: run a release that supports level {cluster} on this node (nothing was lost; the other members carry on)"
)]
pub struct TooNew {
    pub cluster: u32,
}

/// Checks that this release can run `cluster`.
pub fn check(cluster: u32) -> Result<(), TooNew> {
    if cluster > SUPPORTED {
        Err(TooNew { cluster })
    } else {
        Ok(())
    }
}
