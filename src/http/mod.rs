//! The node's HTTP API: the status page (`/`), `/healthz`, `/readyz`,
//! `/status`, `/cluster` and `/history` (JSON), `/metrics`, and the
//! authenticated admin endpoints.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Json};
use axum::routing::{delete, get, post};
use axum::Router;
use firstseen_raft::Raft;
use firstseen_store::StateStore;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::cluster::wire::ClusterKey;
use crate::ingest::UpstreamStatus;

pub mod listener;

/// What the handlers read.
pub struct AppState {
    pub node_id: u64,
    pub zone: String,
    pub raft: Raft,
    pub state: StateStore,
    /// The Raft log's database, for the disk figure.
    pub log_db: firstseen_store::disk::Db,
    pub upstreams: Vec<(String, Arc<UpstreamStatus>)>,
    pub metrics: Option<PrometheusHandle>,
    /// Admin requests must present this: the admin token when the node has
    /// one, the cluster secret otherwise.
    pub key: ClusterKey,
    /// Admin requests over plain HTTP from other hosts are accepted.
    pub allow_plaintext_admin: bool,
    /// Refused admin requests, counted and logged at a bounded rate.
    pub admin_refusals: crate::telemetry::RefusalLog,
    /// Where the snapshot files live, for their size.
    pub snapshot_dir: std::path::PathBuf,
    /// Samples for the status page's charts.
    pub history: Mutex<VecDeque<Sample>>,
    /// Free space on the data directory's filesystem.
    pub disk: Arc<crate::diskspace::DiskSpace>,
    /// Evidence of who is alive: what readiness and the role rest on.
    pub liveness: Arc<crate::cluster::liveness::Liveness>,
    pub timing: crate::cluster::liveness::Timing,
    /// Whether publishing stands still with messages waiting: fed by
    /// [`gauges`] once a second, read by readiness.
    pub publishing: Mutex<crate::publish::stall::StallWatch>,
}

/// One point of the status page's charts, taken every [`SAMPLE_EVERY`].
#[derive(Clone, Serialize)]
pub struct Sample {
    pub at_ms: u64,
    /// Copies this node received from its upstreams (cumulative).
    pub received: u64,
    /// Copies committed cluster-wide (cumulative).
    pub observed: u64,
    /// Of those, duplicates (cumulative).
    pub duplicates: u64,
    /// Messages confirmed in Pulsar, over all topics (cumulative).
    pub published: u64,
    pub outbox_messages: u64,
}

/// Chart resolution and span: 5 s samples over 15 minutes.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const SAMPLES: usize = 180;

/// What `GET /status` answers, and what `firstseen status` reads back: one
/// type for the server and the CLI. Fields a node of another version leaves
/// out read as their defaults.
#[derive(Serialize, Deserialize, Debug, Default)]
#[serde(default)]
pub struct Status {
    pub node: u64,
    pub zone: String,
    /// The leader this node can vouch for: itself if a quorum confirmed its
    /// leadership recently, the leader it hears from if it heard recently,
    /// otherwise none.
    pub leader: Option<u64>,
    /// The leader openraft last knew of, even if this node cannot vouch for
    /// it now.
    pub known_leader: Option<u64>,
    /// True only while this node leads and a quorum confirmed it recently.
    pub is_leader: bool,
    /// `leader`, `leader_unconfirmed` (leads in its own eyes, but no quorum
    /// confirmed it recently: cut off, or the others moved on), `follower`,
    /// `follower_without_leader`, `candidate`, `learner` or `shutdown`.
    pub role: String,
    /// Since the last accepted append from a leader, in milliseconds.
    pub leader_contact_ms: Option<u64>,
    /// Since this node, as leader, last had a quorum confirm it.
    pub lease_confirmed_ms: Option<u64>,
    pub term: u64,
    pub last_applied: Option<u64>,
    pub members: Vec<MemberStatus>,
    pub upstreams: Vec<UpstreamView>,
    pub totals: firstseen_store::Totals,
    pub topics: Vec<TopicView>,
    pub coverage: Vec<CoverageView>,
    /// Both databases: the state and the Raft log.
    pub disk_bytes: u64,
    /// The state machine's database alone: what the window costs.
    pub state_disk_bytes: u64,
    /// Free space on the data directory's filesystem, against the reserve.
    pub disk: DiskView,
    pub ready: bool,
    pub not_ready_reason: Option<String>,
    /// How long the group's published watermark has stood still while
    /// messages wait in the outbox; none while it moves or nothing waits.
    /// On the leader, past `publish::stall::STALL_AFTER` it is not ready.
    pub publishing_stalled_ms: Option<u64>,
    /// This node's wall clock when it answered, in ms since the epoch.
    /// Beside `totals.clock_ms` (the window clock) it shows how far the
    /// window clock is behind this node's clock: it never runs ahead of
    /// real time, so it falls behind after whole-cluster outages
    /// (docs/architecture.md, "The window clock").
    pub clock_ms: u64,
    /// The last warnings and errors this node logged, newest first.
    pub recent_errors: Vec<crate::telemetry::LoggedEvent>,
}

