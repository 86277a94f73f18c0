//! The read index a rejoining node waits for, on a real openraft leader over
//! firstseen's storage whose stored commit index went back.
//!
//! After every node lost power, the commit index each read back is what its
//! last unsynced write left: behind entries that were committed, and acked
//! upstream, before the cut. A leader restored at start (its committed vote
//! makes it leader again without an election) reuses the first entry of its
//! term as its "noop", so openraft's read index, the larger of that and the
//! commit index, was behind those entries too. A node that had set its
//! damaged log aside took that as the point where it held every committed
//! entry, and voted again too early. The answer must cover the leader's whole
//! log.
//!
//! Also here, on the same harness: a node whose state went back behind its
//! snapshot comes back whole at start.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use firstseen::cluster::elect::read_index;
use firstseen::cluster::liveness::Timing;
use firstseen_raft::{Entry, LogId, Member, Membership, NodeId, Raft, TypeConfig, Vote};
use openraft::error::{RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, ReadPolicy, VoteRequest, VoteResponse,
};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::EntryPayload;
use openraft::RaftSnapshotBuilder;
use openraft_legacy::network_v1::{
    Adapter, InstallSnapshotError, InstallSnapshotRequest, InstallSnapshotResponse, RaftNetwork,
};

/// Followers that answer heartbeats (so a quorum confirms the leader) and
/// never take entries (so the commit index stays where the disk left it).
#[derive(Clone)]
struct HeartbeatsOnly;

impl RaftNetworkFactory<TypeConfig> for HeartbeatsOnly {
    type Network = Adapter<TypeConfig, HeartbeatsOnly, tokio::fs::File>;
    async fn new_client(&mut self, _target: NodeId, _node: &Member) -> Self::Network {
        Adapter::new(HeartbeatsOnly)
    }
}

