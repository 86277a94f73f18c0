//! openraft 0.9 side of the replication A/B: three nodes in one process over
//! delayed in-process links, an fsync'd log, a counting state machine, and
//! many client writes in flight on the leader. openraft 0.9 keeps one
//! AppendEntries in flight per follower; `append_entries` here simply sends
//! the request over the link and awaits the response.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::io::{self, Cursor};
use std::ops::RangeBounds;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use clap::Parser;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, Config, Entry, EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder,
    SnapshotMeta, SnapshotPolicy, StorageError, StorageIOError, StoredMembership, Vote,
};
use raft_ab_common::{
    encode_entry, node_dir, note_leader, run_load, timing, trace_append, write_synced,
    AbandonGuard, AppendCounters, Args, Link, LogFile, Mark, Report,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

/// The application's request: opaque payload bytes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Req(pub Vec<u8>);

openraft::declare_raft_types!(
    pub TC:
        D = Req,
        R = u64,
        NodeId = u64,
        Node = BasicNode,
        Entry = Entry<TC>,
        SnapshotData = Cursor<Vec<u8>>,
);

type Raft = openraft::Raft<TC>;
type NodeId = u64;

fn io_err(e: io::Error) -> StorageError<NodeId> {
    StorageError::IO {
        source: StorageIOError::write(&e),
    }
}

// ---------------------------------------------------------------- log store

#[derive(Default)]
struct LogInner {
    entries: BTreeMap<u64, Entry<TC>>,
    last_purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
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
    ) -> Result<Vec<Entry<TC>>, StorageError<NodeId>> {
        let g = self.inner.lock().unwrap();
        Ok(g.entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TC> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TC>, StorageError<NodeId>> {
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

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        let bytes = serde_json::to_vec(vote).expect("vote serialises");
        write_synced(&self.vote_path, bytes).await.map_err(io_err)?;
        self.inner.lock().unwrap().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.inner.lock().unwrap().vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        self.inner.lock().unwrap().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.inner.lock().unwrap().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TC>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TC>> + Send,
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
        self.file
            .append(bytes, move |r| callback.log_io_completed(r));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut g = self.inner.lock().unwrap();
        g.entries.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut g = self.inner.lock().unwrap();
        g.entries = g.entries.split_off(&(log_id.index + 1));
        g.last_purged = Some(log_id);
        Ok(())
    }
}

// ------------------------------------------------------------ state machine

#[derive(Clone, Default, Serialize, Deserialize)]
struct SmData {
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    applied: u64,
}

type StoredSnapshot = (SnapshotMeta<NodeId, BasicNode>, Vec<u8>);

/// Applies by counting; a write's response is its entry's index.
#[derive(Clone, Default)]
struct StateMachine {
    data: Arc<Mutex<SmData>>,
    snapshot: Arc<Mutex<Option<StoredSnapshot>>>,
}

impl RaftSnapshotBuilder<TC> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TC>, StorageError<NodeId>> {
        let d = self.data.lock().unwrap().clone();
        let bytes = serde_json::to_vec(&d).expect("state serialises");
        let meta = SnapshotMeta {
            last_log_id: d.last_applied,
            last_membership: d.membership.clone(),
            snapshot_id: format!("{:?}", d.last_applied.map(|l| l.index)),
        };
        *self.snapshot.lock().unwrap() = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TC> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>>
    {
        let d = self.data.lock().unwrap();
        Ok((d.last_applied, d.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<u64>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TC>> + Send,
        I::IntoIter: Send,
    {
        let mut d = self.data.lock().unwrap();
        let mut out = Vec::new();
        for e in entries {
            d.last_applied = Some(e.log_id);
            match e.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(_) => d.applied += 1,
                EntryPayload::Membership(m) => {
                    d.membership = StoredMembership::new(Some(e.log_id), m)
                }
            }
            out.push(e.log_id.index);
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let bytes = snapshot.into_inner();
        let d: SmData = serde_json::from_slice(&bytes)
            .map_err(|e| io_err(io::Error::new(io::ErrorKind::InvalidData, e)))?;
        *self.data.lock().unwrap() = d;
        *self.snapshot.lock().unwrap() = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TC>>, StorageError<NodeId>> {
        Ok(self
            .snapshot
            .lock()
            .unwrap()
            .clone()
            .map(|(meta, bytes)| Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(bytes)),
            }))
    }
}

// ------------------------------------------------------------------ network

type AppendResult = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>;
type AppendJob = (AppendEntriesRequest<TC>, oneshot::Sender<AppendResult>);

/// All nodes' links and endpoints. Each directed pair (a, b) has a link and,
/// on b, a server task that handles a's appends one after another.
struct Router {
    links: HashMap<(NodeId, NodeId), Link>,
    append_tx: HashMap<(NodeId, NodeId), mpsc::UnboundedSender<AppendJob>>,
    rafts: OnceLock<HashMap<NodeId, Raft>>,
    counters: HashMap<NodeId, Arc<AppendCounters>>,
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

fn closed<E: std::error::Error>() -> RPCError<NodeId, BasicNode, E> {
    RPCError::Network(NetworkError::new(&AnyError::error("link closed")))
}

impl Net {
    /// Sends a request that b handles on its own task (vote, snapshot) and
    /// awaits the response over the link back.
    async fn unary<Q, S, E, F, Fut>(
        &self,
        req: Q,
        handle: F,
    ) -> Result<S, RPCError<NodeId, BasicNode, E>>
    where
        Q: Send + 'static,
        S: Send + 'static,
        E: std::error::Error + Send + 'static,
        F: FnOnce(Raft, Q) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<S, E>> + Send + 'static,
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
            Ok(Err(e)) => Err(RPCError::RemoteError(RemoteError::new(to, e))),
            Err(_) => Err(closed()),
        }
    }
}

impl RaftNetwork<TC> for Net {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TC>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
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
            Ok(Err(e)) => Err(RPCError::RemoteError(RemoteError::new(self.to, e))),
            Err(_) => Err(closed()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TC>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.unary(
            rpc,
            |raft, rpc| async move { raft.install_snapshot(rpc).await },
        )
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.unary(rpc, |raft, rpc| async move { raft.vote(rpc).await })
            .await
    }
}

/// b's server for a's appends: strictly one after another, in arrival order.
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
    if args.sequential {
        eprintln!("--sequential is a 0.10 option: 0.9 always sends one append at a time");
        std::process::exit(2);
    }
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
                    let m = rx.borrow();
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

    let term = || leader.metrics().borrow().current_term;
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
        "0.9.25",
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