#[derive(Serialize, Deserialize, Debug, Default)]
#[serde(default)]
pub struct DiskView {
    pub free_bytes: u64,
    pub reserve_bytes: u64,
    /// True while free space is below the reserve: nothing is written, acks
    /// are held.
    pub low: bool,
}

#[derive(Serialize, Deserialize, Debug, Default, Clone)]
#[serde(default)]
pub struct MemberStatus {
    pub id: u64,
    pub zone: String,
    pub addr: String,
    pub http: String,
    /// Voter, or learner still catching up.
    pub voter: bool,
    /// Since the last peer frame exchanged with this member, in
    /// milliseconds (none for this node itself, or never).
    pub last_contact_ms: Option<u64>,
    /// On the leader: the last log index replicated to this member.
    pub matched_index: Option<u64>,
    /// On the leader: entries this member is behind the leader's log.
    pub lag: Option<u64>,
}

#[derive(Serialize, Deserialize, Debug, Default)]
#[serde(default)]
pub struct UpstreamView {
    pub name: String,
    pub connected: bool,
    pub received: u64,
    pub last_error: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Default)]
#[serde(default)]
pub struct TopicView {
    pub topic: String,
    pub last_seq: u64,
    pub published_seq: u64,
    pub backlog: u64,
}

#[derive(Serialize, Deserialize, Debug, Default)]
#[serde(default)]
pub struct CoverageView {
    pub node: u64,
    pub zone: String,
    pub seen: u64,
    pub first: u64,
    /// Share of the window's keys this node delivered.
    pub seen_ratio: f64,
    /// Share of the window's keys this node delivered first.
    pub first_ratio: f64,
}

