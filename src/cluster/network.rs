//! openraft's network: Raft's RPCs (appends, snapshots, votes) over the
//! peer links of [`super::peers`], with the time each may take and the
//! mapping of link failures to what openraft backs off on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

// tokio's clock, not std's: the whole-cluster simulation runs on a paused
// clock, and "answered within half a heartbeat" must be read on it.
use tokio::time::Instant;

use firstseen_raft::{AppendClock, Member, NodeId, TypeConfig};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use openraft::error::{NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::errors::decompose::DecomposeResult;
use openraft::errors::{ReplicationClosed, StreamingError};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::Backoff;
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::SnapshotResponse;
use openraft::raft::StreamAppendResult;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use openraft_legacy::network_v1::{
    InstallSnapshotError, InstallSnapshotRequest, InstallSnapshotResponse, RaftNetwork,
};

use super::peers::{Call, CallError};
use super::wire::{Reply, Request};

/// openraft's network: Raft's RPCs over a [`Call`].
#[derive(Clone)]
pub struct Network {
    pub peers: Arc<dyn Call>,
    /// When this node wrote recent entries: the start of the `to_send` leg
    /// (`firstseen_commit_leg_seconds`). Set once the log is open.
    pub appends: Option<AppendClock>,
    /// Whether appends are pipelined (`cluster.pipeline_appends`).
    pub pipeline: Pipelining,
}

/// Whether a leader pipelines its appends: as set, or once the cluster
/// level says every member can take them (`cluster.pipeline_appends`).
#[derive(Clone, Debug, Default)]
pub struct Pipelining {
    pub set: Option<bool>,
    /// The cluster level as this node applied it last; none before the
    /// storage is open.
    pub level: Option<firstseen_store::level::LevelCell>,
}

impl Pipelining {
    /// Read when an append stream starts, so a stream started before the
    /// level rose stays as it began.
    pub fn on(&self) -> bool {
        self.set.unwrap_or_else(|| {
            self.level
                .as_ref()
                .is_some_and(|l| l.get() >= firstseen_store::level::PIPELINED)
        })
    }
}

impl Network {
    pub fn new(peers: Arc<dyn Call>) -> Self {
        Self {
            peers,
            appends: None,
            pipeline: Pipelining::default(),
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> Self::Network {
        PeerNetwork(PeerClient {
            peers: self.peers.clone(),
            target,
            addr: node.addr.clone(),
            appends: self.appends.clone(),
            answered_at: None,
            sent_upto: Arc::default(),
            pipeline: self.pipeline.clone(),
            probes: false,
        })
    }

    /// openraft 0.10 sends its heartbeats, which keep the leader's lease
    /// and confirm its leadership for reads, on a client it keeps for good.
    /// Made by `new_client`, that client sent a heartbeat within half a
    /// heartbeat of its last answer without waiting for the reply
    /// ([`PeerClient::send_unawaited`]), and openraft counted nothing for
    /// it: a lease or a read's confirmation waited for a later round.
    async fn new_heartbeat_client(&mut self, target: NodeId, node: &Member) -> Self::Network {
        let mut client = self.new_client(target, node).await;
        client.0.probes = true;
        client
    }
}

/// openraft's connection to one peer. openraft keeps one for each
/// replication stream (for as long as the stream lives) and makes a new one
/// for every leadership check.
pub struct PeerClient {
    peers: Arc<dyn Call>,
    target: NodeId,
    addr: String,
    appends: Option<AppendClock>,
    /// When an append this client waited for was last accepted by the peer.
    answered_at: Option<Instant>,
    /// The highest index this client has sent, so that the `to_send` leg
    /// counts each entry's first send only; shared with its pipelined
    /// streams' senders, so that a stream restarted after a conflict does
    /// not count its resends as first sends.
    sent_upto: Arc<AtomicU64>,
    /// Whether appends are pipelined (`cluster.pipeline_appends`).
    pipeline: Pipelining,
    /// Whether this client carries openraft's heartbeats: every one of
    /// them is waited for, since what it proves is the reply.
    probes: bool,
}

/// The shortest time an RPC that writes on the peer (an append with
/// entries, a vote) waits for its reply here. It cannot give an append more
/// than openraft does: openraft's own timer cuts the whole call at one
/// heartbeat interval (follower fsync included), and sends it again from the
/// start. Only a larger `cluster.heartbeat_ms` gives an append more time.
/// Likewise openraft cuts a vote at `election_timeout_min`. The floor only
/// matters where openraft's own budget is longer than what it passes here.
const WRITE_TTL_FLOOR: Duration = Duration::from_millis(500);

/// A failed call as openraft backs off on it.
fn call_error<E: std::error::Error>(e: CallError) -> RPCError<TypeConfig, E> {
    match e {
        CallError::Unreachable { .. }
        | CallError::Handshake { .. }
        | CallError::WrongPeer { .. } => RPCError::Unreachable(Unreachable::new(&e)),
        other => RPCError::Network(NetworkError::new(&other)),
    }
}

/// The peer would not take a write now: openraft backs off as for an
/// unreachable node.
fn refused_error<E: std::error::Error>(addr: &str, reason: String) -> RPCError<TypeConfig, E> {
    let e = CallError::Protocol {
        addr: addr.to_string(),
        reason: format!("refused: {reason}"),
    };
    RPCError::Unreachable(Unreachable::new(&e))
}

fn unexpected_error<E: std::error::Error>(addr: &str) -> RPCError<TypeConfig, E> {
    let e = CallError::Protocol {
        addr: addr.to_string(),
        reason: "reply of the wrong kind".into(),
    };
    RPCError::Network(NetworkError::new(&e))
}

/// Records the `to_send` leg for the entries `first..=last`, each at its
/// first send (`sent_upto` is the highest sent so far).
fn note_first_sends(appends: Option<&AppendClock>, sent_upto: &AtomicU64, first: u64, last: u64) {
    let before = sent_upto.fetch_max(last, Ordering::Relaxed);
    if let Some(appends) = appends {
        let now = Instant::now();
        let h = metrics::histogram!("firstseen_commit_leg_seconds", "leg" => "to_send");
        for index in first.max(before + 1)..=last {
            if let Some(at) = appends.written_at(index) {
                h.record(now.into_std().saturating_duration_since(at).as_secs_f64());
            }
        }
    }
}

impl PeerClient {
    fn map_err<E: std::error::Error>(&self, e: CallError) -> RPCError<TypeConfig, E> {
        call_error(e)
    }

    /// The peer would not take a write now: openraft backs off as for an
    /// unreachable node.
    fn refused<E: std::error::Error>(&self, reason: String) -> RPCError<TypeConfig, E> {
        refused_error(&self.addr, reason)
    }

    /// Whether the peer accepted one of this client's appends within half
    /// of openraft's budget for one (`ttl`, its heartbeat interval).
    fn heard_lately(&self, ttl: Duration) -> bool {
        self.answered_at.is_some_and(|at| at.elapsed() < ttl / 2)
    }

    /// Sends an append without entries and does not wait for its reply.
    ///
    /// openraft 0.9's replication stream has one request in flight per
    /// follower, and after every commit it sends one without entries to
    /// carry the new commit index. The next entry, appended a moment later
    /// (after the commit index is saved and the committed entries are read
    /// for apply), then waits behind it for a whole round trip: between
    /// zones, one more round trip on every commit. A follower that answered
    /// this stream within the last half heartbeat needs no sign of life;
    /// the commit index still reaches it at once, in this request, and in
    /// the next append that carries entries. openraft hears a network error
    /// for the heartbeat, which changes nothing it tracks (a heartbeat
    /// carries no entries to count) and lets the stream send the next entry
    /// at once. Once the follower has not answered for half a heartbeat,
    /// every request is waited for again, so a follower that went quiet is
    /// seen (and a leader's lease is never extended by a reply it did not
    /// get). Leadership checks and openraft 0.10's heartbeats use clients
    /// of their own, which never skip.
    fn send_unawaited(
        &self,
        rpc: AppendEntriesRequest<TypeConfig>,
        ttl: Duration,
    ) -> RPCError<TypeConfig, RaftError<TypeConfig>> {
        metrics::counter!("firstseen_raft_appends_total", "kind" => "unawaited").increment(1);
        let (peers, target, addr) = (self.peers.clone(), self.target, self.addr.clone());
        // On openraft's runtime, so a node the simulation pauses sends
        // nothing while paused.
        <firstseen_raft::runtime::GatedTokio as openraft::AsyncRuntime>::spawn(async move {
            // The reply changes nothing here: a newer term in it is seen
            // again by the next append this stream waits for.
            let _ = peers
                .call(target, &addr, &Request::AppendEntries(rpc), ttl)
                .await;
        });
        let e = CallError::Protocol {
            addr: self.addr.clone(),
            reason: "heartbeat sent without waiting for its reply".into(),
        };
        RPCError::Network(NetworkError::new(&e))
    }

    /// Records the `to_send` leg for the entries `first..=last` this client
    /// sends for the first time.
    fn note_sent(&mut self, first: u64, last: u64) {
        note_first_sends(self.appends.as_ref(), &self.sent_upto, first, last);
    }

    fn unexpected<E: std::error::Error>(&self) -> RPCError<TypeConfig, E> {
        unexpected_error(&self.addr)
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig, RaftError<TypeConfig>>>
    {
        let empty = rpc.entries.is_empty();
        // Pipelined, the stream does not wait behind a commit-only append,
        // so every one is waited for (and a lease counts only replies).
        if empty && !self.probes && !self.pipeline.on() && self.heard_lately(option.hard_ttl()) {
            return Err(self.send_unawaited(rpc, option.hard_ttl()));
        }
        if let (Some(first), Some(last)) = (rpc.entries.first(), rpc.entries.last()) {
            self.note_sent(first.log_id.index, last.log_id.index);
        }
        let ttl = if empty {
            option.hard_ttl()
        } else {
            option.hard_ttl().max(WRITE_TTL_FLOOR)
        };
        let sent = Instant::now();
        let result = match self
            .peers
            .call(self.target, &self.addr, &Request::AppendEntries(rpc), ttl)
            .await
        {
            Ok(Reply::AppendEntries(Ok(r))) => Ok(r),
            Ok(Reply::AppendEntries(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(Reply::Refused(reason)) => Err(self.refused(reason)),
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.map_err(e)),
        };
        if let Ok(AppendEntriesResponse::Success | AppendEntriesResponse::PartialSuccess(_)) =
            &result
        {
            let now = Instant::now();
            self.answered_at = Some(now);
            let leg = if empty { "heartbeat" } else { "append" };
            metrics::histogram!("firstseen_commit_leg_seconds", "leg" => leg)
                .record(now.saturating_duration_since(sent).as_secs_f64());
        }
        let kind = if empty { "empty" } else { "entries" };
        metrics::counter!("firstseen_raft_appends_total", "kind" => kind).increment(1);
        result
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<TypeConfig>,
        RPCError<TypeConfig, RaftError<TypeConfig, InstallSnapshotError>>,
    > {
        match self
            .peers
            .call(
                self.target,
                &self.addr,
                &Request::InstallSnapshot(rpc),
                option.hard_ttl(),
            )
            .await
        {
            Ok(Reply::InstallSnapshot(Ok(r))) => Ok(r),
            Ok(Reply::InstallSnapshot(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(Reply::Refused(reason)) => Err(self.refused(reason)),
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.map_err(e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig, RaftError<TypeConfig>>> {
        let ttl = option.hard_ttl().max(WRITE_TTL_FLOOR);
        match self
            .peers
            .call(self.target, &self.addr, &Request::Vote(rpc.into()), ttl)
            .await
        {
            Ok(Reply::Vote(Ok(r))) => Ok(r),
            Ok(Reply::Vote(Err(e))) => Err(RPCError::RemoteError(RemoteError::new(self.target, e))),
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.map_err(e)),
        }
    }
}

/// openraft 0.10's connection to one peer: appends and votes through the
/// [`PeerClient`], in the calls and bytes the previous release speaks;
/// snapshots in that release's chunks by [`send_snapshot`].
pub struct PeerNetwork(pub PeerClient);

impl RaftNetworkV2<TypeConfig> for PeerNetwork {
    type SnapshotData = tokio::fs::File;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        RaftNetwork::append_entries(&mut self.0, rpc, option)
            .await
            .decompose_infallible()
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        RaftNetwork::vote(&mut self.0, rpc, option)
            .await
            .decompose_infallible()
    }

    async fn full_snapshot(
        &mut self,
        vote: firstseen_raft::Vote,
        snapshot: firstseen_raft::Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        send_snapshot(&mut self.0, vote, snapshot, cancel, option).await
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<
            BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        if !self.0.pipeline.on() {
            return Box::pin(async move { Ok(one_at_a_time(&mut self.0, input, option)) });
        }
        Box::pin(async move { Ok(pipelined(&mut self.0, input, option)) })
    }

    // As openraft 0.9 waited between attempts at an unreachable peer.
    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff::new(std::iter::repeat(Duration::from_millis(500))))
    }
}

/// openraft's appends to one follower, one at a time: each sent once the
/// one before it is answered, as openraft 0.9 sent them (a cluster below
/// [`firstseen_store::level::PIPELINED`], where a member may not keep a
/// connection's appends in order).
///
/// With each request openraft hands it, it asks whether appends are
/// pipelined now; once they are, it ends with a network error instead of
/// sending it. openraft then starts the follower's replication afresh (a
/// new stream, pipelined, from what the follower acknowledged), as after
/// any network error: a single one costs no backoff. Without the question, a stream begun at start-up
/// (a fresh cluster starts at the base level and raises it a few seconds
/// in) or during a rolling upgrade stayed one at a time until the leader
/// changed, and every entry waited for the reply to the one before: the
/// `to_send` leg's 14 ms at zones 10 ms apart (seventh stop). Ending it
/// cleanly instead, with nothing said, let the replication task go on
/// with a payload the leader no longer had in flight: in the whole-cluster
/// simulation a follower restored from a snapshot was then sent nothing
/// but empty appends below its snapshot, for good.
fn one_at_a_time<'s, S>(
    client: &'s mut PeerClient,
    input: S,
    option: RPCOption,
) -> BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    let out = futures::stream::unfold(Some((client, input)), move |state| {
        let option = option.clone();
        async move {
            let (client, mut input) = state?;
            // Taken first: an input that ended is openraft's own word (a
            // payload done, or replaced), and ends the stream cleanly.
            let req = input.next().await?;
            if client.pipeline.on() {
                // Not sent: the leader's reset of this follower's progress
                // sends it again, pipelined.
                let e = CallError::Protocol {
                    addr: client.addr.clone(),
                    reason: "appends are pipelined from now on; this one-at-a-time stream ends"
                        .into(),
                };
                return Some((Err(RPCError::Network(NetworkError::new(&e))), None));
            }
            let prev = req.prev_log_id;
            let last = req.entries.last().map(|e| e.log_id).or(prev);
            let answer = RaftNetwork::append_entries(client, req, option)
                .await
                .decompose_infallible();
            match answer {
                Ok(r) => {
                    // Part of it only: what follows would leave a gap.
                    let partial =
                        matches!(&r, AppendEntriesResponse::PartialSuccess(m) if *m != last);
                    let r = r.into_stream_result(prev, last);
                    let go_on = r.is_ok() && !partial;
                    Some((Ok(r), go_on.then_some((client, input))))
                }
                Err(e) => Some((Err(e), None)),
            }
        }
    });
    Box::pin(out)
}

/// How many appends a pipelined stream has on their way at most; openraft
/// sends no more than its own window anyway.
const PIPELINE: usize = 64;

/// One append on its way, with what its answer is judged against.
struct Sent {
    reply: BoxFuture<'static, Result<Reply, CallError>>,
    prev: Option<firstseen_raft::LogId>,
    last: Option<firstseen_raft::LogId>,
    empty: bool,
    at: Instant,
}

/// openraft's appends to one follower, each sent as soon as openraft hands
/// it over, on one connection, in order: the follower's lane hands them to
/// its Raft in that order (`cluster::lane`). The answers come back in
/// order; the stream ends at the first refusal or failure, and when the
/// connection changes (a request on a new connection could overtake one
/// still on the old).
fn pipelined<'s, S>(
    client: &'s mut PeerClient,
    mut input: S,
    option: RPCOption,
) -> BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    let (peers, target, addr) = (client.peers.clone(), client.target, client.addr.clone());
    let ttl = option.hard_ttl().max(WRITE_TTL_FLOOR);
    metrics::counter!("firstseen_raft_append_streams_total").increment(1);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Sent, CallError>>(PIPELINE);
    let appends = client.appends.clone();
    let sent_upto = client.sent_upto.clone();
    let sender = {
        let addr = addr.clone();
        async move {
            let mut conn = None;
            loop {
                // Ends as soon as the stream is dropped, not at the next
                // request: openraft holds its replication's stream lock
                // while it waits to hand one over, and the next session
                // needs that lock (and must not race one more append from
                // this stream on the wire).
                let req = tokio::select! {
                    biased;
                    _ = tx.closed() => return,
                    req = input.next() => match req {
                        Some(req) => req,
                        None => return,
                    },
                };
                let (prev, empty) = (req.prev_log_id, req.entries.is_empty());
                let last = req.entries.last().map(|e| e.log_id).or(prev);
                if let (Some(first), Some(l)) = (req.entries.first(), req.entries.last()) {
                    note_first_sends(
                        appends.as_ref(),
                        &sent_upto,
                        first.log_id.index,
                        l.log_id.index,
                    );
                }
                let request = Request::AppendEntries(req);
                let item = match peers.queue(target, &addr, &request, ttl).await {
                    Ok(q) if conn.is_none_or(|c| c == q.conn) => {
                        conn = Some(q.conn);
                        Ok(Sent {
                            reply: q.reply,
                            prev,
                            last,
                            empty,
                            at: Instant::now(),
                        })
                    }
                    Ok(_) => Err(CallError::Lost {
                        addr: addr.clone(),
                        reason: "the connection changed under a pipelined stream".into(),
                    }),
                    Err(e) => Err(e),
                };
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    return;
                }
            }
        }
    };
    // On openraft's runtime, so a node the simulation pauses sends nothing
    // while paused. It ends once the stream is dropped (its receiver).
    <firstseen_raft::runtime::GatedTokio as openraft::AsyncRuntime>::spawn(sender);
    let out = futures::stream::unfold(Some(rx), move |state| {
        let addr = addr.clone();
        async move {
            let mut rx = state?;
            let sent = match rx.recv().await? {
                Ok(sent) => sent,
                Err(e) => return Some((Err(call_error(e)), None)),
            };
            let answer: Result<
                AppendEntriesResponse<TypeConfig>,
                RPCError<TypeConfig, RaftError<TypeConfig>>,
            > = match sent.reply.await {
                Ok(Reply::AppendEntries(Ok(r))) => Ok(r),
                Ok(Reply::AppendEntries(Err(e))) => {
                    Err(RPCError::RemoteError(RemoteError::new(target, e)))
                }
                Ok(Reply::Refused(reason)) => Err(refused_error(&addr, reason)),
                Ok(_) => Err(unexpected_error(&addr)),
                Err(e) => Err(call_error(e)),
            };
            let r = match answer.decompose_infallible() {
                Ok(r) => r,
                Err(e) => return Some((Err(e), None)),
            };
            let kind = if sent.empty { "empty" } else { "entries" };
            metrics::counter!("firstseen_raft_appends_total", "kind" => kind).increment(1);
            let leg = if sent.empty { "heartbeat" } else { "append" };
            metrics::histogram!("firstseen_commit_leg_seconds", "leg" => leg)
                .record(sent.at.elapsed().as_secs_f64());
            // Part of it only: what follows would leave a gap.
            let partial = matches!(&r, AppendEntriesResponse::PartialSuccess(m) if *m != sent.last);
            let r = r.into_stream_result(sent.prev, sent.last);
            let go_on = r.is_ok() && !partial;
            Some((Ok(r), go_on.then_some(rx)))
        }
    });
    Box::pin(out)
}

/// A chunk of a snapshot, when openraft sets no size: what 0.9 sent.
const SNAPSHOT_CHUNK: usize = 3 * 1024 * 1024;

/// Attempts at one chunk before the transfer gives up (openraft starts it
/// again later), with a pause between them: openraft 0.9's rule.
/// openraft-legacy's sender tried again every millisecond without end.
const CHUNK_TRIES: u32 = 5;
const CHUNK_PAUSE: Duration = Duration::from_millis(500);

/// Sends `snapshot` to the peer in openraft 0.9's chunks, named
/// `<last log id>-<blake3 of its data>`: the receiver checks the data it
/// assembled against that hash before installing it (`snapshot_files`),
/// whichever release it runs.
async fn send_snapshot(
    client: &mut PeerClient,
    vote: firstseen_raft::Vote,
    snapshot: firstseen_raft::Snapshot,
    cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
    option: RPCOption,
) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
    use openraft::errors::ErrorSource;
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let storage = |e: std::io::Error| {
        StreamingError::StorageError(openraft::StorageError::read_snapshot(
            None,
            <<TypeConfig as openraft::RaftTypeConfig>::ErrorSource as ErrorSource>::from_error(&e),
        ))
    };
    let mut file = snapshot.snapshot;
    file.seek(std::io::SeekFrom::Start(0))
        .await
        .map_err(storage)?;
    let mut hasher = blake3::Hasher::new();
    let mut end = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).await.map_err(storage)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        end += n as u64;
    }
    let hash = hasher.finalize().to_hex();
    let snapshot_id = match &snapshot.meta.last_log_id {
        Some(l) => format!("{}-{}-{hash}", l.leader_id, l.index),
        None => format!("none-{hash}"),
    };
    let meta = openraft_legacy::network_v1::SnapshotMeta::new(snapshot.meta.clone(), snapshot_id);
    let chunk = option.snapshot_chunk_size().unwrap_or(SNAPSHOT_CHUNK);
    let mut cancel = std::pin::pin!(cancel);
    let mut offset = 0u64;
    loop {
        file.seek(std::io::SeekFrom::Start(offset))
            .await
            .map_err(storage)?;
        let mut data = Vec::with_capacity(chunk);
        while data.len() < chunk {
            let n = (&mut file)
                .take((chunk - data.len()) as u64)
                .read_to_end(&mut data)
                .await
                .map_err(storage)?;
            if n == 0 {
                break;
            }
        }
        let n = data.len() as u64;
        let done = offset + n >= end;
        let mut tries = 0;
        let resp = loop {
            if let Some(closed) = futures::FutureExt::now_or_never(cancel.as_mut()) {
                return Err(StreamingError::Closed(closed));
            }
            let req = InstallSnapshotRequest {
                vote,
                meta: meta.clone(),
                offset,
                data: data.clone(),
                done,
            };
            match RaftNetwork::install_snapshot(client, req, option.clone()).await {
                Ok(resp) => break resp,
                Err(e) => {
                    tries += 1;
                    tracing::warn!(error = %e, offset, tries, "a snapshot chunk was not taken");
                    if tries >= CHUNK_TRIES {
                        return Err(match e {
                            RPCError::Timeout(t) => StreamingError::Timeout(t),
                            RPCError::Unreachable(u) => StreamingError::Unreachable(u),
                            RPCError::Network(n) => StreamingError::Network(n),
                            RPCError::RemoteError(r) => StreamingError::Network(NetworkError::new(
                                &std::io::Error::other(r.to_string()),
                            )),
                        });
                    }
                    tokio::time::sleep(CHUNK_PAUSE).await;
                }
            }
        };
        // A higher vote ends the transfer: openraft sees it and steps down.
        if resp.vote != vote || done {
            return Ok(SnapshotResponse::new(resp.vote));
        }
        offset += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use firstseen_raft::{Entry, Vote};
    use futures::future::BoxFuture;
    use openraft::EntryPayload;
    use std::sync::Mutex;

    /// A peer that accepts every append at once and records how many of
    /// each kind it was sent.
    #[derive(Default)]
    struct Accepting {
        empty: Mutex<usize>,
        with_entries: Mutex<usize>,
    }

    impl Call for Accepting {
        fn call<'a>(
            &'a self,
            _node: NodeId,
            _addr: &'a str,
            request: &'a Request,
            _timeout: Duration,
        ) -> BoxFuture<'a, Result<Reply, CallError>> {
            if let Request::AppendEntries(r) = request {
                let n = if r.entries.is_empty() {
                    &self.empty
                } else {
                    &self.with_entries
                };
                *n.lock().unwrap() += 1;
            }
            Box::pin(async { Ok(Reply::AppendEntries(Ok(AppendEntriesResponse::Success))) })
        }
    }

    fn append(entries: u64) -> AppendEntriesRequest<TypeConfig> {
        let id = |index| firstseen_raft::log_id(1, 1, index);
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: Some(id(1)),
            leader_commit: Some(id(1)),
            entries: (2..2 + entries)
                .map(|i| Entry {
                    log_id: id(i),
                    payload: EntryPayload::Blank,
                })
                .collect(),
        }
    }

    /// A stream a leader opened below the pipelined level sends no request
    /// once the level is applied: it ends with a network error, so that
    /// openraft starts the follower's replication again, pipelined. Before
    /// the eighth stop the second request went one at a time like the
    /// first, and so did every later one until the leader changed.
    #[tokio::test]
    async fn a_leader_s_stream_ends_once_the_pipelined_level_is_applied() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let state = firstseen_store::StateStore::open(&db).unwrap();
        let peer_calls = Arc::new(Accepting::default());
        let mut network = Network::new(peer_calls.clone());
        network.pipeline = Pipelining {
            set: None,
            level: Some(state.level_cell()),
        };
        let mut peer = network.new_client(2, &Member::default()).await;
        let (tx, input) = futures::channel::mpsc::unbounded();
        tx.unbounded_send(append(1)).unwrap();
        let option = RPCOption::new(Duration::from_millis(100));
        let mut answers = peer.stream_append(input, option).await.unwrap();
        assert!(matches!(answers.next().await, Some(Ok(Ok(_)))));
        let level = firstseen_store::level::PIPELINED;
        state
            .apply(Some(&firstseen_store::Command::Level { level }), 1, b"1")
            .unwrap();
        tx.unbounded_send(append(1)).unwrap();
        let ended = answers.next().await;
        assert!(
            matches!(ended, Some(Err(RPCError::Network(_)))),
            "the stream went on one at a time: {ended:?}"
        );
        assert!(answers.next().await.is_none());
        assert_eq!(
            *peer_calls.with_entries.lock().unwrap(),
            1,
            "a request sent after the switch"
        );
    }

    /// The replication stream's empty appends do not hold the next entry a
    /// round trip while the follower answers: sent, not waited for. Once it
    /// has not answered for half a heartbeat, they are waited for again.
    #[tokio::test(start_paused = true)]
    async fn an_empty_append_goes_unawaited_only_while_the_follower_answers() {
        let peer = Arc::new(Accepting::default());
        let mut client = Network::new(peer.clone())
            .new_client(2, &Member::default())
            .await
            .0;
        let heartbeat = RPCOption::new(Duration::from_millis(100));
        // Nothing answered yet: waited for.
        assert!(client
            .append_entries(append(0), heartbeat.clone())
            .await
            .is_ok());
        assert!(client
            .append_entries(append(1), heartbeat.clone())
            .await
            .is_ok());
        // Answered just now: sent without waiting, openraft hears it failed.
        let skipped = client.append_entries(append(0), heartbeat.clone()).await;
        assert!(matches!(skipped, Err(RPCError::Network(_))), "{skipped:?}");
        tokio::task::yield_now().await;
        assert_eq!(
            *peer.empty.lock().unwrap(),
            2,
            "the unawaited one was still sent"
        );
        // Quiet for more than half a heartbeat: waited for again.
        tokio::time::advance(Duration::from_millis(60)).await;
        assert!(client
            .append_entries(append(0), heartbeat.clone())
            .await
            .is_ok());
        // A leadership check's client has heard nothing: it always waits.
        let mut check = Network::new(peer.clone())
            .new_client(2, &Member::default())
            .await
            .0;
        assert!(check
            .append_entries(append(0), heartbeat.clone())
            .await
            .is_ok());
        // openraft 0.10's heartbeat client keeps hearing answers, and still
        // waits for every one: its replies keep the lease.
        let mut beats = Network::new(peer.clone())
            .new_heartbeat_client(2, &Member::default())
            .await
            .0;
        for _ in 0..3 {
            assert!(beats
                .append_entries(append(0), heartbeat.clone())
                .await
                .is_ok());
        }
        assert_eq!(*peer.with_entries.lock().unwrap(), 1);
    }
}
