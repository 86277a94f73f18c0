//! The peer listener: authenticates each connection once, then serves the
//! requests it carries, many at a time, each answered with its own id as
//! soon as it is ready. A peer that fails the handshake, or sends an
//! oversized or undecodable frame, is disconnected with a logged reason;
//! the node itself is never affected.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use firstseen_raft::{NodeId, Raft, TypeConfig};
use firstseen_store::{Batch, Outcome};
use futures::future::BoxFuture;
use openraft::error::RaftError;
use openraft::raft::AppendEntriesResponse;
use openraft_legacy::network_v1::{
    ChunkedSnapshotReceiver, InstallSnapshotError, SnapshotMismatch, SnapshotSegmentId,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::frames::{write_frames, FrameReader, ReadError};
use super::liveness::{Liveness, Timing};
use super::wire::{self, ClusterKey, Envelope, ForwardError, Reply, Request};
use crate::telemetry::RefusalLog;
use crate::tls::{BoxStream, PeerTls};

/// How long a connecting peer has to complete the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests of one connection served at once; more wait to be read.
const IN_FLIGHT_PER_CONN: usize = 256;
/// Connections that have not yet authenticated, served at once. A real
/// cluster needs a handful (one per peer, once); a flood of half-open
/// connections is refused beyond this instead of each holding a task, a
/// socket and a TLS state for the handshake timeout.
const MAX_HANDSHAKES: usize = 64;
/// Of those, what one address (an IPv6 /64) may hold. Without it a single
/// host opening connections faster than they time out holds all 64, and a
/// member's connection gets in only when one times out.
const MAX_HANDSHAKES_PER_ADDRESS: usize = 8;
/// Handshakes each member address may have under way, apart from the 64:
/// a flood from other addresses, however many, cannot hold these (G8: a
/// host that is not a member cannot keep members from reaching each other).
/// A member opens one connection per peer, so a few are plenty.
const MEMBER_HANDSHAKES: usize = 4;
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

/// Accepts peer connections until `shutdown`, and waits for them to end.
pub async fn serve(listener: TcpListener, service: Arc<PeerService>, shutdown: CancellationToken) {
    let tracker = TaskTracker::new();
    let admission = Arc::new(crate::peraddr::Admission::new(
        MAX_HANDSHAKES_PER_ADDRESS,
        MAX_HANDSHAKES,
        MEMBER_HANDSHAKES,
    ));
    for ip in member_ips(&service.raft).await {
        admission.learn(ip);
    }
    let refusals = Arc::new(RefusalLog::new(
        "firstseen_peer_refused_total",
        "peer connection",
    ));
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "peer accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let slot = match admission.take(peer.ip()) {
            Ok(slot) => slot,
            Err(crate::peraddr::Full::Client) => {
                refusals.refused(
                    peer,
                    "too many connections from one address still authenticating",
                );
                continue;
            }
            Err(crate::peraddr::Full::All) => {
                refusals.refused(peer, "too many connections still authenticating");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let stop = shutdown.clone();
        let refusals = refusals.clone();
        let admission = admission.clone();
        tracker.spawn(async move {
            tokio::select! {
                r = connection(stream, peer, &service, &stop, slot, &admission) => {
                    if let Err(reason) = r {
                        refusals.refused(peer, &reason.to_string());
                    }
                }
                _ = stop.cancelled() => {}
            }
        });
    }
    tracker.close();
    tracker.wait().await;
}

/// The addresses the configured members' peer addresses resolve to: the
/// members' reserve before any of them has connected. Where a member dials
/// from another address (a proxy, a NAT), its first authenticated
/// connection teaches it.
async fn member_ips(raft: &Raft) -> Vec<std::net::IpAddr> {
    let addrs: Vec<String> = raft
        .metrics()
        .borrow()
        .membership_config
        .nodes()
        .map(|(_, m)| m.addr.clone())
        .collect();
    let mut ips = Vec::new();
    for addr in addrs {
        if let Ok(Ok(found)) = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::lookup_host(addr.as_str()),
        )
        .await
        {
            ips.extend(found.map(|a| a.ip()));
        }
    }
    ips
}

