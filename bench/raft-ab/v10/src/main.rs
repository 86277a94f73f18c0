//! openraft 0.10 side of the replication A/B: the same three nodes, links,
//! fsync'd log, counting state machine and load as the 0.9 binary, with the
//! network written against `RaftNetworkV2`.
//!
//! By default `stream_append` is pipelined: each request taken off openraft's
//! input stream goes over the link at once, without waiting for earlier
//! responses; the follower feeds the requests, in arrival order, to
//! `Raft::stream_append` (the server API openraft documents for the stream),
//! and the responses come back in request order over the return link.
//! `--sequential` keeps openraft's default `stream_append`, which sends one
//! request and waits for its response before the next, through the unary
//! `append_entries` that the follower serves with `Raft::append_entries`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::future::Future;
use std::io;
use std::ops::RangeBounds;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use clap::Parser;
use futures_util::{Stream, StreamExt};
use openraft::alias::{EntryOf, LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf, VoteOf};
use openraft::async_runtime::watch::WatchReceiver;
use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{
    Fatal, NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError,
};
use openraft::network::{RPCOption, RaftNetworkFactory, stream_append_sequential};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, VoteRequest,
    VoteResponse,
};
use openraft::storage::{EntryResponder, IOFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    AnyError, BasicNode, Config, EntryPayload, LogState, RaftLogReader, RaftNetworkV2,
    RaftSnapshotBuilder, SnapshotPolicy, StoredMembership,
};
use raft_ab_common::{
    AbandonGuard, AppendCounters, Args, Link, LogFile, Mark, Report, encode_entry, node_dir,
    note_leader, run_load, timing, trace_append, write_synced,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// The application's request: opaque payload bytes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Req(pub Vec<u8>);

// 0.10 requires application data to be Display (for its log lines).
impl std::fmt::Display for Req {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Req({} bytes)", self.0.len())
    }
}

openraft::declare_raft_types!(
    pub TC:
        D = Req,
        R = u64,
        NodeId = u64,
        Node = BasicNode,
);

type NodeId = u64;
type Entry = EntryOf<TC>;
type LogId = LogIdOf<TC>;
type Vote = VoteOf<TC>;
type Raft = openraft::Raft<TC, StateMachine>;
type SnapshotData = Vec<u8>;

// ---------------------------------------------------------------- log store

#[derive(Default)]
struct LogInner {
    entries: BTreeMap<u64, Entry>,
    last_purged: Option<LogId>,
    vote: Option<Vote>,
    committed: Option<LogId>,
}

/// Entries in memory, every append also written to the node's log file and
/// synced before openraft hears it is flushed.
#[derive(Clone)]
struct LogStore {
    inner: Arc<Mutex<LogInner>>,
    file: LogFile,
    vote_path: PathBuf,
}

impl LogStore {
    fn new(dir: &std::path::Path) -> io::Result<Self> {
        Ok(LogStore {
            inner: Arc::default(),
            file: LogFile::create(&dir.join("log"))?,
            vote_path: dir.join("vote"),
        })
    }
}

impl RaftLogReader<TC> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let g = self.inner.lock().unwrap();
        Ok(g.entries.range(range).map(|(_, e)| e.clone()).collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.inner.lock().unwrap().vote)
    }
}

