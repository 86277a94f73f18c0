//! A node's storage opened again after a purge or a snapshot install, as
//! after a restart or a kill.

use std::time::{Duration, Instant};

use firstseen_raft::Storage;
use firstseen_raft::{Entry, LogId, SnapshotMeta};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{EntryPayload, RaftSnapshotBuilder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
    let purged = firstseen_raft::log_id(7, 3, 1_234);
    {
        let mut storage = firstseen_raft::open(dir.path()).await.unwrap();
        storage.log.purge(purged).await.unwrap();
    }
    let mut storage = reopen(dir.path()).await;
    let state = storage.log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(purged));
    assert_eq!(state.last_log_id, Some(purged));
}

fn id(index: u64) -> LogId {
    firstseen_raft::log_id(1, 1, index)
}

/// Applies blank entries `from..=to` and builds a snapshot of the result.
async fn applied_with_snapshot(
    storage: &mut Storage,
    from: u64,
    to: u64,
) -> firstseen_raft::Snapshot {
    let entries = (from..=to).map(|i| Entry {
        log_id: id(i),
        payload: EntryPayload::Blank,
    });
    storage.state_machine.apply_entries(entries).await.unwrap();
    let mut builder = storage.state_machine.get_snapshot_builder().await;
    builder.build_snapshot().await.unwrap()
}

/// Node B at 30 (with a snapshot there) and the bytes and meta of node A's
/// snapshot at 100, received by B into the file openraft asks it for.
async fn follower_receiving(dir: &std::path::Path) -> (Storage, SnapshotMeta, tokio::fs::File) {
    let leader_dir = tempfile::tempdir().unwrap();
    let mut leader = firstseen_raft::open(leader_dir.path()).await.unwrap();
    let snapshot = applied_with_snapshot(&mut leader, 1, 100).await;
    let mut data = Vec::new();
    let mut from = snapshot.snapshot;
    from.read_to_end(&mut data).await.unwrap();

    let mut follower = firstseen_raft::open(dir).await.unwrap();
    applied_with_snapshot(&mut follower, 1, 30).await;
    follower.log.purge(id(30)).await.unwrap();
    let mut into = openraft_legacy::network_v1::SnapshotReceiverFactory::begin_receiving_snapshot(
        &mut follower.state_machine,
    )
    .await
    .unwrap();
    into.write_all(&data).await.unwrap();
    into.flush().await.unwrap();
    (follower, snapshot.meta, into)
}

/// Finding 16: openraft 0.9 queues a follower's purge up to a received
/// snapshot's end beside the install, without waiting for it. The purge
/// used to record its point at once; a kill before the install finished
/// left a purge point past the only snapshot on disk, and the node refused
/// every start after ("the snapshot ends at … and the log was purged up to
/// …"). Now the purge waits for the snapshot to be on disk, and the node
/// killed meanwhile starts as it was.
#[tokio::test]
async fn a_kill_before_a_received_snapshot_is_installed_leaves_a_node_that_starts() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (follower, _meta, _received) = follower_receiving(dir.path()).await;
        let mut log = follower.log.clone();
        let mut purge = tokio::spawn(async move { log.purge(id(100)).await });
        // The install never comes: the purge must still be waiting. (Before
        // the fix it returned within milliseconds.)
        let waited = tokio::time::timeout(Duration::from_secs(2), &mut purge).await;
        assert!(
            waited.is_err(),
            "the purge ran ahead of the install: {waited:?}"
        );
        // The kill: the waiting purge and every handle dropped.
        purge.abort();
        let _ = purge.await;
    }
    let mut storage = reopen(dir.path()).await;
    let state = storage.log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(id(30)));
    let (applied, _) = storage.state_machine.applied_state().await.unwrap();
    assert_eq!(applied, Some(id(30)));
}

