//! The reaper: deletes the log entries a purge let go of, once neither the
//! outbox nor a recovered state can still need them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};

use firstseen_store::StateStore;

use crate::guard::Guard;
use crate::lock;

/// The task that deletes purged entries (`reap_loop`). The caller runs it
/// (a node, under its supervisor) for as long as the log is open; it ends
/// once every handle of the [`crate::LogStore`] is dropped. Without it, purged
/// entries stay on disk.
pub type Reaper = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;

/// How often the reaper looks at the outbox's hold without being woken: the
/// hold moves with every receipt the publisher commits.
const REAP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Deletes purged entries, but never one the outbox still reads a message
/// from (`hold`, kept by the state machine): until it is published, a first
/// copy's payload exists only in its log entry.
///
/// The hold is that of a checkpoint made before the state is flushed and
/// the entries deleted. A state recovered after a crash is at least that
/// checkpoint, and the hold only grows as the state moves on, so a recovered
/// state never points at a deleted entry.
pub(super) async fn reap_loop(
    log: sled::Tree,
    state: StateStore,
    first_kept: Arc<AtomicU64>,
    guard: Arc<Mutex<Guard>>,
    mut wake: mpsc::UnboundedReceiver<()>,
    passes: Arc<watch::Sender<u64>>,
) {
    let mut deleted_below = 0u64;
    loop {
        // Woken by a purge, or on the tick; the channel closes with the store.
        if let Ok(None) = tokio::time::timeout(REAP_EVERY, wake.recv()).await {
            return;
        }
        // The purge point this pass saw: every purge up to it is served.
        let served = first_kept.load(Ordering::Acquire);
        reap_once(&log, &state, served, &guard, &mut deleted_below).await;
        passes.send_modify(|n| *n = (*n).max(served));
        // The durable position the group commit's last run recorded, synced
        // within a tick once the log is idle (busy, the runs sync it).
        let g = guard.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || lock(&g).sync()).await {
            tracing::warn!(error = %e, "could not sync the guard");
        }
    }
}

/// One pass of the reaper: deletes what is purged and no longer held.
/// Failures are logged and left to the next pass.
async fn reap_once(
    log: &sled::Tree,
    state: &StateStore,
    first_kept: u64,
    guard: &Arc<Mutex<Guard>>,
    deleted_below: &mut u64,
) {
    if let Err(e) = state.checkpoint() {
        tracing::warn!(error = %e, "state checkpoint before deleting log entries failed; retrying");
        return;
    }
    let target = first_kept.min(state.durable_hold());
    if target <= *deleted_below {
        return;
    }
    let flushed = {
        let state = state.clone();
        tokio::task::spawn_blocking(move || state.flush()).await
    };
    match flushed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "syncing the state before deleting log entries failed; retrying");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "state sync task failed; retrying");
            return;
        }
    }
    let tree = log.clone();
    let started = std::time::Instant::now();
    let guard = guard.clone();
    let result = tokio::task::spawn_blocking(move || {
        // Recorded before anything is deleted: a state that still reads
        // from below this point is not the one the node ran with.
        lock(&guard)
            .update(|m| m.deleted_below = m.deleted_below.max(target))
            .map_err(|e| sled::Error::Io(std::io::Error::other(e.to_string())))?;
        delete_upto(&tree, target - 1)
    })
    .await;
    match result {
        Ok(Ok(n)) => {
            *deleted_below = target;
            tracing::debug!(
                below = target,
                entries = n,
                ms = started.elapsed().as_millis() as u64,
                "purged log entries deleted"
            );
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, below = target, "deleting purged log entries failed; retrying")
        }
        Err(e) => tracing::warn!(error = %e, "log reaper task failed; retrying"),
    }
}

/// Deletes every entry up to `upto`, in chunks, by computed key: the
/// entries' values are never read.
fn delete_upto(log: &sled::Tree, upto: u64) -> Result<u64, sled::Error> {
    let Some((first, _)) = log.first()? else {
        return Ok(0);
    };
    let Ok(first) = <[u8; 8]>::try_from(first.as_ref()) else {
        return Ok(0);
    };
    let mut index = u64::from_be_bytes(first);
    let mut deleted = 0;
    while index <= upto {
        let end = upto.min(index.saturating_add(1_000));
        let mut batch = sled::Batch::default();
        for i in index..=end {
            batch.remove(&i.to_be_bytes());
        }
        log.apply_batch(batch)?;
        deleted += end - index + 1;
        index = end + 1;
    }
    Ok(deleted)
}
