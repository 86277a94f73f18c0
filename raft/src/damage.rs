//! What counts as damage: an error or a panic that says a file's data is
//! bad, as opposed to one that says it cannot be reached (a lock still
//! held, permissions, a full disk). Damage is set aside and rebuilt (see
//! `open` and `rejoin`); anything else is reported and never "repaired".

use std::path::Path;

use crate::RaftError;

/// A file beside the databases saying the state database was found
/// inconsistent while the log was applied to it; the next start rebuilds the
/// state (see `crate::open`).
pub(crate) const STATE_DAMAGED: &str = "state.damaged";

/// Records that applying the log found the state database inconsistent
/// (`reason`), so that the next start rebuilds it. Blocking; best effort,
/// since the caller is about to report the failure anyway.
pub(crate) fn mark_state_damaged(dir: &Path, reason: &str) {
    let path = dir.join(STATE_DAMAGED);
    let written = std::fs::write(&path, format!("{reason}\n"))
        .and_then(|()| std::fs::File::open(&path)?.sync_all())
        .map_err(|e| e.to_string())
        .and_then(|()| firstseen_store::disk::sync_dir(dir).map_err(|e| e.to_string()));
    match written {
        Ok(()) => tracing::error!(
            file = %path.display(),
            reason,
            "the state database is inconsistent with the log it applied; the next start rebuilds it from the current snapshot and the Raft log"
        ),
        Err(e) => {
            tracing::error!(file = %path.display(), error = %e, "could not record that the state database is inconsistent")
        }
    }
}

/// Whether a state store error means its data is damaged (rather than
/// unreachable).
pub(crate) fn store_damage(e: &firstseen_store::StoreError) -> bool {
    use firstseen_store::StoreError as S;
    match e {
        S::Damaged { .. } | S::Corrupt(_) | S::Codec(_) => true,
        S::Sled(s) => sled_damage(s),
        // Sound data of a newer release: rebuilding it would not help.
        S::Log(_) | S::Io(_) | S::File { .. } | S::TooNew(_) => false,
    }
}

/// Whether a sled error means damaged data. A file sled's own records point
/// at and cannot find is damage too: after a power cut sled removes blobs
/// "with a higher lsn than our stable log" at start-up, and a later read of
/// the state then failed with ENOENT on every start (the soak). Locks,
/// permissions and a full disk are other kinds and are not repaired.
fn sled_damage(e: &sled::Error) -> bool {
    match e {
        sled::Error::Corruption { .. }
        | sled::Error::ReportableBug(_)
        | sled::Error::Unsupported(_) => true,
        sled::Error::Io(io) => io.kind() == std::io::ErrorKind::NotFound,
        _ => false,
    }
}

/// The message of a caught panic, for the error that reports it.
pub(crate) fn panic_reason(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "sled panicked while reading it".into())
}

/// Whether an error opening or loading the state database means its data is
/// damaged (rather than unreachable).
pub(crate) fn is_damage(e: &RaftError) -> bool {
    match e {
        RaftError::Damaged { .. } | RaftError::Codec(_) | RaftError::GuardTooLarge(_) => true,
        RaftError::Sled(s) => sled_damage(s),
        RaftError::Store(s) => store_damage(s),
        RaftError::Io { .. } | RaftError::Task { .. } => false,
    }
}
