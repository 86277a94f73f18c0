//! A node's storage opened again after a purge, as after a restart.

use std::time::{Duration, Instant};

use firstseen_raft::Storage;
use openraft::storage::RaftLogStorage;
use openraft::{CommittedLeaderId, LogId};

/// Opens the storage in `dir`, waiting for the previous instance's
/// background threads to let go of sled's file lock.
async fn reopen(dir: &std::path::Path) -> Storage {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match firstseen_raft::open(dir).await {
            Ok(s) => return s,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("storage did not reopen: {e}"),
        }
    }
}

#[tokio::test]
async fn the_purge_point_survives_a_restart_in_a_later_term() {
    let dir = tempfile::tempdir().unwrap();
    // Term 2 and beyond: the first byte of the stored id is no Option tag.
    let purged = LogId::new(CommittedLeaderId::new(7, 3), 1_234);
    {
        let mut storage = firstseen_raft::open(dir.path()).await.unwrap();
        storage.log.purge(purged).await.unwrap();
    }
    let mut storage = reopen(dir.path()).await;
    let state = storage.log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(purged));
    assert_eq!(state.last_log_id, Some(purged));
}
