//! The parts of the openraft 0.9 / 0.10 replication A/B that must be the
//! same in both binaries so that only the library differs: the command line,
//! the delayed in-process link, the fsync'd log file, the load generator and
//! the figures it prints. Nothing here knows openraft.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use serde::Serialize;
use tokio::sync::mpsc;

/// The command line, the same for both binaries.
#[derive(Parser, Debug, Clone)]
pub struct Args {
    /// One-way delay of every link, in milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub delay_ms: f64,
    /// Client writes per second, evenly spaced.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Length of the measured window, in seconds.
    #[arg(long, default_value_t = 20)]
    pub secs: u64,
    /// Bytes of application payload per entry.
    #[arg(long, default_value_t = 2000)]
    pub entry_bytes: usize,
    /// Seconds of load before the measured window (not recorded).
    #[arg(long, default_value_t = 5)]
    pub warmup_secs: u64,
    /// 0.10 only: use openraft's default (one-at-a-time) `stream_append`
    /// instead of the pipelined one. Refused by the 0.9 binary.
    #[arg(long, default_value_t = false)]
    pub sequential: bool,
}

impl Args {
    pub fn delay(&self) -> Duration {
        Duration::from_secs_f64(self.delay_ms.max(0.0) / 1000.0)
    }
}

/// Raft timing, identical in both versions: heartbeat 100 ms, election
/// timeout 400..800 ms, scaled up when the round trip is long enough that
/// 400 ms would be less than ten round trips.
pub struct Timing {
    pub heartbeat_ms: u64,
    pub election_min_ms: u64,
    pub election_max_ms: u64,
}

pub fn timing(delay_ms: f64) -> Timing {
    let rtt = 2.0 * delay_ms.max(0.0);
    let min = 400u64.max((10.0 * rtt).ceil() as u64);
    Timing {
        heartbeat_ms: 100u64.max(min / 4),
        election_min_ms: min,
        election_max_ms: 2 * min,
    }
}

/// Waits until `deadline` precisely: the timer wheel (1 ms granularity)
/// until about a millisecond before, then yields until the instant passes.
pub async fn wait_until(deadline: Instant) {
    if let Some(early) = deadline.checked_sub(Duration::from_millis(1)) {
        if Instant::now() < early {
            tokio::time::sleep_until(tokio::time::Instant::from_std(early)).await;
        }
    }
    while Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
}

type Delivery = Box<dyn FnOnce() + Send>;

/// One directed link a->b: FIFO, each message delivered `delay` after it was
/// sent. A message is a closure that hands the (cloned, never serialised)
/// value to the receiver when run.
#[derive(Clone)]
pub struct Link {
    tx: mpsc::UnboundedSender<(Instant, Delivery)>,
    delay: Duration,
}

impl Link {
    /// Starts the link's task on the current runtime.
    pub fn new(delay: Duration) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Delivery)>();
        tokio::spawn(async move {
            // Deliveries never overtake each other: a message sent a hair
            // later by another task but queued first only waits longer.
            while let Some((at, deliver)) = rx.recv().await {
                if !delay.is_zero() {
                    wait_until(at).await;
                }
                deliver();
            }
        });
        Link { tx, delay }
    }

    /// Sends: `deliver` runs on the link's task once the delay has passed.
    pub fn send(&self, deliver: impl FnOnce() + Send + 'static) {
        let at = Instant::now() + self.delay;
        // The link only stops with the runtime; a send then is moot.
        let _ = self.tx.send((at, Box::new(deliver)));
    }
}

/// AppendEntries counted where the leader sends them (into a link).
#[derive(Default)]
pub struct AppendCounters {
    with_entries: AtomicU64,
    empty: AtomicU64,
    entries: AtomicU64,
    abandoned: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct AppendCounts {
    pub with_entries: u64,
    pub empty: u64,
    pub entries: u64,
    /// Requests whose caller gave up before the response came back (0.9
    /// times an append out after `heartbeat_interval`).
    pub abandoned: u64,
}

impl AppendCounters {
    pub fn record(&self, entries: usize) {
        if entries == 0 {
            self.empty.fetch_add(1, Ordering::Relaxed);
        } else {
            self.with_entries.fetch_add(1, Ordering::Relaxed);
            self.entries.fetch_add(entries as u64, Ordering::Relaxed);
        }
    }