impl AppState {
    /// A consistent-enough picture of this node for status and tests.
    pub fn status(&self) -> Result<Status, crate::Error> {
        let m = self.raft.metrics().borrow().clone();
        let totals = self.state.totals()?;
        let ready = self.ready();
        let state_disk = self.state.size_on_disk().unwrap_or(0);
        let window = totals.window_keys.max(1) as f64;
        let voters: Vec<u64> = m.membership_config.membership().voter_ids().collect();
        let contacts = self.liveness.peer_ages();
        let last_index = m.last_log_index;
        let members: Vec<MemberStatus> = m
            .membership_config
            .nodes()
            .map(|(id, n)| {
                let matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(id).cloned())
                    .map(|l| l.map_or(0, |l| l.index));
                MemberStatus {
                    id: *id,
                    zone: n.zone.clone(),
                    addr: n.addr.clone(),
                    http: n.http.clone(),
                    voter: voters.contains(id),
                    last_contact_ms: contacts.get(id).map(|d| d.as_millis() as u64),
                    matched_index: matched,
                    lag: matched.map(|i| last_index.unwrap_or(0).saturating_sub(i)),
                }
            })
            .collect();
        let (role, trusted) = self.role(&m);
        let zone_of = |node: u64| {
            members
                .iter()
                .find(|m| m.id == node)
                .map(|m| m.zone.clone())
                .unwrap_or_else(|| "(removed)".into())
        };
        Ok(Status {
            node: self.node_id,
            zone: self.zone.clone(),
            clock_ms: crate::now_ms(),
            publishing_stalled_ms: self.publishing_stalled().map(|d| d.as_millis() as u64),
            leader: trusted,
            known_leader: m.current_leader,
            is_leader: role == "leader",
            role: role.to_string(),
            leader_contact_ms: self
                .liveness
                .leader_contact_age()
                .map(|d| d.as_millis() as u64),
            lease_confirmed_ms: self.liveness.lease_age().map(|d| d.as_millis() as u64),
            term: m.current_term,
            last_applied: m.last_applied.map(|l| l.index),
            members: Vec::new(),
            upstreams: self
                .upstreams
                .iter()
                .map(|(name, s)| UpstreamView {
                    name: name.clone(),
                    connected: s.connected.load(Ordering::Relaxed),
                    received: s.received.load(Ordering::Relaxed),
                    last_error: firstseen_store::sync::lock(&s.last_error).clone(),
                })
                .collect(),
            totals,
            topics: self
                .state
                .topics()?
                .into_iter()
                .map(|(topic, t)| TopicView {
                    topic,
                    last_seq: t.last_seq,
                    published_seq: t.published_seq,
                    backlog: t.last_seq - t.published_seq.min(t.last_seq),
                })
                .collect(),
            coverage: self
                .state
                .coverage()?
                .into_iter()
                .map(|(node, c)| CoverageView {
                    node,
                    zone: zone_of(node),
                    seen: c.seen,
                    first: c.first,
                    seen_ratio: c.seen as f64 / window,
                    first_ratio: c.first as f64 / window,
                })
                .collect(),
            disk_bytes: state_disk + self.log_db.size_on_disk().unwrap_or(0),
            state_disk_bytes: state_disk,
            disk: DiskView {
                free_bytes: self.disk.free(),
                reserve_bytes: self.disk.reserve(),
                low: self.disk.is_low(),
            },
            ready: ready.is_ok(),
            not_ready_reason: ready.err().map(|e| e.to_string()),
            recent_errors: crate::telemetry::recent_events(),
        })
        .map(|mut s: Status| {
            s.members = members;
            s
        })
    }

    /// What this node can vouch for about its role, and the leader it
    /// trusts (see [`Status::role`]).
    fn role(
        &self,
        m: &openraft::RaftMetrics<u64, firstseen_raft::Member>,
    ) -> (&'static str, Option<u64>) {
        use openraft::ServerState;
        let stale = self.timing.stale();
        let fresh = |age: Option<Duration>| age.is_some_and(|a| a <= stale);
        match m.state {
            ServerState::Leader if fresh(self.liveness.lease_age()) => {
                ("leader", Some(self.node_id))
            }
            ServerState::Leader => ("leader_unconfirmed", None),
            ServerState::Follower
                if m.current_leader.is_some() && fresh(self.liveness.leader_contact_age()) =>
            {
                ("follower", m.current_leader)
            }
            ServerState::Follower => ("follower_without_leader", None),
            ServerState::Candidate => ("candidate", None),
            ServerState::Learner if fresh(self.liveness.leader_contact_age()) => {
                ("learner", m.current_leader)
            }
            ServerState::Learner => ("learner", None),
            ServerState::Shutdown => ("shutdown", None),
        }
    }

    fn publishing_stalled(&self) -> Option<Duration> {
        firstseen_store::sync::lock(&self.publishing).stalled(tokio::time::Instant::now())
    }

    fn ready(&self) -> Result<(), NotReady> {
        let m = self.raft.metrics().borrow().clone();
        if m.current_leader.is_none() {
            return Err(NotReady::NoLeader);
        }
        match self.role(&m) {
            ("leader_unconfirmed", _) => {
                return Err(NotReady::LeaderUnconfirmed {
                    term: m.current_term,
                    for_ms: self.liveness.lease_age().map_or(0, |d| d.as_millis()),
                })
            }
            ("follower_without_leader", _) | ("candidate", _) => {
                return Err(NotReady::NoLeaderContact {
                    for_ms: self
                        .liveness
                        .leader_contact_age()
                        .unwrap_or_else(|| self.liveness.uptime())
                        .as_millis(),
                })
            }
            _ => {}
        }
        if let Some(reason) = self.disk.reason() {
            return Err(NotReady::DiskLow(reason));
        }
        if let ("leader", _) = self.role(&m) {
            if let Some(stalled) = self
                .publishing_stalled()
                .filter(|d| *d >= crate::publish::stall::STALL_AFTER)
            {
                return Err(NotReady::PublishingStalled {
                    secs: stalled.as_secs(),
                });
            }
        }
        for (name, s) in &self.upstreams {
            if !s.connected.load(Ordering::Relaxed) {
                return Err(NotReady::UpstreamDown(name.clone()));
            }
        }
        Ok(())
    }
}

