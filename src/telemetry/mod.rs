//! Telemetry shared by the whole node: the Prometheus recorder, every
//! metric's name and help text (docs/metrics.md lists the same), and a small
//! in-memory log of recent warnings and errors for the status page. The
//! metrics' names and help texts are in [`catalog`].

mod catalog;

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde::Serialize;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

pub use catalog::METRICS;

/// The legs of a message's latency, in the order it passes them. Their
/// sum is a message's time inside firstseen, from the upstream's hand-over
/// to Pulsar's receipt. The metric keeps its published name,
/// `firstseen_stage_seconds` with a `stage` label, which dashboards query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leg {
    /// Upstream hand-over to the start of its batch's proposal: the batch's
    /// linger, and the wait behind the batch before it (one proposal in
    /// flight per node).
    Receive,
    /// Proposal to commit, on the node that received it: the forward to
    /// the leader, its coalescing, the log appends and syncs, the apply.
    Commit,
    /// Applied on the leader to handed to the Pulsar producer: the
    /// publisher's wake-up, its lease check and the outbox read.
    Publish,
    /// Handed to the producer to Pulsar's receipt, observed by the
    /// publisher (so it includes the publisher's own delay in noticing).
    Receipt,
}

impl Leg {
    pub fn label(self) -> &'static str {
        match self {
            Leg::Receive => "receive",
            Leg::Commit => "commit",
            Leg::Publish => "publish",
            Leg::Receipt => "receipt",
        }
    }
}

/// Records `messages` messages that each spent `spent` in `leg`.
pub fn leg(leg: Leg, spent: std::time::Duration, messages: u64) {
    if messages == 0 {
        return;
    }
    let h = metrics::histogram!("firstseen_stage_seconds", "stage" => leg.label());
    let secs = spent.as_secs_f64();
    if messages == 1 {
        h.record(secs);
    } else {
        h.record_many(secs, messages as usize);
    }
}

/// Installs the Prometheus recorder with `node` and `zone` on every series,
/// and registers every metric so each exists from the first scrape.
pub fn install_metrics(node: u64, zone: &str, upstreams: &[String]) -> Option<PrometheusHandle> {
    let seconds = [
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];
    // The legs are each a few milliseconds at the HSL peak: finer buckets
    // there, so that a bench run reads their medians, not just their tails.
    // Between zones they are one or two round trips: 20-60 ms at 10 ms
    // apart, where 30 and 50 alone put every median near 40.
    let legs = [
        0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04,
        0.045, 0.05, 0.06, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];
    let sizes = [1.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0];
    let builder = PrometheusBuilder::new()
        .add_global_label("node", node.to_string())
        .add_global_label("zone", zone.to_string())
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &seconds)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full("firstseen_batch_messages".into()), &sizes)
        })
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full("firstseen_stage_seconds".into()), &legs)
        })
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full("firstseen_commit_leg_seconds".into()), &legs)
        });
    let handle = match builder.and_then(|b| b.install_recorder()) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(error = %e, "metrics recorder not installed");
            return None;
        }
    };
    for (name, kind, help) in METRICS {
        match *kind {
            "counter" => metrics::describe_counter!(*name, *help),
            "gauge" => metrics::describe_gauge!(*name, *help),
            _ => metrics::describe_histogram!(*name, *help),
        }
    }
    for (name, kind, _) in METRICS {
        let per_upstream = matches!(
            *name,
            "firstseen_messages_received_total"
                | "firstseen_oversize_total"
                | "firstseen_upstream_disconnects_total"
                | "firstseen_upstream_connected"
        );
        if per_upstream {
            for u in upstreams {
                match *kind {
                    "counter" => metrics::counter!(*name, "upstream" => u.clone()).increment(0),
                    _ => metrics::gauge!(*name, "upstream" => u.clone()).set(0.0),
                }
            }
        } else if *name == "firstseen_raft_appends_total" {
            for kind in ["entries", "empty", "unawaited"] {
                metrics::counter!(*name, "kind" => kind).increment(0);
            }
        } else if *name == "firstseen_dead_letter_total" {
            for reason in ["oversize", "unrouted"] {
                metrics::counter!(*name, "reason" => reason).increment(0);
            }
        } else if name.starts_with("firstseen_coverage") {
            // Per member; appears once the window holds keys.
        } else {
            match *kind {
                "counter" => metrics::counter!(*name).increment(0),
                "gauge" => metrics::gauge!(*name).set(0.0),
                _ => {}
            }
        }
    }
    Some(handle)
}