    pub fn abandoned(&self) {
        self.abandoned.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> AppendCounts {
        AppendCounts {
            with_entries: self.with_entries.load(Ordering::Relaxed),
            empty: self.empty.load(Ordering::Relaxed),
            entries: self.entries.load(Ordering::Relaxed),
            abandoned: self.abandoned.load(Ordering::Relaxed),
        }
    }
}

impl AppendCounts {
    pub fn since(self, earlier: AppendCounts) -> AppendCounts {
        AppendCounts {
            with_entries: self.with_entries - earlier.with_entries,
            empty: self.empty - earlier.empty,
            entries: self.entries - earlier.entries,
            abandoned: self.abandoned - earlier.abandoned,
        }
    }
}

type Done = Box<dyn FnOnce(io::Result<()>) + Send>;

/// A node's append-only log file with group commit: every append is written
/// and then `sync_data`'d on the blocking pool before its `done` runs; one
/// sync covers all appends queued before it started (as the product's log
/// does). Appends are written in the order they were queued.
#[derive(Clone)]
pub struct LogFile {
    inner: Arc<LogFileInner>,
}

struct LogFileInner {
    file: Mutex<File>,
    queue: Mutex<Queue>,
    syncs: AtomicU64,
    /// Longest write + sync so far, in microseconds.
    max_sync_us: AtomicU64,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<(Vec<u8>, Done)>,
    running: bool,
}

impl LogFile {
    pub fn create(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(LogFile {
            inner: Arc::new(LogFileInner {
                file: Mutex::new(file),
                queue: Mutex::new(Queue::default()),
                syncs: AtomicU64::new(0),
                max_sync_us: AtomicU64::new(0),
            }),
        })
    }

    /// Queues `bytes`; `done` runs after they are written and synced.
    pub fn append(&self, bytes: Vec<u8>, done: impl FnOnce(io::Result<()>) + Send + 'static) {
        let start = {
            let mut q = self.inner.queue.lock().unwrap();
            q.waiting.push_back((bytes, Box::new(done)));
            !std::mem::replace(&mut q.running, true)
        };
        if start {
            let inner = self.inner.clone();
            tokio::task::spawn_blocking(move || inner.run());
        }
    }

    pub fn syncs(&self) -> u64 {
        self.inner.syncs.load(Ordering::Relaxed)
    }

    /// The longest write + sync since the last call, in milliseconds.
    pub fn take_max_sync_ms(&self) -> f64 {
        self.inner.max_sync_us.swap(0, Ordering::Relaxed) as f64 / 1000.0
    }
}

impl LogFileInner {
    fn run(&self) {
        loop {
            let batch = {
                let mut q = self.queue.lock().unwrap();
                if q.waiting.is_empty() {
                    q.running = false;
                    return;
                }
                std::mem::take(&mut q.waiting)
            };
            let started = Instant::now();
            let result = {
                let mut f = self.file.lock().unwrap();
                batch
                    .iter()
                    .try_for_each(|(b, _)| f.write_all(b))
                    .and_then(|_| f.sync_data())
            };
            self.syncs.fetch_add(1, Ordering::Relaxed);
            let took = started.elapsed().as_micros() as u64;
            self.max_sync_us.fetch_max(took, Ordering::Relaxed);
            for (_, done) in batch {
                done(match &result {
                    Ok(()) => Ok(()),
                    Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
                });
            }
        }
    }
}

/// Replaces the file at `path` with `bytes` and syncs it (the vote).
pub async fn write_synced(path: &Path, bytes: Vec<u8>) -> io::Result<()> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut f = File::create(&path)?;
        f.write_all(&bytes)?;
        f.sync_data()
    })
    .await
    .map_err(io::Error::other)?
}

/// Counts a request as abandoned if dropped before `answered` is called.
pub struct AbandonGuard {
    counters: Option<Arc<AppendCounters>>,
}

impl AbandonGuard {
    pub fn new(counters: Arc<AppendCounters>) -> Self {
        AbandonGuard {
            counters: Some(counters),
        }
    }

    pub fn answered(mut self) {
        self.counters = None;
    }
}

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        if let Some(c) = self.counters.take() {
            c.abandoned();
        }
    }
}

