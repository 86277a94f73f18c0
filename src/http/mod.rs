//! The node's HTTP API, one file per concern:
//!
//! - [`listener`]: accepts connections, plain or TLS, at most a bounded
//!   number per client address, each with an idle timeout.
//! - [`status`]: what `/status` and `/readyz` say, and why a node is not
//!   ready.
//! - [`page`]: the status page (`/`) and what it fetches (`/cluster`).
//! - [`admin`]: the authenticated admin endpoints (members).
//! - [`gauges`]: the gauges and the page's chart samples (`/history`),
//!   taken once a second from the status.
//!
//! This file holds what the handlers read ([`AppState`]) and the router.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Json};
use axum::routing::{delete, get, post};
use axum::Router;
use firstseen_raft::Raft;
use firstseen_store::StateStore;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::ingest::UpstreamStatus;
use crate::secret::ClusterKey;

pub mod admin;
pub mod gauges;
pub mod listener;
pub mod page;
pub mod status;

pub use gauges::{gauges, Sample, SAMPLE_EVERY};
pub use status::{NotReady, Status};

/// The key admin requests are checked against: the admin token's when
/// `node.admin_token_file` is set, the cluster secret's otherwise.
pub fn admin_key(
    token_file: Option<&std::path::Path>,
    cluster: &ClusterKey,
) -> Result<ClusterKey, crate::Error> {
    match token_file {
        Some(f) => ClusterKey::read("node.admin_token_file", f),
        None => Ok(cluster.clone()),
    }
}

/// What `POST /admin/reload` reports: whether the routes changed, and the
/// upstreams whose subscriptions did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Reloaded {
    pub routes: bool,
    pub subscriptions: Vec<String>,
}

/// Reading the config file again, as `POST /admin/reload` asks. The node
/// implements it (`node::reload::Reloader`): the API names nothing of the
/// node that builds it, so the two do not import each other.
pub trait Reload: Send + Sync {
    /// What was applied, or why nothing was (shown to the caller as is).
    fn reload(&self) -> Result<Reloaded, Box<dyn std::error::Error + Send + Sync>>;
}

/// What the handlers read.
pub struct AppState {
    /// The cluster level: its status, and raising it (`/admin/upgrade`).
    pub levels: crate::propose::level::LevelGate,
    /// Reads the config file again (`POST /admin/reload`).
    pub reloader: Arc<dyn Reload>,
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
    /// The topics this node's publisher gave up to a newer generation of
    /// its cluster (`publish::tail::Superseded`): read by readiness.
    pub superseded: crate::publish::tail::Superseded,
}

/// Serves the API on `listener` until `shutdown`.
pub async fn serve(listener: listener::Listener, app: Arc<AppState>, shutdown: CancellationToken) {
    let router = Router::new()
        .route("/", get(|| async { Html(page::PAGE) }))
        .route("/cluster", get(page::cluster))
        .route("/history", get(history))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route("/admin/members", post(admin::add_member))
        .route("/admin/members/{id}", delete(admin::remove_member))
        .route("/admin/upgrade", post(admin::upgrade))
        .route("/admin/reload", post(admin::reload))
        .route("/set-aside", get(admin::set_aside_list))
        .route("/admin/set-aside/{id}", get(admin::set_aside_get))
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

async fn history(State(app): State<Arc<AppState>>) -> impl IntoResponse {
    let samples: Vec<Sample> = firstseen_store::lock::lock(&app.history)
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