/// Why a peer connection was refused or ended other than cleanly.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("TLS handshake failed: {0}")]
    Tls(#[source] std::io::Error),
    #[error("handshake timed out")]
    HandshakeTimeout,
    #[error("write failed: {0}")]
    Write(#[source] std::io::Error),
    #[error("no handshake from peer: {0}")]
    NoHandshake(#[source] std::io::Error),
    #[error(transparent)]
    Handshake(#[from] wire::HandshakeError),
    #[error("node {node}: {source}")]
    Frame {
        node: NodeId,
        #[source]
        source: ReadError,
    },
}

/// Serves one connection. Returns `Err` when the peer is refused; a clean
/// close by the peer is `Ok`.
async fn connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    svc: &Arc<PeerService>,
    stop: &CancellationToken,
    handshake_slot: crate::peraddr::Slot,
    admission: &crate::peraddr::Admission,
) -> Result<(), ConnectionError> {
    let s = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let mut s: BoxStream = match &svc.tls {
            Some(tls) => Box::new(
                tls.acceptor
                    .accept(tcp)
                    .await
                    .map_err(ConnectionError::Tls)?,
            ),
            None => Box::new(tcp),
        };
        let (node, out, inn) = handshake(&mut s, svc).await?;
        Ok::<_, ConnectionError>((s, node, out, inn))
    })
    .await
    .map_err(|_| ConnectionError::HandshakeTimeout)??;
    let (s, node, seal, check) = (s.0, s.1, s.2, s.3);
    drop(handshake_slot);
    // It proved the secret: its address gets the members' reserve from now
    // on, so a flood cannot keep it out when it connects again.
    admission.learn(peer.ip());
    tracing::debug!(peer = %peer, node, "peer authenticated");
    metrics::counter!("firstseen_peer_accepted_total").increment(1);
    let (rd, wr) = tokio::io::split(s);
    let (replies, out) = mpsc::channel::<Vec<u8>>(IN_FLIGHT_PER_CONN);
    let done = stop.child_token();
    // The connection's tasks: its writer, and one per request being served.
    let handlers = TaskTracker::new();
    let writer = handlers.spawn(write_frames(wr, seal, out, done.clone()));
    let slots = Arc::new(Semaphore::new(IN_FLIGHT_PER_CONN));
    // This connection's appends reach Raft in the order they arrived.
    let (lane, lane_task) = super::lane::Lane::new(svc.clone(), done.clone());
    handlers.spawn(lane_task);
    let mut incoming = FrameReader::new(rd, check);
    let result = loop {
        let read = tokio::select! {
            r = incoming.next::<Request>() => r,
            _ = done.cancelled() => break Ok(()),
        };
        let env = match read {
            Ok(env) => env,
            Err(ReadError::Closed) => break Ok(()),
            Err(source) => break Err(ConnectionError::Frame { node, source }),
        };
        svc.liveness.peer_seen(node);
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break Ok(());
        };
        let (svc, replies, gone) = (svc.clone(), replies.clone(), done.clone());
        // Queued here, on the reader, so that the lane has them in order.
        let laned = match env.body {
            Request::AppendEntries(r) => Ok(lane.submit(r)),
            other => Err(other),
        };
        handlers.spawn(async move {
            let _slot = slot;
            let serve = async {
                match laned {
                    // A lane that ended answers nothing: the connection is
                    // closing.
                    Ok(answer) => answer.await.ok(),
                    Err(request) => Some(dispatch(&svc, request).await),
                }
            };
            let reply = tokio::select! {
                Some(r) = serve => r,
                // The reply would have nowhere to go. What the request
                // started goes on without it: openraft still applies an
                // append, the coalescer still commits a forward, and the
                // follower repeats what it did not hear back about.
                _ = gone.cancelled() => return,
            };
            match wire::encode(&Envelope {
                id: env.id,
                body: reply,
            }) {
                Ok(frame) => {
                    let _ = replies.send(frame).await;
                }
                Err(e) => tracing::error!(error = %e, "cannot encode a peer reply"),
            }
        });
    };
    // Requests still being served (a forward waiting for its commit) stop
    // waiting: their replies have nowhere to go.
    done.cancel();
    handlers.close();
    drop(replies);
    // The writer's end is its own: a panic in it is reported, not lost.
    if let Err(e) = writer.await {
        tracing::error!(error = %e, node, "peer connection writer failed");
    }
    handlers.wait().await;
    result
}

/// Mutual authentication; returns the peer's node id and the connection's
/// frame seals (outgoing, incoming).
async fn handshake(
    s: &mut BoxStream,
    svc: &PeerService,
) -> Result<(NodeId, wire::FrameSeal, wire::FrameSeal), ConnectionError> {
    let challenge = wire::nonce();
    s.write_all(&wire::handshake::hello(&challenge))
        .await
        .map_err(ConnectionError::Write)?;
    let mut answer = [0u8; wire::handshake::CLIENT];
    s.read_exact(&mut answer)
        .await
        .map_err(ConnectionError::NoHandshake)?;
    let (node, reply) = wire::handshake::accept(&svc.key, &challenge, &answer, svc.node_id)?;
    s.write_all(&reply).await.map_err(ConnectionError::Write)?;
    let (out, inn) = wire::handshake::seals(
        &svc.key,
        &challenge,
        &wire::handshake::client_nonce(&answer),
        true,
    );
    Ok((node, out, inn))
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
/// (`dispatch` or a connection's [`super::lane`]).
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
                *firstseen_store::lock::lock(&svc.incoming) = Some(r.meta.snapshot_id.clone());
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
    use crate::telemetry::refusal_kind;

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

    #[test]
    fn refusals_of_one_kind_share_a_kind_whatever_the_node_or_numbers() {
        assert_eq!(
            refusal_kind("node 9: garbled frame: bad tag 7"),
            refusal_kind("node 31: garbled frame: short read")
        );
        assert_eq!(
            refusal_kind("node 2: frame of 4294967295 bytes exceeds the limit of 67108864 bytes"),
            refusal_kind("node 5: frame of 99 bytes exceeds the limit of 8 bytes")
        );
        assert_ne!(
            refusal_kind("node 9: garbled frame: x"),
            refusal_kind("TLS handshake failed: unknown CA")
        );
        assert_eq!(
            refusal_kind("no handshake from peer: eof"),
            "no handshake from peer"
        );
    }
}