/// The same race run to its end: the purge completes once the install has
/// put the snapshot on disk, and a restart (with the state database lost,
/// so that it is rebuilt) comes back at the snapshot's end.
#[tokio::test]
async fn a_received_snapshot_is_on_disk_before_the_purge_it_came_with() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut follower, meta, received) = follower_receiving(dir.path()).await;
        let mut log = follower.log.clone();
        let purge = tokio::spawn(async move { log.purge(id(100)).await });
        follower
            .state_machine
            .install_snapshot(&meta, received)
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(30), purge)
            .await
            .expect("the purge ends once the snapshot is on disk")
            .unwrap()
            .unwrap();
        assert_eq!(current_last_log_id(&mut follower).await, Some(id(100)));
    }
    // The state database gone, as a damaged one is moved aside: rebuilt
    // from the snapshot, which covers the purge point.
    std::fs::remove_dir_all(firstseen_store::disk::Disk::state_dir(dir.path())).unwrap();
    let mut storage = reopen(dir.path()).await;
    let (applied, _) = storage.state_machine.applied_state().await.unwrap();
    assert_eq!(applied, Some(id(100)));
    let state = storage.log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(id(100)));
}

/// A received snapshot is checked against the hash its sender named it by
/// (the id the peer server hands over with the last chunk): bytes that do
/// not hash to it are refused, and the snapshot on disk stays the one it
/// was; the right hash installs. openraft 0.10 carries no id to the state
/// machine, so without the handed-over id nothing was checked.
#[tokio::test]
async fn a_received_snapshot_is_installed_only_if_it_hashes_to_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let (mut follower, meta, received) = follower_receiving(dir.path()).await;
    let before = current_last_log_id(&mut follower).await;
    let wrong = "0".repeat(64);
    follower
        .state_machine
        .incoming()
        .received(format!("T1-N1-100-{wrong}"));
    let refused = follower
        .state_machine
        .install_snapshot(&meta, received)
        .await;
    assert!(
        refused.is_err(),
        "a snapshot with the wrong hash was installed"
    );
    let after = current_last_log_id(&mut follower).await;
    assert_eq!(after, before, "the snapshot on disk changed");
    drop(follower);

    let dir = tempfile::tempdir().unwrap();
    let (mut follower, meta, mut received) = follower_receiving(dir.path()).await;
    let right = hash_of(&mut received).await;
    follower
        .state_machine
        .incoming()
        .received(format!("T1-N1-100-{right}"));
    follower
        .state_machine
        .install_snapshot(&meta, received)
        .await
        .unwrap();
    assert_eq!(current_last_log_id(&mut follower).await, Some(id(100)));
}

/// What the node's current snapshot covers.
async fn current_last_log_id(storage: &mut Storage) -> Option<LogId> {
    let current = storage.state_machine.get_current_snapshot().await.unwrap();
    current.unwrap().meta.last_log_id
}

/// The blake3 of what `received` holds, as its sender names it.
async fn hash_of(received: &mut tokio::fs::File) -> String {
    let mut data = Vec::new();
    tokio::io::AsyncSeekExt::seek(received, std::io::SeekFrom::Start(0))
        .await
        .unwrap();
    received.read_to_end(&mut data).await.unwrap();
    blake3::hash(&data).to_hex().to_string()
}

/// The last chunks of two transfers can pass each other on the peer server
/// (each request on a task of its own): the second snapshot's id arrives
/// before the first snapshot is installed. The first still installs under
/// its own id. With one slot for the id (before), it was checked against
/// the second snapshot's hash, refused as damaged, and the follower's Raft
/// stopped.
#[tokio::test]
async fn two_transfers_passing_each_other_each_install_under_their_own_id() {
    let dir = tempfile::tempdir().unwrap();
    let (mut follower, meta, mut received) = follower_receiving(dir.path()).await;
    let right = hash_of(&mut received).await;
    let incoming = follower.state_machine.incoming();
    incoming.received(format!("T1-N1-100-{right}"));
    // A newer snapshot's last chunk, served before this one's install.
    incoming.received(format!("T2-N1-253-{}", "7".repeat(64)));
    follower
        .state_machine
        .install_snapshot(&meta, received)
        .await
        .expect("installed under its own id");
    assert_eq!(current_last_log_id(&mut follower).await, Some(id(100)));
}
