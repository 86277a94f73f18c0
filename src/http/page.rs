//! The status page: one self-contained HTML file, and `/cluster`, every
//! member's status fetched by this node so the page needs no cross-origin
//! requests.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use serde::Serialize;

use super::AppState;

/// The status page: one self-contained file, no external assets.
pub const PAGE: &str = include_str!("page.html");

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
pub async fn cluster(State(app): State<Arc<AppState>>) -> impl IntoResponse {
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