/// With RAFT_AB_TRACE set, prints one stderr line per append the leader
/// sends to node 2: when (since the first traced), entries, and the round
/// trip if the caller waited for it. Shows how appends are spaced.
pub fn trace_append(to: u64, entries: usize, sent: Instant, rtt: Option<Duration>) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    if to != 2 || !*ON.get_or_init(|| std::env::var_os("RAFT_AB_TRACE").is_some()) {
        return;
    }
    let t0 = *T0.get_or_init(|| sent);
    eprintln!(
        "append to=2 at_ms={:.3} entries={entries} rtt_ms={}",
        sent.saturating_duration_since(t0).as_secs_f64() * 1000.0,
        rtt.map_or("-".to_string(), |d| format!(
            "{:.3}",
            d.as_secs_f64() * 1000.0
        ))
    );
}

/// Prints to stderr each change of (term, leader) a node sees, with the
/// time since the first call, so a run that lost its leader says when.
pub fn note_leader(node: u64, term: u64, leader: Option<u64>) {
    static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let t0 = *T0.get_or_init(Instant::now);
    eprintln!(
        "node {node} at_ms={:.1} term={term} leader={leader:?}",
        t0.elapsed().as_secs_f64() * 1000.0
    );
}

/// CPU seconds this process has used (user + system), from /proc; 0 where
/// that is not readable. Linux reports it in ticks of 1/100 s.
pub fn cpu_secs() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name, which is in parentheses and may hold spaces.
    let Some(rest) = stat.rsplit(')').next() else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after ')'.
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// Marks the load generator passes, so a caller can snapshot its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    WindowStart,
    WindowEnd,
}

/// What the load generator saw.
pub struct LoadResult {
    /// Call-to-return of the writes called inside the window that succeeded.
    pub latencies_ms: Vec<f64>,
    /// Writes called inside the window.
    pub issued: u64,
    /// Of those, how many failed or had not returned when the drain gave up.
    pub failed: u64,
    pub unfinished: u64,
    /// Writes (called at any time) that returned inside the window, per second.
    pub achieved_rate: f64,
    /// Writes outstanding, sampled every 100 ms through the window.
    pub inflight_samples: Vec<u64>,
    /// CPU the whole process (three nodes, links, load) used in the window,
    /// in cores (CPU seconds per second).
    pub cpu_cores: f64,
}

/// Calls `write` `rate` times a second, evenly spaced, each on its own task
/// without waiting for earlier ones; records the window after the warm-up.
pub async fn run_load<W, Fut>(args: &Args, write: W, mut mark: impl FnMut(Mark)) -> LoadResult
where
    W: Fn(u64, Vec<u8>) -> Fut,
    Fut: Future<Output = bool> + Send + 'static,
{
    let start = Instant::now();
    let win_start = start + Duration::from_secs(args.warmup_secs);
    let win_end = win_start + Duration::from_secs(args.secs);
    let interval = Duration::from_secs_f64(1.0 / args.rate);

    let inflight = Arc::new(AtomicU64::new(0));
    let (tx, mut rx) = mpsc::unbounded_channel::<(u64, Instant, Instant, bool)>();

    let sampler = {
        let inflight = inflight.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(tokio::time::Instant::from_std(win_start)).await;
            let mut samples = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while Instant::now() < win_end {
                tick.tick().await;
                samples.push(inflight.load(Ordering::Relaxed));
            }
            samples
        })
    };

    let mut i: u64 = 0;
    let mut first_in_window: Option<u64> = None;
    let mut cpu_at_start = 0.0;
    loop {
        let due = start + interval.mul_f64(i as f64);
        if due >= win_end {
            break;
        }
        if Instant::now() < due {
            tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
        }
        if first_in_window.is_none() && due >= win_start {
            first_in_window = Some(i);
            cpu_at_start = cpu_secs();
            mark(Mark::WindowStart);
        }
        let payload = vec![(i % 251) as u8; args.entry_bytes];
        let fut = write(i, payload);
        let tx = tx.clone();
        let inflight = inflight.clone();
        inflight.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let t0 = Instant::now();
            let ok = fut.await;
            let t1 = Instant::now();
            inflight.fetch_sub(1, Ordering::Relaxed);
            let _ = tx.send((i, t0, t1, ok));
        });
        i += 1;
    }
    tokio::time::sleep_until(tokio::time::Instant::from_std(win_end)).await;
    let cpu_cores = (cpu_secs() - cpu_at_start) / args.secs as f64;
    mark(Mark::WindowEnd);
    drop(tx);
    let inflight_samples = sampler.await.unwrap_or_default();

    // Let the writes still out finish (a run that fell behind has many).
    let drain_until = Instant::now() + Duration::from_secs(30);
    while inflight.load(Ordering::Relaxed) > 0 && Instant::now() < drain_until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let first = first_in_window.unwrap_or(i);
    let issued = i - first;
    let mut latencies_ms = Vec::new();
    let mut failed = 0;
    let mut returned_in_window = 0u64;
    let mut seen = 0u64;
    while let Ok((n, t0, t1, ok)) = rx.try_recv() {
        if t1 >= win_start && t1 < win_end {
            returned_in_window += 1;
        }
        if n < first {
            continue;
        }
        seen += 1;
        if ok {
            latencies_ms.push(t1.duration_since(t0).as_secs_f64() * 1000.0);
        } else {
            failed += 1;
        }
    }
    LoadResult {
        latencies_ms,
        issued,
        failed,
        unfinished: issued - seen,
        achieved_rate: returned_in_window as f64 / args.secs as f64,
        inflight_samples,
        cpu_cores,
    }
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The one line each run prints.
#[derive(Serialize)]
pub struct Report {
    pub version: String,
    pub sequential: bool,
    pub delay_ms: f64,
    pub rate: f64,
    pub entry_bytes: usize,
    pub writes: usize,
    pub failed: u64,
    pub unfinished: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub achieved_rate: f64,
    pub append_rpcs: AppendCounts,
    pub mean_entries_per_append: f64,
    pub leader_fsyncs: u64,
    pub cpu_cores: f64,
    /// Longest log write + fsync in the window, on any node (disk stalls on
    /// this shared machine show here).
    pub max_fsync_ms: f64,
    /// Terms the leader went through during the window (0: one leader).
    pub term_changes: u64,
    pub inflight_first_quarter: f64,
    pub inflight_last_quarter: f64,
    pub kept_up: bool,
}

