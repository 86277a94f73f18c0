//! The one mutex-poisoning policy of every firstseen crate.
//!
//! A mutex is poisoned when a thread panicked while holding it. Here that
//! panic is never lost: every task has an owner that reports it, and the
//! node stops (the supervisor, or the watchdog for storage). What each lock
//! guards (a status string, an ack gate's session, a queue, a table of
//! counts) is changed by a few assignments that leave it consistent at
//! every unlock, so a poisoned lock's data is used as it is, rather than
//! panicking a second task over the first one's panic while the node stops
//! in order.

use std::sync::{Mutex, MutexGuard};

/// Locks `m` under the policy above.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
