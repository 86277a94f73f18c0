//! The log's group commit: one sync covers every append written before it
//! began, and openraft hears an append is durable only after that sync.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use openraft::storage::IOFlushed;

use firstseen_store::disk::Db;

use crate::guard::Guard;
use crate::{lock, LogId, TypeConfig};

/// What was written to the log and not yet known durable.
#[derive(Default)]
pub(super) struct Written {
    /// Bumped by every truncation, so a sync that began before one does not
    /// mark removed entries durable.
    pub(super) generation: u64,
    pub(super) last: Option<LogId>,
}

/// Group commit: one sync of the log covers every append written before it
/// began. openraft does not wait for an append's sync before handing over
/// the next one, so under load several appends share a sync; when idle, an
/// append is synced at once.
///
/// The syncs run on the blocking pool, one run at a time, which goes on
/// while appends keep arriving and ends when none waits: `fdatasync` blocks
/// for as long as the disk takes, and on a two-core node a runtime worker is
/// too dear to spend on it. A dedicated thread did this before; the pool
/// does it as cheaply, and tokio's paused clock sees a sync in progress
/// (the whole-cluster simulation's clock would otherwise run on while the
/// disk works).
pub(super) struct Flusher {
    pub(super) db: Db,
    pub(super) guard: Arc<Mutex<Guard>>,
    pub(super) written: Arc<Mutex<Written>>,
    pub(super) queue: Mutex<FlushQueue>,
}

#[derive(Default)]
pub(super) struct FlushQueue {
    /// Appends written and waiting for a sync, with when each was queued.
    waiting: Vec<(IOFlushed<TypeConfig>, Instant)>,
    /// Whether a run is under way; it takes `waiting` before each sync.
    running: bool,
    /// When the guard was last synced by a run.
    guarded_at: Option<Instant>,
}

impl Flusher {
    /// Reports `callback` durable after the next sync, starting a run
    /// unless one is under way (it takes the callback before its next sync).
    pub(super) fn submit(self: &Arc<Self>, callback: IOFlushed<TypeConfig>) {
        let start = {
            let mut q = lock(&self.queue);
            q.waiting.push((callback, Instant::now()));
            !std::mem::replace(&mut q.running, true)
        };
        if start {
            let me = self.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn_blocking(move || me.run());
                }
                // Outside a runtime (no caller of openraft's is): sync here.
                Err(_) => me.run(),
            }
        }
    }

    /// Syncs until no append waits. Blocking.
    fn run(&self) {
        loop {
            let waiting = {
                let mut q = lock(&self.queue);
                if q.waiting.is_empty() {
                    q.running = false;
                    return;
                }
                std::mem::take(&mut q.waiting)
            };
            // Every callback in `waiting` was queued after its entries were
            // written, so this sync covers them all.
            let (generation, upto) = {
                let w = lock(&self.written);
                (w.generation, w.last)
            };
            let result = self.db.sync();
            metrics::counter!("firstseen_raft_log_flushes_total").increment(1);
            let synced = result.is_ok();
            let synced_at = Instant::now();
            // The commit path's `flush` leg: an append written until the
            // sync that makes it durable (docs/metrics.md).
            let flush = metrics::histogram!("firstseen_commit_leg_seconds", "leg" => "flush");
            for (callback, queued) in waiting {
                flush.record(synced_at.saturating_duration_since(queued).as_secs_f64());
                // G4 and G6 rest on this: openraft counts this node towards
                // a commit, which releases upstream acks, only after the
                // entries are on stable storage.
                callback.io_completed(
                    result
                        .as_ref()
                        .map(|_| ())
                        .map_err(|e| std::io::Error::other(e.to_string())),
                );
            }
            let mut g = lock(&self.guard);
            // Checked under the guard's lock: a truncation bumps the
            // generation before it lowers the guard, so a sync that raced
            // one never raises the mark above entries it removed.
            if synced && lock(&self.written).generation == generation {
                if let Err(e) = g.note_durable(upto) {
                    tracing::warn!(error = %e, "could not record the durable log position in the guard");
                }
            }
            // Busy, the guard is synced here at most every second; idle, the
            // reaper's tick syncs what the last run recorded.
            let mut q = lock(&self.queue);
            if q.guarded_at.is_none_or(|t| t.elapsed() >= Guard::EVERY) {
                q.guarded_at = Some(Instant::now());
                if let Err(e) = g.sync() {
                    tracing::warn!(error = %e, "could not sync the guard");
                }
            }
        }
    }
}

impl Drop for Flusher {
    /// The log is closing: the guard gets its exact last position.
    fn drop(&mut self) {
        if let Err(e) = lock(&self.guard).sync() {
            tracing::warn!(error = %e, "could not sync the guard");
        }
    }
}