impl RaftLogStorage<TC> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TC>, io::Error> {
        let g = self.inner.lock().unwrap();
        let last = g.entries.values().next_back().map(|e| e.log_id);
        Ok(LogState {
            last_purged_log_id: g.last_purged,
            last_log_id: last.or(g.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let bytes = serde_json::to_vec(vote).expect("vote serialises");
        write_synced(&self.vote_path, bytes).await?;
        self.inner.lock().unwrap().vote = Some(*vote);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        self.inner.lock().unwrap().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.inner.lock().unwrap().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TC>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut bytes = Vec::new();
        {
            let mut g = self.inner.lock().unwrap();
            for e in entries {
                let payload: &[u8] = match &e.payload {
                    EntryPayload::Normal(r) => &r.0,
                    _ => &[],
                };
                encode_entry(&mut bytes, e.log_id.index, e.log_id.leader_id.term, payload);
                g.entries.insert(e.log_id.index, e);
            }
        }
        self.file.append(bytes, move |r| callback.io_completed(r));
        Ok(())
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> Result<(), io::Error> {
        let mut g = self.inner.lock().unwrap();
        let keep_below = last.map_or(0, |l| l.index + 1);
        g.entries.split_off(&keep_below);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let mut g = self.inner.lock().unwrap();
        g.entries = g.entries.split_off(&(log_id.index + 1));
        g.last_purged = Some(log_id);
        Ok(())
    }
}

// ------------------------------------------------------------ state machine

#[derive(Clone, Default, Serialize, Deserialize)]
struct SmData {
    last_applied: Option<LogId>,
    membership: StoredMembershipOf<TC>,
    applied: u64,
}

type StoredSnapshot = (SnapshotMetaOf<TC>, SnapshotData);

/// Applies by counting; a write's response is its entry's index.
#[derive(Clone, Default)]
struct StateMachine {
    data: Arc<Mutex<SmData>>,
    snapshot: Arc<Mutex<Option<StoredSnapshot>>>,
}

impl RaftSnapshotBuilder<TC> for StateMachine {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<TC, SnapshotData>, io::Error> {
        let d = self.data.lock().unwrap().clone();
        let bytes = serde_json::to_vec(&d).expect("state serialises");
        let meta = SnapshotMetaOf::<TC> {
            last_log_id: d.last_applied,
            last_membership: d.membership.clone(),
        };
        *self.snapshot.lock().unwrap() = Some((meta.clone(), bytes.clone()));
        Ok(SnapshotOf::<TC, SnapshotData> {
            meta,
            snapshot: bytes,
        })
    }
}

impl RaftStateMachine<TC> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembershipOf<TC>), io::Error> {
        let d = self.data.lock().unwrap();
        Ok((d.last_applied, d.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TC>, io::Error>> + Unpin + Send,
    {
        while let Some(item) = entries.next().await {
            let (e, responder) = item?;
            let index = e.log_id.index;
            {
                let mut d = self.data.lock().unwrap();
                d.last_applied = Some(e.log_id);
                match e.payload {
                    EntryPayload::Blank => {}
                    EntryPayload::Normal(_) => d.applied += 1,
                    EntryPayload::Membership(m) => {
                        d.membership = StoredMembership::new(Some(e.log_id), m)
                    }
                }
            }
            if let Some(r) = responder {
                r.send(index);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TC>,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let d: SmData = serde_json::from_slice(&snapshot)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        *self.data.lock().unwrap() = d;
        *self.snapshot.lock().unwrap() = Some((meta.clone(), snapshot));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TC, SnapshotData>>, io::Error> {
        Ok(self
            .snapshot
            .lock()
            .unwrap()
            .clone()
            .map(|(meta, snapshot)| SnapshotOf::<TC, SnapshotData> { meta, snapshot }))
    }
}

// ------------------------------------------------------------------ network

type AppendResult = Result<AppendEntriesResponse<TC>, RaftError<TC>>;
type AppendJob = (AppendEntriesRequest<TC>, oneshot::Sender<AppendResult>);
type StreamItem = Result<StreamAppendResult<TC>, Fatal<TC>>;

/// All nodes' links and endpoints. Each directed pair (a, b) has a link and,
/// on b, a server task that handles a's unary appends one after another.
struct Router {
    links: HashMap<(NodeId, NodeId), Link>,
    append_tx: HashMap<(NodeId, NodeId), mpsc::UnboundedSender<AppendJob>>,
    rafts: OnceLock<HashMap<NodeId, Raft>>,
    counters: HashMap<NodeId, Arc<AppendCounters>>,
    sequential: bool,
}

impl Router {
    fn raft(&self, id: NodeId) -> Raft {
        self.rafts.get().expect("rafts registered")[&id].clone()
    }

    fn link(&self, from: NodeId, to: NodeId) -> &Link {
        &self.links[&(from, to)]
    }
}

struct NetFactory {
    from: NodeId,
    router: Arc<Router>,
}

impl RaftNetworkFactory<TC> for NetFactory {
    type Network = Net;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Net {
        Net {
            from: self.from,
            to: target,
            router: self.router.clone(),
        }
    }
}

struct Net {
    from: NodeId,
    to: NodeId,
    router: Arc<Router>,
}

fn net_err(msg: &str) -> NetworkError<TC> {
    NetworkError::new(&AnyError::error(msg))
}

impl Net {
    /// Sends a request that b handles on its own task (vote, snapshot) and
    /// awaits the response over the link back.
    async fn unary<Q, S, F, Fut>(&self, req: Q, handle: F) -> Result<S, NetworkError<TC>>
    where
        Q: Send + 'static,
        S: Send + 'static,
        F: FnOnce(Raft, Q) -> Fut + Send + 'static,
        Fut: Future<Output = Result<S, String>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let router = self.router.clone();
        let (from, to) = (self.from, self.to);
        self.router.link(from, to).send(move || {
            tokio::spawn(async move {
                let res = handle(router.raft(to), req).await;
                router.link(to, from).send(move || {
                    let _ = tx.send(res);
                });
            });
        });
        match rx.await {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(net_err(&e)),
            Err(_) => Err(net_err("link closed")),
        }
    }
}

/// Aborts the tasks of a pipelined stream when openraft drops the stream.
struct AbortOnDrop(Vec<JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

impl RaftNetworkV2<TC> for Net {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TC>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TC>, RPCError<TC>> {
        let counters = self.router.counters[&self.from].clone();
        let n_entries = rpc.entries.len();
        counters.record(n_entries);
        let guard = AbandonGuard::new(counters);
        let (tx, rx) = oneshot::channel();
        let server = self.router.append_tx[&(self.from, self.to)].clone();
        self.router.link(self.from, self.to).send(move || {
            let _ = server.send((rpc, tx));
        });
        let sent = std::time::Instant::now();
        let res = rx.await;
        guard.answered();
        trace_append(self.to, n_entries, sent, Some(sent.elapsed()));
        match res {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(RPCError::Network(net_err(&e.to_string()))),
            Err(_) => Err(RPCError::Network(net_err("link closed"))),
        }
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<BoxStream<'s, Result<StreamAppendResult<TC>, RPCError<TC>>>, RPCError<TC>>,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TC>> + Send + Unpin + 'static,
    {
        if self.router.sequential {
            return stream_append_sequential(self, input, option);
        }
        let router = self.router.clone();
        let (from, to) = (self.from, self.to);
        Box::pin(async move {
            let (req_tx, req_rx) = mpsc::unbounded_channel::<(u64, AppendEntriesRequest<TC>)>();
            let (resp_tx, resp_rx) = mpsc::unbounded_channel::<(u64, StreamItem)>();
            // The follower's end of the stream is open at once, as on an
            // established bidirectional stream.
            let server = tokio::spawn(serve_stream(router.clone(), from, to, req_rx, resp_tx));
            let sender = {
                let router = router.clone();
                let mut input = input;
                tokio::spawn(async move {
                    let mut seq = 0u64;
                    while let Some(req) = input.next().await {
                        router.counters[&from].record(req.entries.len());
                        trace_append(to, req.entries.len(), std::time::Instant::now(), None);
                        let tx = req_tx.clone();
                        router.link(from, to).send(move || {
                            let _ = tx.send((seq, req));
                        });
                        seq += 1;
                    }
                })
            };
            let guard = AbortOnDrop(vec![server, sender]);
            let out = futures_util::stream::unfold(
                (resp_rx, 0u64, guard),
                |(mut rx, expect, guard)| async move {
                    let (seq, res) = rx.recv().await?;
                    let item = if seq != expect {
                        Err(RPCError::Network(net_err("append response out of order")))
                    } else {
                        res.map_err(|fatal| RPCError::Network(net_err(&fatal.to_string())))
                    };
                    Some((item, (rx, expect + 1, guard)))
                },
            );
            let out: BoxStream<'s, Result<StreamAppendResult<TC>, RPCError<TC>>> = Box::pin(out);
            Ok(out)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TC>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TC>, RPCError<TC>> {
        self.unary(rpc, |raft, rpc| async move {
            raft.vote(rpc).await.map_err(|e| e.to_string())
        })
        .await
        .map_err(RPCError::Network)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: SnapshotOf<TC, SnapshotData>,
        _cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TC>, StreamingError<TC>> {
        self.unary((vote, snapshot), |raft, (vote, snapshot)| async move {
            raft.install_full_snapshot(vote, snapshot)
                .await
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(StreamingError::Network)
    }
}

/// b's server for a's unary appends: one after another, in arrival order.
async fn serve_appends(
    router: Arc<Router>,
    from: NodeId,
    to: NodeId,
    mut rx: mpsc::UnboundedReceiver<AppendJob>,
) {
    let raft = router.raft(to);
    while let Some((req, tx)) = rx.recv().await {
        let res = raft.append_entries(req).await;
        router.link(to, from).send(move || {
            let _ = tx.send(res);
        });
    }
}

/// b's end of one pipelined stream from a: requests go to
/// `Raft::stream_append` in arrival order; each response goes back over the
/// link tagged with its request's sequence number.
async fn serve_stream(
    router: Arc<Router>,
    from: NodeId,
    to: NodeId,
    req_rx: mpsc::UnboundedReceiver<(u64, AppendEntriesRequest<TC>)>,
    resp_tx: mpsc::UnboundedSender<(u64, StreamItem)>,
) {
    let raft = router.raft(to);
    let (seq_tx, mut seq_rx) = mpsc::unbounded_channel::<u64>();
    let input = futures_util::stream::unfold((req_rx, seq_tx), |(mut rx, seq_tx)| async move {
        let (seq, req) = rx.recv().await?;
        let _ = seq_tx.send(seq);
        Some((req, (rx, seq_tx)))
    });
    let mut out = Box::pin(raft.stream_append(input));
    while let Some(res) = out.next().await {
        // Raft::stream_append answers in input order, so the n-th answer
        // belongs to the n-th request handed to it.
        let Some(seq) = seq_rx.recv().await else {
            return;
        };
        let stop = !matches!(res, Ok(Ok(_)));
        let tx = resp_tx.clone();
        router.link(to, from).send(move || {
            let _ = tx.send((seq, res));
        });
        if stop {
            return;
        }
    }
}

// --------------------------------------------------------------------- main

/// Prints the first few write errors to stderr (stdout is the one JSON line).
fn report_error(e: &dyn std::fmt::Display) {
    static SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    if SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 5 {
        eprintln!("client_write failed: {e}");
    }
}

const IDS: [NodeId; 3] = [1, 2, 3];

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(args));
    // Links and Raft tasks would otherwise keep the runtime busy on drop.
    rt.shutdown_timeout(Duration::from_secs(1));
}

async fn run(args: Args) {
    let t = timing(args.delay_ms);
    let config = Arc::new(
        Config {
            cluster_name: "raft-ab".into(),
            heartbeat_interval: t.heartbeat_ms,
            election_timeout_min: t.election_min_ms,
            election_timeout_max: t.election_max_ms,
            // No snapshot is taken during a run, in either version.
            snapshot_policy: SnapshotPolicy::Never,
            ..Default::default()
        }
        .validate()
        .expect("config"),
    );

    let mut links = HashMap::new();
    let mut append_tx = HashMap::new();
    let mut append_rx = Vec::new();
    for a in IDS {
        for b in IDS {
            if a != b {
                links.insert((a, b), Link::new(args.delay()));
                let (tx, rx) = mpsc::unbounded_channel();
                append_tx.insert((a, b), tx);
                append_rx.push((a, b, rx));
            }
        }
    }
    let router = Arc::new(Router {
        links,
        append_tx,
        rafts: OnceLock::new(),
        counters: IDS.iter().map(|&i| (i, Arc::default())).collect(),
        sequential: args.sequential,
    });

    let mut dirs = Vec::new();
    let mut rafts = HashMap::new();
    let mut files = HashMap::new();
    for id in IDS {
        let dir = node_dir(id).expect("temp dir");
        let log = LogStore::new(dir.path()).expect("log file");
        files.insert(id, log.file.clone());
        let net = NetFactory {
            from: id,
            router: router.clone(),
        };
        let raft = Raft::new(id, config.clone(), net, log, StateMachine::default())
            .await
            .expect("raft");
        rafts.insert(id, raft);
        dirs.push(dir);
    }
    if router.rafts.set(rafts.clone()).is_err() {
        unreachable!("rafts registered once");
    }
    for (a, b, rx) in append_rx {
        tokio::spawn(serve_appends(router.clone(), a, b, rx));
    }

    for (&id, r) in &rafts {
        let mut rx = r.metrics();
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let now = {
                    let m = rx.borrow_watched();
                    (m.current_term, m.current_leader)
                };
                if last != Some(now) {
                    note_leader(id, now.0, now.1);
                    last = Some(now);
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    let members: BTreeMap<NodeId, BasicNode> =
        IDS.iter().map(|&i| (i, BasicNode::default())).collect();
    rafts[&1].initialize(members).await.expect("initialize");
    let m = rafts[&1]
        .wait(Some(Duration::from_secs(30)))
        .metrics(|m| m.current_leader.is_some(), "a leader")
        .await
        .expect("leader elected");
    let leader_id = m.current_leader.expect("leader");
    let leader = rafts[&leader_id].clone();
    let counters = router.counters[&leader_id].clone();
    let file = files[&leader_id].clone();

    let term = || leader.metrics().borrow_watched().current_term;
    let mut at_start = (counters.get(), file.syncs(), term());
    let mut at_end = at_start;
    let mut max_fsync_ms = 0.0;
    let load = run_load(
        &args,
        |_, payload| {
            let leader = leader.clone();
            async move {
                match leader.client_write(Req(payload)).await {
                    Ok(_) => true,
                    Err(e) => {
                        report_error(&e);
                        false
                    }
                }
            }
        },
        |mark| match mark {
            Mark::WindowStart => {
                for f in files.values() {
                    f.take_max_sync_ms();
                }
                at_start = (counters.get(), file.syncs(), term())
            }
            Mark::WindowEnd => {
                at_end = (counters.get(), file.syncs(), term());
                max_fsync_ms = files
                    .values()
                    .map(|f| f.take_max_sync_ms())
                    .fold(0.0, f64::max);
            }
        },
    )
    .await;

    Report::new(
        "0.10.0-alpha.37",
        &args,
        load,
        at_end.0.since(at_start.0),
        at_end.1 - at_start.1,
        at_end.2 - at_start.2,
        max_fsync_ms,
    )
    .print();

    for r in rafts.values() {
        let _ = tokio::time::timeout(Duration::from_secs(5), r.shutdown()).await;
    }
    drop(dirs);
}
