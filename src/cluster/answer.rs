//! What a request from an authenticated peer is answered with: the node's
//! parts a connection reaches ([`PeerService`]), the answer to each request
//! ([`dispatch`]), and how Raft's answers are noted and put on the link.
//! The listener (`server`) and a connection's ordered appends (`lane`) both
//! answer through here, so neither reaches into the other.

use std::sync::Arc;

use firstseen_raft::{NodeId, Raft, TypeConfig};
use firstseen_store::{Batch, Outcome};
use futures::future::BoxFuture;
use openraft::error::RaftError;
use openraft::raft::AppendEntriesResponse;
use openraft_legacy::network_v1::{
    ChunkedSnapshotReceiver, InstallSnapshotError, SnapshotMismatch, SnapshotSegmentId,
};

use super::liveness::{Liveness, Timing};
use super::wire::{self, ClusterKey, ForwardError, Reply, Request};
use crate::tls::PeerTls;

/// Commits batches that followers forward to this node while it leads.
/// The proposer implements it (`crate::propose`); the network only carries
/// the request and the answer.
pub trait Forwarded: Send + Sync + 'static {
    /// Commits `batch` and answers, after the commit, with one outcome per
    /// observation.
    fn commit(&self, batch: Batch) -> BoxFuture<'_, Result<Vec<Outcome>, ForwardError>>;
}

/// What a peer connection can reach on this node.
pub struct PeerService {
    pub node_id: NodeId,
    pub raft: Raft,
    pub key: ClusterKey,
    /// Commits forwarded batches when this node leads.
    pub forwarded: Arc<dyn Forwarded>,
    /// Set when peers must connect with TLS.
    pub tls: Option<PeerTls>,
    /// Replication that would write is refused while the disk is low.
    pub disk: Arc<crate::diskspace::DiskSpace>,
    /// Accepted appends are a follower's evidence that its leader lives.
    pub liveness: Arc<Liveness>,
    pub timing: Timing,
    /// Snapshot chunks are checked against what has arrived before Raft
    /// writes them (see [`wire::SnapshotProgress`]).
    pub snapshot: std::sync::Mutex<wire::SnapshotProgress>,
    /// The id the snapshot's sender gave it, handed to the state machine
    /// with the last chunk: it ends with the data's blake3, which openraft
    /// 0.10 does not carry to the state machine.
    pub incoming: firstseen_raft::state_machine::Incoming,
}

/// A reply carrying Raft's answer, as the peer link can carry it. A core
/// that stopped or panicked encodes the same in every release; openraft
/// 0.10's storage error does not (0.9's was an enum, 0.10's is a struct),
/// and a reply the other side cannot decode closes the whole link and
/// fails every call on it. So a storage error goes as a refusal in words,
/// which every release reads: the leader backs off as from an unreachable
/// node, which a node whose core is gone is.
pub(super) fn on_the_wire<T, E>(
    result: Result<T, RaftError<TypeConfig, E>>,
    reply: impl FnOnce(Result<T, RaftError<TypeConfig, E>>) -> Reply,
) -> Reply
where
    E: std::error::Error,
{
    match result {
        Err(RaftError::Fatal(openraft::error::Fatal::StorageError(e))) => {
            Reply::Refused(format!("raft stopped on a storage error: {e}"))
        }
        other => reply(other),
    }
}

/// What a follower notes of an append it answered, however it reached Raft
/// (`dispatch` or a connection's lane).
pub(super) fn after_append(
    svc: &PeerService,
    entries: usize,
    prev: Option<firstseen_raft::LogId>,
    took: std::time::Duration,
    result: &Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>>,
) {
    if entries > 0 {
        // The follower's side of an append: its log write and sync.
        metrics::histogram!("firstseen_commit_leg_seconds", "leg" => "follower_append")
            .record(took.as_secs_f64());
    }
    // openraft's leader gives the whole append one heartbeat; one
    // that takes longer here is lost to the leader and sent again.
    if took > svc.timing.heartbeat {
        metrics::counter!("firstseen_raft_slow_appends_total").increment(1);
        tracing::debug!(
            entries,
            prev = ?prev,
            took_ms = took.as_millis() as u64,
            result = ?result.as_ref().map_err(|e| e.to_string()),
            "append took longer than the leader waits"
        );
    }
    // Accepted from a leader whose term this node follows (a
    // conflict too: the leader is alive, only the logs differ).
    if matches!(
        result,
        Ok(AppendEntriesResponse::Success
            | AppendEntriesResponse::PartialSuccess(_)
            | AppendEntriesResponse::Conflict)
    ) {
        svc.liveness.leader_contact();
    }
}

