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
use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::EntryPayload;
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

fn id(index: u64) -> LogId {
    firstseen_raft::log_id(5, 1, index)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_leader_answers_its_whole_log_not_a_rewound_commit_index() {
    let tmp = tempfile::tempdir().unwrap();
    let mut storage = firstseen_raft::open(tmp.path()).await.unwrap();
    // Node 1 led term 5 and wrote 60 entries, all of them committed and
    // acked before the power cut; its disk kept commit index 10.
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
    let membership = Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes).unwrap();
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

    let config = openraft::Config {
        heartbeat_interval: 100,
        election_timeout_min: 400,
        election_timeout_max: 800,
        enable_elect: false,
        ..Default::default()
    };
    let raft = Raft::new(
        1,
        Arc::new(config.validate().unwrap()),
        HeartbeatsOnly,
        storage.log,
        storage.state_machine,
    )
    .await
    .unwrap();
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