/// Why a node answers `/readyz` with 503 (also `not_ready_reason` in
/// `/status`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    #[error("no Raft leader known")]
    NoLeader,
    #[error("leader of term {term} in its own eyes, but no quorum confirmed it for {for_ms} ms")]
    LeaderUnconfirmed { term: u64, for_ms: u128 },
    #[error("no contact with a leader for {for_ms} ms")]
    NoLeaderContact { for_ms: u128 },
    /// Free space below `node.disk_reserve_bytes`; the text says how much.
    #[error("{0}")]
    DiskLow(String),
    #[error("publishing has made no progress for {secs} s with messages waiting in the outbox")]
    PublishingStalled { secs: u64 },
    #[error("upstream {0} is not connected")]
    UpstreamDown(String),
}

/// Serves the API on `listener` until `shutdown`.
pub async fn serve(listener: listener::Listener, app: Arc<AppState>, shutdown: CancellationToken) {
    let router = Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/cluster", get(cluster))
        .route("/history", get(history))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route("/admin/members", post(add_member))
        .route("/admin/members/{id}", delete(remove_member))
        .with_state(app);
    if let Err(e) = axum::serve(
        listener,
        router.into_make_service_with_connect_info::<listener::Client>(),
    )
    .with_graceful_shutdown(async move { shutdown.cancelled().await })
    .await
    {
        tracing::error!(error = %e, "http server failed");
    }
}

/// A member to add, as the admin API takes it.
#[derive(serde::Deserialize)]
pub struct NewMember {
    pub id: u64,
    pub zone: String,
    pub addr: String,
    #[serde(default)]
    pub http: String,
}

type AdminReply = (StatusCode, Json<serde_json::Value>);

/// Whether an admin request may present the secret over this connection:
/// over TLS, from a loopback client, or where the operator allowed plain
/// HTTP. Pure, for the unit test.
pub fn secret_may_travel(client: listener::Client, allow_plaintext_admin: bool) -> bool {
    client.tls || client.addr.ip().to_canonical().is_loopback() || allow_plaintext_admin
}

/// Checks the transport, the bearer secret and that this node leads;
/// otherwise says who does.
fn admin_gate(
    app: &AppState,
    client: listener::Client,
    headers: &HeaderMap,
) -> Result<(), AdminReply> {
    if !secret_may_travel(client, app.allow_plaintext_admin) {
        // Refused before the secret is even looked at; it has crossed the
        // network in the clear already, which the message says.
        app.admin_refusals.refused(
            client.addr,
            "secret sent over plain HTTP from a non-loopback client",
        );
        return Err((
            StatusCode::FORBIDDEN,
            Json(serde_json::json!({
                "error": "admin requests carry the cluster secret and are refused over plain HTTP from another host: configure [node.http_tls] and use https://, or set node.allow_plaintext_admin = true on a network you trust; if this request carried the real secret, consider it exposed and rotate it"
            })),
        ));
    }
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // matches_secret compares blake3 hashes, whose equality is constant
    // time: the reply's timing says nothing about how much of a guess matched.
    if !token.is_some_and(|t| app.key.matches_secret(t.as_bytes())) {
        app.admin_refusals
            .refused(client.addr, "missing or wrong admin credential");
        return Err((
            StatusCode::UNAUTHORIZED,
            Json(
                serde_json::json!({"error": "admin requests need `Authorization: Bearer <admin token>` (node.admin_token_file, or the cluster secret when the node has none)"}),
            ),
        ));
    }
    let m = app.raft.metrics().borrow().clone();
    if m.current_leader != Some(app.node_id) {
        let leader_http = m.current_leader.and_then(|l| {
            m.membership_config
                .nodes()
                .find(|(id, _)| **id == l)
                .map(|(_, n)| n.http.clone())
        });
        return Err((
            StatusCode::CONFLICT,
            Json(
                serde_json::json!({"error": "not the leader", "leader": m.current_leader, "leader_http": leader_http}),
            ),
        ));
    }
    Ok(())
}