fn mean(v: &[u64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<u64>() as f64 / v.len() as f64
    }
}

impl Report {
    /// `appends` and `leader_fsyncs` are the leader's, over the window.
    pub fn new(
        version: &str,
        args: &Args,
        load: LoadResult,
        appends: AppendCounts,
        leader_fsyncs: u64,
        term_changes: u64,
        max_fsync_ms: f64,
    ) -> Report {
        let mut lat = load.latencies_ms;
        lat.sort_by(|a, b| a.total_cmp(b));
        let q = load.inflight_samples.len() / 4;
        let first_q = mean(&load.inflight_samples[..q]);
        let last_q = mean(&load.inflight_samples[load.inflight_samples.len() - q..]);
        // Falling behind shows as a backlog that grows through the window;
        // a steady one is rate x latency. Allow it 50% plus 20 ms of writes
        // of jitter before calling it growing.
        let growing = last_q > 1.5 * first_q + args.rate * 0.020;
        let kept_up = load.achieved_rate >= 0.97 * args.rate
            && !growing
            && load.failed == 0
            && term_changes == 0
            && load.unfinished == 0;
        Report {
            version: version.to_string(),
            sequential: args.sequential,
            delay_ms: args.delay_ms,
            rate: args.rate,
            entry_bytes: args.entry_bytes,
            writes: lat.len(),
            failed: load.failed,
            unfinished: load.unfinished,
            p50_ms: percentile(&lat, 50.0),
            p90_ms: percentile(&lat, 90.0),
            p99_ms: percentile(&lat, 99.0),
            max_ms: lat.last().copied().unwrap_or(f64::NAN),
            achieved_rate: load.achieved_rate,
            append_rpcs: appends,
            mean_entries_per_append: if appends.with_entries == 0 {
                0.0
            } else {
                appends.entries as f64 / appends.with_entries as f64
            },
            leader_fsyncs,
            cpu_cores: load.cpu_cores,
            max_fsync_ms,
            term_changes,
            inflight_first_quarter: first_q,
            inflight_last_quarter: last_q,
            kept_up,
        }
    }

    pub fn print(&self) {
        println!(
            "{}",
            serde_json::to_string(self).expect("report serialises")
        );
    }
}

/// A fresh temporary directory per node.
pub fn node_dir(id: u64) -> io::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("raft-ab-n{id}-"))
        .tempdir()
}

/// Encodes one log entry for the log file: index, term, then the payload.
pub fn encode_entry(out: &mut Vec<u8>, index: u64, term: u64, payload: &[u8]) {
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(&term.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
}
