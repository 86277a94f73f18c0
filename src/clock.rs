//! The wall clock, as a port.
//!
//! Only the dedup window reads wall-clock time (design: "only the expiry of
//! the dedup window reads timestamps"), and it reads it in three places:
//! ingest stamps each observation with the receiving node's clock, a
//! follower's proposer stamps them again when it forwards them
//! (`propose::restamp`), and the leader's coalescer stamps each entry from
//! those readings and its own. All read it through [`Clock`], so that a
//! simulation can give each node a
//! clock of its own and skew it, and so that a decision which reads the
//! machine's clock directly shows up there as a clock years off.

use std::sync::Arc;

/// Milliseconds since the Unix epoch, as this node sees them.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

/// A node's clock, shared by the tasks that read it.
pub type SharedClock = Arc<dyn Clock>;

/// The machine's clock: what a node runs on.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        crate::now_ms()
    }
}

impl SystemClock {
    pub fn shared() -> SharedClock {
        Arc::new(SystemClock)
    }
}