impl RaftNetwork<TypeConfig> for HeartbeatsOnly {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig, RaftError<TypeConfig>>>
    {
        if rpc.entries.is_empty() {
            Ok(AppendEntriesResponse::Success)
        } else {
            Err(RPCError::Unreachable(Unreachable::new(
                &std::io::Error::other("takes no entries"),
            )))
        }
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<TypeConfig>,
        RPCError<TypeConfig, RaftError<TypeConfig, InstallSnapshotError>>,
    > {
        Err(RPCError::Unreachable(Unreachable::new(
            &std::io::Error::other("takes no snapshots"),
        )))
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig, RaftError<TypeConfig>>> {
        Err(RPCError::Unreachable(Unreachable::new(
            &std::io::Error::other("no votes"),
        )))
    }
}

/// Starts node 1's Raft on `storage`, with followers that only answer
/// heartbeats and no elections.
async fn start(storage: firstseen_raft::Storage) -> Raft {
    let config = openraft::Config {
        heartbeat_interval: 100,
        election_timeout_min: 400,
        election_timeout_max: 800,
        enable_elect: false,
        ..Default::default()
    };
    Raft::new(
        1,
        Arc::new(config.validate().unwrap()),
        HeartbeatsOnly,
        storage.log,
        storage.state_machine,
    )
    .await
    .unwrap()
}

/// Nodes 1 to 3, each in its own zone.
fn three_members() -> Membership {
    let nodes: BTreeMap<NodeId, Member> = (1..=3)
        .map(|n| {
            (
                n,
                Member {
                    addr: format!("node-{n}:7000"),
                    zone: format!("zone-{n}"),
                    http: String::new(),
                },
            )
        })
        .collect();
    Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes).unwrap()
}

fn id(index: u64) -> LogId {
    firstseen_raft::log_id(5, 1, index)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_leader_answers_its_whole_log_not_a_rewound_commit_index() {
    let tmp = tempfile::tempdir().unwrap();
    let mut storage = firstseen_raft::open(tmp.path()).await.unwrap();
    // Node 1 led term 5 and wrote 60 entries, all of them committed and
    // acked before the power cut; its disk kept commit index 10.
    let membership = three_members();
    // openraft's first entry is index 0.
    let mut entries = vec![Entry {
        log_id: id(0),
        payload: EntryPayload::Membership(membership),
    }];
    entries.extend((1..=60).map(|i| Entry {
        log_id: id(i),
        payload: EntryPayload::Blank,
    }));
    storage
        .log
        .save_vote(&Vote::new_committed(5, 1))
        .await
        .unwrap();
    storage.log.blocking_append(entries.clone()).await.unwrap();
    storage
        .state_machine
        .apply_entries(entries[..=10].to_vec())
        .await
        .unwrap();
    storage.log.save_committed(Some(id(10))).await.unwrap();

    let raft = start(storage).await;
    let timing = Timing {
        heartbeat: Duration::from_millis(100),
        election_min: Duration::from_millis(400),
        election_max: Duration::from_millis(800),
    };
    // Restored as leader without an election: openraft's own read index
    // is the rewound commit index.
    let mut answer = None;
    for _ in 0..50 {
        if let Ok(index) = read_index(&raft, &timing).await {
            answer = Some(index);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (openraft_read, _) = raft.get_read_log_id(ReadPolicy::ReadIndex).await.unwrap();
    raft.shutdown().await.unwrap();
    assert_eq!(
        openraft_read.index(),
        10,
        "the premise: openraft's read index is the rewound commit index"
    );
    let answer = answer.expect("the leadership was never confirmed");
    assert_eq!(
        answer.map(|l| l.index),
        Some(60),
        "the read index must cover every entry the leader holds"
    );
}

/// Opens the storage in `dir`, waiting for the previous instance's
/// background threads to let go of sled's file lock.
async fn reopen(dir: &std::path::Path) -> firstseen_raft::Storage {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match firstseen_raft::open(dir).await {
            Ok(s) => return s,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("storage did not reopen: {e}"),
        }
    }
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Review finding 6 of the move to openraft 0.10: a node whose state
/// database lost its unsynced tail after a snapshot was built starts with
/// its applied marker behind the current snapshot. openraft 0.9 replayed
/// the log from the marker; 0.10 first installs the current snapshot into
/// the state machine (its `restore_from_snapshot`, before `Raft::new`
/// returns), then replays from there. Either way the node must come back
/// with every committed message in its outbox once, in order, and leave no
/// received-snapshot file behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_behind_its_snapshot_comes_back_whole_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let backup = tempfile::tempdir().unwrap();
    let state_dir = firstseen_store::disk::Disk::state_dir(tmp.path());
    let observe = |i: u64| {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&i.to_be_bytes());
        firstseen_store::Command::Observe {
            stamped_ms: 1_000 + i,
            window: firstseen_store::Window::from_ms(3_600_000),
            observations: vec![firstseen_store::Observation {
                key,
                mqtt_topic: "/hfp/restore".into(),
                pulsar_topic: "restored".into(),
                payload: format!("message {i}").into_bytes(),
                qos: 1,
                retain: false,
                node: 1,
                received_ms: 0,
            }],
        }
    };
    let mut entries = vec![Entry {
        log_id: id(0),
        payload: EntryPayload::Membership(three_members()),
    }];
    entries.extend((1..=50).map(|i| Entry {
        log_id: id(i),
        payload: EntryPayload::Normal(observe(i)),
    }));
    {
        let mut storage = firstseen_raft::open(tmp.path()).await.unwrap();
        storage
            .log
            .save_vote(&Vote::new_committed(5, 1))
            .await
            .unwrap();
        storage.log.blocking_append(entries.clone()).await.unwrap();
        storage.log.save_committed(Some(id(50))).await.unwrap();
        storage
            .state_machine
            .apply_entries(entries[..=20].to_vec())
            .await
            .unwrap();
        // Applied entries reach the disk with the state's next sync.
        storage.state.flush().unwrap();
    }
    // The state database as it stood at 20: what a power cut leaves when
    // the writes after it never reached the disk.
    {
        let _storage = reopen(tmp.path()).await;
        copy_tree(&state_dir, backup.path());
    }
    {
        let mut storage = reopen(tmp.path()).await;
        storage
            .state_machine
            .apply_entries(entries[21..=40].to_vec())
            .await
            .unwrap();
        let mut builder = storage.state_machine.get_snapshot_builder().await;
        let built = builder.build_snapshot().await.unwrap();
        assert_eq!(built.meta.last_log_id, Some(id(40)));
        storage.state.flush().unwrap();
    }
    // Wait for the last instance to let go before its state is replaced.
    drop(reopen(tmp.path()).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    std::fs::remove_dir_all(&state_dir).unwrap();
    copy_tree(backup.path(), &state_dir);

    let mut storage = reopen(tmp.path()).await;
    let (applied, _) = storage.state_machine.applied_state().await.unwrap();
    assert_eq!(applied, Some(id(20)), "the premise: the state went back");
    let current = storage
        .state_machine
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("the snapshot built at 40");
    assert_eq!(current.meta.last_log_id, Some(id(40)), "the premise");

    let outbox = storage.outbox.clone();
    let snapshot_files = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(tmp.path().join("snapshots"))
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let before = snapshot_files();
    let raft = start(storage).await;
    // The start-up install ran: it writes the snapshot anew under a new
    // name (a replay from the log alone would leave the files as they were).
    let installed = snapshot_files();
    let caught_up = raft
        .wait(Some(Duration::from_secs(30)))
        .applied_index_at_least(Some(50), "replayed to the commit index")
        .await;
    raft.shutdown().await.unwrap();
    caught_up.expect("the node applied every committed entry");
    assert_ne!(before, installed, "the snapshot was not installed at start");
    let read = outbox.read("restored", 1, 100).unwrap();
    let payloads: Vec<String> = read
        .iter()
        .map(|(_, m)| String::from_utf8(m.payload.clone()).unwrap())
        .collect();
    let expected: Vec<String> = (1..=50).map(|i| format!("message {i}")).collect();
    assert_eq!(payloads, expected, "every committed message once, in order");
    let strays: Vec<_> = snapshot_files()
        .into_iter()
        .filter(|name| name.starts_with("incoming"))
        .collect();
    assert!(
        strays.is_empty(),
        "received-snapshot files left: {strays:?}"
    );
}