async fn add_member(
    State(app): State<Arc<AppState>>,
    ConnectInfo(client): ConnectInfo<listener::Client>,
    headers: HeaderMap,
    Json(m): Json<NewMember>,
) -> AdminReply {
    if let Err(r) = admin_gate(&app, client, &headers) {
        return r;
    }
    tracing::info!(id = m.id, zone = %m.zone, addr = %m.addr, "adding member");
    let member = firstseen_raft::Member {
        addr: m.addr,
        zone: m.zone,
        http: m.http,
    };
    match crate::cluster::add_member(&app.raft, m.id, member).await {
        Ok(()) => (StatusCode::OK, Json(serde_json::json!({"added": m.id}))),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(serde_json::json!({"error": e.to_string()})),
        ),
    }
}

async fn remove_member(
    State(app): State<Arc<AppState>>,
    ConnectInfo(client): ConnectInfo<listener::Client>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> AdminReply {
    if let Err(r) = admin_gate(&app, client, &headers) {
        return r;
    }
    tracing::info!(id, "removing member");
    match crate::cluster::remove_member(&app.raft, id).await {
        Ok(()) => (StatusCode::OK, Json(serde_json::json!({"removed": id}))),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(serde_json::json!({"error": e.to_string()})),
        ),
    }
}

/// The status page: one self-contained file, no external assets.
const PAGE: &str = include_str!("page.html");

/// One member as the status page shows it, fetched from that member.
#[derive(Serialize)]
struct MemberView {
    id: u64,
    zone: String,
    http: String,
    voter: bool,
    reachable: bool,
    status: Option<serde_json::Value>,
    error: Option<String>,
}

/// Every member's own /status, fetched server-side (so the page needs no
/// cross-origin requests) with a short timeout.
async fn cluster(State(app): State<Arc<AppState>>) -> impl IntoResponse {
    let Ok(me) = app.status() else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(serde_json::json!([])),
        )
            .into_response();
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap_or_default();
    let fetches = me.members.iter().map(|m| {
        let client = client.clone();
        let local = (m.id == app.node_id)
            .then(|| serde_json::to_value(&me).ok())
            .flatten();
        async move {
            let (status, error) = match local {
                Some(v) => (Some(v), None),
                None if m.http.is_empty() => {
                    (None, Some("no HTTP address in the membership".to_string()))
                }
                None => match client.get(format!("http://{}/status", m.http)).send().await {
                    Ok(r) => match r.json::<serde_json::Value>().await {
                        Ok(v) => (Some(v), None),
                        Err(e) => (None, Some(e.to_string())),
                    },
                    Err(e) => (None, Some(e.to_string())),
                },
            };
            MemberView {
                id: m.id,
                zone: m.zone.clone(),
                http: m.http.clone(),
                voter: m.voter,
                reachable: status.is_some(),
                status,
                error,
            }
        }
    });
    Json(futures::future::join_all(fetches).await).into_response()
}

async fn history(State(app): State<Arc<AppState>>) -> impl IntoResponse {
    let samples: Vec<Sample> = firstseen_store::sync::lock(&app.history)
        .iter()
        .cloned()
        .collect();
    Json(samples)
}

