//! Free space on the data directory's filesystem, watched so that the node
//! stops writing before sled finds the disk full.
//!
//! sled 0.34 does not recover from a failed write: the error poisons the
//! database until it is reopened, and openraft treats any storage error as
//! fatal. So the node never lets it come to that. While free space is below
//! `node.disk_reserve_bytes` it:
//! - proposes nothing and holds its upstream acks (the broker keeps the
//!   messages; `batch/`), and writes no dead letters (`ingest/`);
//! - refuses replication and snapshots from the leader (`cluster/server.rs`),
//!   which backs off and carries on with the other members;
//! - as leader, commits nothing, stops publishing and stops sending
//!   heartbeats, so the others elect a leader that has room;
//! - says why on `/readyz`, in `/status` (`disk`) and in the
//!   `firstseen_disk_low` gauge.
//!
//! Everything resumes by itself once the space is back.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often free space is read: statvfs costs microseconds, and a burst of
/// a few batches is all that fits between two reads.
const EVERY: Duration = Duration::from_millis(200);

/// Bytes available to this process on the filesystem holding `path`.
pub use firstseen_store::disk::free_bytes;

/// Whether `free` bytes leave the node enough room.
pub fn is_low(free: u64, reserve: u64) -> bool {
    free < reserve
}

/// The watched state, shared by everything that writes.
#[derive(Debug)]
pub struct DiskSpace {
    path: PathBuf,
    reserve: u64,
    low: AtomicBool,
    free: AtomicU64,
}

impl DiskSpace {
    /// Reads the free space of `path`'s filesystem once, so the first answer
    /// is already true.
    pub fn new(path: PathBuf, reserve: u64) -> Arc<Self> {
        let me = Arc::new(Self {
            path,
            reserve,
            low: AtomicBool::new(false),
            free: AtomicU64::new(u64::MAX),
        });
        me.check();
        me
    }

    /// Whether the node must stop writing new entries.
    pub fn is_low(&self) -> bool {
        self.low.load(Ordering::Acquire)
    }

    /// Free bytes at the last reading.
    pub fn free(&self) -> u64 {
        self.free.load(Ordering::Relaxed)
    }

    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    /// Why the node is not writing, when it is not.
    pub fn reason(&self) -> Option<String> {
        self.is_low().then(|| {
            format!(
                "free disk space on {} is {} bytes, below node.disk_reserve_bytes ({})",
                self.path.display(),
                self.free(),
                self.reserve
            )
        })
    }

    /// Reads free space now and updates the state; logs a change.
    pub fn check(&self) -> bool {
        let free = match free_bytes(&self.path) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read free disk space");
                return self.is_low();
            }
        };
        self.free.store(free, Ordering::Relaxed);
        let low = is_low(free, self.reserve);
        let was = self.low.swap(low, Ordering::AcqRel);
        if low != was {
            if low {
                tracing::warn!(path = %self.path.display(), free_bytes = free, reserve_bytes = self.reserve, "disk space below the reserve: holding acks, refusing replication");
            } else {
                tracing::info!(path = %self.path.display(), free_bytes = free, "disk space back above the reserve: resuming");
            }
        }
        metrics::gauge!("firstseen_disk_free_bytes").set(free as f64);
        metrics::gauge!("firstseen_disk_low").set(if low { 1.0 } else { 0.0 });
        low
    }

    /// Reads free space every [`EVERY`] until `shutdown`.
    pub async fn watch(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(EVERY);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            let me = self.clone();
            // statvfs on a FUSE or network filesystem can block.
            let _ = tokio::task::spawn_blocking(move || me.check()).await;
        }
    }

    /// Waits while the disk is low; returns false if `stop` came first.
    pub async fn wait_for_room(&self, stop: &CancellationToken) -> bool {
        while self.is_low() {
            tokio::select! {
                _ = tokio::time::sleep(EVERY) => {}
                _ = stop.cancelled() => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_the_reserve_is_low() {
        assert!(is_low(99, 100));
        assert!(!is_low(100, 100));
        assert!(!is_low(u64::MAX, 0));
    }

    #[test]
    fn reads_the_filesystem_it_is_on() {
        let d = tempfile::tempdir().unwrap();
        assert!(free_bytes(d.path()).unwrap() > 0);
        let roomy = DiskSpace::new(d.path().to_path_buf(), 0);
        assert!(!roomy.is_low() && roomy.reason().is_none());
        let greedy = DiskSpace::new(d.path().to_path_buf(), u64::MAX);
        assert!(greedy.is_low());
        assert!(greedy.reason().unwrap().contains("node.disk_reserve_bytes"));
    }
}