/// Serves one request from an authenticated peer. Public for the
/// whole-cluster simulation, whose network hands requests straight to it.
pub async fn dispatch(svc: &PeerService, request: Request) -> Reply {
    // Refused before openraft sees it: a write that fails in sled is fatal
    // to the Raft node, and a leader carries on without this member. Empty
    // appends (heartbeats) still pass, so this node keeps its leader.
    let writes = match &request {
        Request::AppendEntries(r) => !r.entries.is_empty(),
        Request::InstallSnapshot(_) => true,
        Request::Vote(_)
        | Request::Forward(_)
        | Request::ForwardKinds { .. }
        | Request::PreVote(_)
        | Request::ReadIndex
        | Request::Levels => false,
    };
    if writes {
        if let Some(reason) = svc.disk.reason() {
            return Reply::Refused(reason);
        }
    }
    match request {
        Request::AppendEntries(r) => {
            let started = std::time::Instant::now();
            let (entries, prev) = (r.entries.len(), r.prev_log_id);
            let result = svc.raft.append_entries(r).await;
            after_append(svc, entries, prev, started.elapsed(), &result);
            on_the_wire(result, Reply::AppendEntries)
        }
        // Rejoining with a set-aside log: a vote could elect a candidate
        // that lacks an entry this node had acknowledged.
        Request::Vote(_) if svc.liveness.abstaining() => {
            Reply::Vote(Ok(super::elect::refuse_vote(&svc.raft)))
        }
        Request::Vote(r) => on_the_wire(svc.raft.vote(r.into()).await, Reply::Vote),
        Request::InstallSnapshot(r) => {
            let id = r.meta.snapshot_id.clone();
            let checked = firstseen_store::lock::lock(&svc.snapshot).accept(
                &id,
                r.offset,
                r.data.len() as u64,
            );
            if let Err(expect) = checked {
                tracing::warn!(snapshot = %id, offset = r.offset, expect, "snapshot chunk past what has arrived refused");
                return Reply::InstallSnapshot(Err(openraft::error::RaftError::APIError(
                    InstallSnapshotError::SnapshotMismatch(SnapshotMismatch {
                        expect: SnapshotSegmentId {
                            id: id.clone(),
                            offset: expect,
                        },
                        got: SnapshotSegmentId {
                            id,
                            offset: r.offset,
                        },
                    }),
                )));
            }
            if r.done {
                svc.incoming.received(r.meta.snapshot_id.clone());
            }
            let result = svc.raft.install_snapshot(r).await;
            if result.is_ok() {
                svc.liveness.leader_contact();
            }
            on_the_wire(result, Reply::InstallSnapshot)
        }
        Request::Forward(batch) => Reply::Forward(svc.forwarded.commit(batch).await),
        Request::ForwardKinds { mut batch, kinds } => {
            // As many kinds as copies, or none: a short list from a broken
            // peer must not shift kinds onto the wrong copies.
            if kinds.len() == batch.len() {
                batch.kinds = kinds;
            }
            Reply::Forward(svc.forwarded.commit(batch).await)
        }
        Request::Levels => Reply::Levels(super::wire::Levels::this_release()),
        Request::PreVote(req) => Reply::PreVote(super::elect::answer(
            &svc.raft,
            &svc.liveness,
            &svc.timing,
            &req,
        )),
        Request::ReadIndex => {
            Reply::ReadIndex(super::elect::read_index(&svc.raft, &svc.timing).await)
        }
    }
}

#[cfg(test)]
mod tests {
    /// A dead core's storage error crosses the link as words every release
    /// reads; a stopped core's refusal keeps openraft's bytes (the same in
    /// 0.9 and 0.10), and an answer is untouched.
    #[test]
    fn a_storage_error_goes_as_words_and_nothing_else_changes() {
        use super::{on_the_wire, Reply};
        use firstseen_raft::TypeConfig;
        use openraft::error::{Fatal, RaftError};
        use openraft::raft::AppendEntriesResponse;
        use openraft::{ErrorSubject, ErrorVerb, StorageError};
        let failed: Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>> = Err(
            RaftError::Fatal(Fatal::StorageError(StorageError::from_io_error(
                ErrorSubject::Logs,
                ErrorVerb::Write,
                std::io::Error::other("disk gone"),
            ))),
        );
        match on_the_wire(failed, Reply::AppendEntries) {
            Reply::Refused(why) => assert!(why.contains("disk gone"), "{why}"),
            other => panic!("{other:?}"),
        }
        let stopped: Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>> =
            Err(RaftError::Fatal(Fatal::Stopped));
        assert!(matches!(
            on_the_wire(stopped, Reply::AppendEntries),
            Reply::AppendEntries(Err(RaftError::Fatal(Fatal::Stopped)))
        ));
        assert!(matches!(
            on_the_wire(Ok(AppendEntriesResponse::Success), Reply::AppendEntries),
            Reply::AppendEntries(Ok(AppendEntriesResponse::Success))
        ));
    }
}