async fn readyz(State(app): State<Arc<AppState>>) -> impl IntoResponse {
    match app.ready() {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

async fn status(State(app): State<Arc<AppState>>) -> impl IntoResponse {
    match app.status() {
        Ok(s) => Json(s).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn metrics(State(app): State<Arc<AppState>>) -> impl IntoResponse {
    match &app.metrics {
        Some(h) => (StatusCode::OK, h.render()),
        None => (
            StatusCode::NOT_FOUND,
            "metrics recorder not installed\n".to_string(),
        ),
    }
}

/// Publishes state-derived gauges once a second (per interval, not per
/// message), and records a chart sample every [`SAMPLE_EVERY`].
pub async fn gauges(app: Arc<AppState>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut ticks = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => break,
        }
        let Ok(s) = app.status() else { continue };
        {
            let mut w = firstseen_store::sync::lock(&app.publishing);
            let published = s.topics.iter().map(|t| t.published_seq).sum();
            let backlog = s.topics.iter().map(|t| t.backlog).sum();
            w.note(published, backlog, tokio::time::Instant::now());
        }
        metrics::gauge!("firstseen_outbox_messages").set(s.totals.outbox_messages as f64);
        metrics::gauge!("firstseen_outbox_bytes").set(s.totals.outbox_bytes as f64);
        metrics::gauge!("firstseen_window_keys").set(s.totals.window_keys as f64);
        metrics::gauge!("firstseen_raft_term").set(s.term as f64);
        metrics::gauge!("firstseen_raft_is_leader").set(if s.is_leader { 1.0 } else { 0.0 });
        metrics::gauge!("firstseen_raft_leader_id").set(s.leader.unwrap_or(0) as f64);
        metrics::gauge!("firstseen_raft_applied_index").set(s.last_applied.unwrap_or(0) as f64);
        metrics::gauge!("firstseen_disk_bytes").set(s.disk_bytes as f64);
        let snapshot: u64 = std::fs::read_dir(&app.snapshot_dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("snap-"))
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0);
        metrics::gauge!("firstseen_snapshot_bytes").set(snapshot as f64);
        for c in &s.coverage {
            // "member", not "node": every series already carries this node's
            // own id as the global label `node`.
            let labels = [
                ("member", c.node.to_string()),
                ("member_zone", c.zone.clone()),
            ];
            metrics::gauge!("firstseen_coverage_seen_ratio", &labels).set(c.seen_ratio);
            metrics::gauge!("firstseen_coverage_first_ratio", &labels).set(c.first_ratio);
        }
        if ticks.is_multiple_of(SAMPLE_EVERY.as_secs()) {
            let sample = Sample {
                at_ms: crate::now_ms(),
                received: s.upstreams.iter().map(|u| u.received).sum(),
                observed: s.totals.observed,
                duplicates: s.totals.duplicates,
                published: s.topics.iter().map(|t| t.published_seq).sum(),
                outbox_messages: s.totals.outbox_messages,
            };
            {
                let mut h = firstseen_store::sync::lock(&app.history);
                if h.len() == SAMPLES {
                    h.pop_front();
                }
                h.push_back(sample);
            }
        }
        ticks += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_travels_over_tls_from_loopback_or_where_allowed() {
        let at = |a: &str, tls| listener::Client {
            addr: a.parse().unwrap(),
            tls,
        };
        assert!(secret_may_travel(at("10.0.0.5:4000", true), false));
        assert!(secret_may_travel(at("127.0.0.1:4000", false), false));
        assert!(secret_may_travel(at("[::1]:4000", false), false));
        assert!(secret_may_travel(
            at("[::ffff:127.0.0.1]:4000", false),
            false
        ));
        assert!(!secret_may_travel(at("10.0.0.5:4000", false), false));
        assert!(!secret_may_travel(
            at("[::ffff:10.0.0.5]:4000", false),
            false
        ));
        assert!(secret_may_travel(at("10.0.0.5:4000", false), true));
    }
}
