//! The admin endpoints: adding and removing members, and raising the
//! cluster level. Each request must come
//! over TLS, from loopback, or where the operator allowed plain HTTP; carry
//! the admin token; and reach the leader (otherwise the reply names it).

use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Json;

use super::{listener, AppState};

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
    credential_gate(app, client, headers)?;
    leader_gate(app)
}

/// Checks the transport and the bearer secret.
fn credential_gate(
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
    Ok(())
}

/// Checks that this node leads; otherwise says who does.
fn leader_gate(app: &AppState) -> Result<(), AdminReply> {
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

pub async fn add_member(
    State(app): State<Arc<AppState>>,
    ConnectInfo(client): ConnectInfo<listener::Client>,
    headers: HeaderMap,
    Json(m): Json<NewMember>,
) -> AdminReply {
    if let Err(r) = admin_gate(&app, client, &headers) {
        return r;
    }
    // A node whose release cannot run the cluster's level would stop at
    // the first entry it cannot read: refused before it is a member.
    if let Err(why) = match app.levels.ask_one(m.id, &m.addr).await {
        Ok(levels) => app.levels.admits(&levels),
        Err(e) if app.state.level() > firstseen_store::level::BASE => Err(e),
        // At the base level every release can join; one that cannot be
        // asked yet is added as before and catches up.
        Err(_) => Ok(()),
    } {
        return (
            StatusCode::CONFLICT,
            Json(serde_json::json!({"error": format!("node {} cannot join: {why}", m.id)})),
        );
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

pub async fn remove_member(
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

/// The messages sent to Pulsar as markers, kept whole on every node: the
/// list (`GET /set-aside`), without payloads.
pub async fn set_aside_list(State(app): State<Arc<AppState>>) -> AdminReply {
    match app.state.set_aside_list() {
        Ok(list) => (
            StatusCode::OK,
            Json(serde_json::json!({ "set_aside": list })),
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(serde_json::json!({"error": e.to_string()})),
        ),
    }
}

/// One set-aside message whole (`GET /admin/set-aside/{id}`): its topic,
/// reason and payload (hex), for the operator who takes it from here. It
/// carries upstream data, so it asks for the admin credential; any node
/// answers (every node keeps the same).
pub async fn set_aside_get(
    State(app): State<Arc<AppState>>,
    ConnectInfo(client): ConnectInfo<listener::Client>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> AdminReply {
    if let Err(r) = credential_gate(&app, client, &headers) {
        return r;
    }
    match app.state.set_aside_get(id) {
        Ok(Some(k)) => (
            StatusCode::OK,
            Json(serde_json::json!({
                "id": id,
                "pulsar_topic": k.pulsar_topic,
                "seq": k.seq,
                "reason": k.reason,
                "at_ms": k.at_ms,
                "key": hex::encode(k.message.key),
                "mqtt_topic": k.message.mqtt_topic,
                "node": k.message.node,
                "first_seen_ms": k.message.first_seen_ms,
                "payload_hex": hex::encode(&k.message.payload),
            })),
        ),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({"error": format!("no set-aside message {id}")})),
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(serde_json::json!({"error": e.to_string()})),
        ),
    }
}

/// Reads the config file again and applies routes and subscriptions; any
/// node, for itself.
pub async fn reload(
    State(app): State<Arc<AppState>>,
    ConnectInfo(client): ConnectInfo<listener::Client>,
    headers: HeaderMap,
) -> AdminReply {
    if let Err(r) = credential_gate(&app, client, &headers) {
        return r;
    }
    match app.reloader.reload() {
        Ok(applied) => {
            tracing::info!(routes = applied.routes, subscriptions = ?applied.subscriptions, "config reloaded (admin API)");
            (
                StatusCode::OK,
                Json(serde_json::json!({ "applied": applied })),
            )
        }
        Err(e) => {
            tracing::error!(error = %e, "config not reloaded (admin API)");
            (
                StatusCode::CONFLICT,
                Json(serde_json::json!({"error": e.to_string()})),
            )
        }
    }
}

/// Raises the cluster level to the highest every member runs.
pub async fn upgrade(
    State(app): State<Arc<AppState>>,
    ConnectInfo(client): ConnectInfo<listener::Client>,
    headers: HeaderMap,
) -> AdminReply {
    if let Err(r) = admin_gate(&app, client, &headers) {
        return r;
    }
    use crate::propose::level::RaiseError;
    match app.levels.raise().await {
        Ok(level) => (StatusCode::OK, Json(serde_json::json!({"level": level}))),
        Err(e @ (RaiseError::Current(_) | RaiseError::Held(_))) => (
            StatusCode::CONFLICT,
            Json(serde_json::json!({"error": e.to_string(), "view": app.levels.view()})),
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(serde_json::json!({"error": e.to_string()})),
        ),
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
