//! A damaged Raft log at start-up: refused, or set aside with the vote kept
//! and the state rebuilt from the snapshot (see `firstseen_raft::rejoin`).

use std::time::{Duration, Instant};

use firstseen_raft::{rejoin, OnDamagedLog, RaftError, Storage};
use firstseen_raft::{Entry, LogId, Vote};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{EntryPayload, RaftLogReader, RaftSnapshotBuilder};

fn id(index: u64) -> LogId {
    firstseen_raft::log_id(3, 1, index)
}

/// Opens with `policy`, waiting for the previous instance's threads to let
/// go of sled's file lock (an error that is not damage).
async fn open(dir: &std::path::Path, policy: OnDamagedLog) -> Result<Storage, RaftError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match firstseen_raft::open_with(dir, policy).await {
            Err(RaftError::Store(e))
                if Instant::now() < deadline && e.to_string().contains("lock") =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

/// A node at term 5 with 60 entries, applied, and a snapshot at 40.
async fn node_with_history(dir: &std::path::Path) -> Vote {
    let mut storage = open(dir, OnDamagedLog::Refuse).await.unwrap();
    let vote = Vote::new_committed(5, 2);
    storage.log.save_vote(&vote).await.unwrap();
    let entries: Vec<_> = (1..=60)
        .map(|i| Entry {
            log_id: id(i),
            payload: EntryPayload::Blank,
        })
        .collect();
    storage.log.blocking_append(entries.clone()).await.unwrap();
    storage
        .state_machine
        .apply_entries(entries[..40].to_vec())
        .await
        .unwrap();
    let mut builder = storage.state_machine.get_snapshot_builder().await;
    builder.build_snapshot().await.unwrap();
    storage
        .state_machine
        .apply_entries(entries[40..].to_vec())
        .await
        .unwrap();
    vote
}

fn truncate_log(dir: &std::path::Path) {
    let db = dir.join("log/db");
    let len = std::fs::metadata(&db).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&db)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
}

#[tokio::test]
async fn a_damaged_log_is_refused_or_set_aside_keeping_the_vote() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let vote = node_with_history(dir).await;
    truncate_log(dir);

    // A group of one: the log is the only copy.
    match open(dir, OnDamagedLog::Refuse).await {
        Err(e) => assert!(
            e.to_string().contains("log/db") && e.to_string().contains("damaged"),
            "{e}"
        ),
        Ok(_) => panic!("a truncated log opened"),
    }
    assert!(!rejoin::pending(dir));

    // A disk without room: a full disk explains errors that look like
    // damage, so the log stays.
    let full = OnDamagedLog::Rejoin {
        min_free_bytes: u64::MAX,
    };
    assert!(open(dir, full).await.is_err());
    assert!(!rejoin::pending(dir) && dir.join("log/db").exists());

    let rejoin = OnDamagedLog::Rejoin { min_free_bytes: 0 };
    let mut storage = open(dir, rejoin).await.unwrap();
    assert!(rejoin::pending(dir), "the node abstains until caught up");
    assert!(dir.join(rejoin::SET_ASIDE).join("db").exists());
    // The vote is kept, so no second vote in term 5.
    assert_eq!(storage.log.read_vote().await.unwrap(), Some(vote));
    let log = storage.log.get_log_state().await.unwrap();
    assert_eq!(log.last_log_id, None, "the log starts empty");
    // The state, which refers into the log, came back from the snapshot.
    let (applied, _) = storage.state_machine.applied_state().await.unwrap();
    assert_eq!(applied, Some(id(40)));
    drop(storage);

    // A restart before catching up still abstains, with the same log.
    let storage = open(dir, rejoin).await.unwrap();
    assert!(rejoin::pending(dir));
    drop(storage);
    let first_copy = std::fs::metadata(dir.join(rejoin::SET_ASIDE).join("db"))
        .unwrap()
        .len();

    // The rejoin's own log damaged before it caught up (emptied: its vote
    // is gone, which the guard refuses): set aside again, and the first
    // damaged copy is the one kept.
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("log/db"))
        .unwrap()
        .set_len(0)
        .unwrap();
    let mut storage = open(dir, rejoin).await.unwrap();
    assert!(rejoin::pending(dir));
    assert_eq!(
        std::fs::metadata(dir.join(rejoin::SET_ASIDE).join("db"))
            .unwrap()
            .len(),
        first_copy
    );
    assert_eq!(storage.log.read_vote().await.unwrap(), Some(vote));
    drop(storage);
    rejoin::finish(dir).unwrap();
    assert!(!rejoin::pending(dir));
}