/// One warning or error, as the status page shows it.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LoggedEvent {
    pub at_ms: u64,
    pub level: String,
    pub target: String,
    pub message: String,
}

const RECENT: usize = 20;

fn recent() -> &'static Mutex<VecDeque<LoggedEvent>> {
    static RECENT_EVENTS: OnceLock<Mutex<VecDeque<LoggedEvent>>> = OnceLock::new();
    RECENT_EVENTS.get_or_init(|| Mutex::new(VecDeque::with_capacity(RECENT)))
}

/// The last warnings and errors, newest first.
pub fn recent_events() -> Vec<LoggedEvent> {
    firstseen_store::lock::lock(recent())
        .iter()
        .rev()
        .cloned()
        .collect()
}

/// A tracing layer that keeps the last warnings and errors in memory.
pub struct RecentEvents;

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        use std::fmt::Write;
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for RecentEvents {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        // Errors from anywhere; warnings only from firstseen itself, since
        // libraries warn about routine events (openraft during elections).
        let ours = meta.target().starts_with("firstseen");
        if *meta.level() > tracing::Level::WARN || (*meta.level() == tracing::Level::WARN && !ours)
        {
            return;
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        {
            let mut q = firstseen_store::lock::lock(recent());
            if q.len() == RECENT {
                q.pop_front();
            }
            q.push_back(LoggedEvent {
                at_ms: crate::now_ms(),
                level: meta.level().to_string(),
                target: meta.target().to_string(),
                message: fields.0,
            });
        }
    }
}

/// At most one refusal of each kind is logged per this interval; the rest
/// are counted in the log's metric and summed into the next line of that
/// kind.
pub const REFUSAL_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// Kinds of refusal tracked apart; beyond this, new kinds share one entry.
const REFUSAL_KINDS: usize = 32;

/// Logs refused clients (peers, admin requests), at most once per
/// [`REFUSAL_LOG_EVERY`] for each kind of refusal, so that a flood neither
/// floods the log disk nor hides a different reason behind the first. Every
/// refusal is counted in the metric, logged or not.
pub struct RefusalLog {
    metric: &'static str,
    /// What was refused, for the log line: "peer connection", say.
    subject: &'static str,
    /// kind → (last logged, refused since).
    state: std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, u64)>>,
}

/// The kind of a refusal: its reason without the node id, the details after
/// the first colon and any numbers ("node 9: garbled frame: …" and "node 3:
/// garbled frame: …" are one kind).
pub fn refusal_kind(reason: &str) -> String {
    let rest = match reason.strip_prefix("node ") {
        Some(r) => r.split_once(": ").map_or(reason, |(id, rest)| {
            if id.bytes().all(|b| b.is_ascii_digit()) {
                rest
            } else {
                reason
            }
        }),
        None => reason,
    };
    rest.split(':')
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_ascii_digit())
        .collect()
}

impl RefusalLog {
    pub fn new(metric: &'static str, subject: &'static str) -> Self {
        Self {
            metric,
            subject,
            state: Default::default(),
        }
    }

    pub fn refused(&self, peer: std::net::SocketAddr, reason: &str) {
        metrics::counter!(self.metric).increment(1);
        let subject = self.subject;
        let mut map = firstseen_store::lock::lock(&self.state);
        let mut kind = refusal_kind(reason);
        if !map.contains_key(&kind) && map.len() >= REFUSAL_KINDS {
            kind = "other".into();
        }
        let now = std::time::Instant::now();
        let entry = map.entry(kind);
        let due = matches!(&entry, std::collections::hash_map::Entry::Vacant(_))
            || matches!(&entry, std::collections::hash_map::Entry::Occupied(o) if o.get().0.elapsed() >= REFUSAL_LOG_EVERY);
        let slot = entry.or_insert((now, 0));
        if due {
            let more = std::mem::take(&mut slot.1);
            slot.0 = now;
            if more > 0 {
                tracing::warn!(peer = %peer, reason = %reason, refused_since_last = more, "{subject} refused ({more} more of this kind since the last report)");
            } else {
                tracing::warn!(peer = %peer, reason = %reason, "{subject} refused");
            }
        } else {
            slot.1 += 1;
        }
    }
}
