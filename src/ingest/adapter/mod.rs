//! The upstream session on rumqttc, behind ingest's port (`port.rs`), the
//! same to the rest of ingest whether the broker speaks MQTT 3.1.1 ([`v4`])
//! or 5 ([`v5`]). The protocol is chosen once, when the upstream starts
//! (`Upstream::run`); from then on ingest sees only the port.
//!
//! - In each, `Client` sends acks (PUBACK for QoS 1, PUBREC for QoS 2),
//!   subscribes and disconnects; `Session` owns the event loop and turns its
//!   events into the port's events, MQTT 5 properties included.
//! - This file holds what both share: the connection options read from the
//!   config, and what an I/O failure means.
//! - **QoS 2 across reconnects.** rumqttc 0.25 forgets, on every reconnect
//!   (and in a new process), which QoS 2 messages it sent PUBREC for; the
//!   broker then resends PUBREL for them, rumqttc calls that unsolicited
//!   and drops the connection, and the broker resends it again: a node
//!   stuck reconnecting for good (rumqtt issue #664, unfixed in 0.25). So
//!   after each reset of rumqttc's state the session marks every packet id
//!   as one rumqttc may get a PUBREL for (`Session::expect_any_pubrel`);
//!   a PUBREL is then answered with PUBCOMP, as MQTT says it must be.
//!   Marking an id that the broker never uses has no effect.

use std::time::Duration;

use rumqttc::Transport;

use super::port::SessionError;
use super::{Upstream, UpstreamAddr};

pub mod v4;
pub mod v5;

/// The largest MQTT packet rumqttc will read. Set to the protocol maximum so
/// that an oversized payload reaches our documented policy instead of
/// breaking the connection in a redelivery loop.
const MAX_MQTT_PACKET: usize = 268_435_455;

/// Requests rumqttc may queue. Above the 65,535 packet ids a broker can have
/// in flight to us, so an ack never finds the queue full.
const REQUEST_CAPACITY: usize = 70_000;

/// How a session connects.
pub struct Options {
    pub v5: bool,
    pub client_id: String,
    pub host: String,
    pub port: u16,
    pub keepalive: Duration,
    pub credentials: Option<(String, String)>,
    /// TLS, when the upstream is `mqtts://`.
    pub transport: Option<rumqttc::Transport>,
    pub max_packet: usize,
    pub request_capacity: usize,
    /// MQTT 5 only: how long the broker keeps the session after a disconnect.
    pub session_expiry_secs: u32,
    /// Whether any subscription is QoS 2 (then PUBRELs may come back).
    pub qos2: bool,
}

/// How upstream `u` connects, from its config.
pub fn options(u: &Upstream) -> Result<Options, crate::Error> {
    let addr = UpstreamAddr::parse(&u.config.url)
        .map_err(|why| crate::Error::setting(format!("upstreams[{}].url", u.index), why))?;
    let credentials = match &u.config.username {
        Some(user) => {
            let password = match (&u.config.password, &u.config.password_file) {
                (Some(p), _) => p.clone(),
                (None, Some(f)) => std::fs::read_to_string(f)
                    .map_err(|source| crate::Error::SettingFile {
                        key: format!("upstreams[{}].password_file", u.index),
                        path: f.clone(),
                        source,
                    })?
                    .trim_end()
                    .to_string(),
                (None, None) => String::new(),
            };
            Some((user.clone(), password))
        }
        None => None,
    };
    Ok(Options {
        v5: u.config.protocol == crate::ingest::config::Protocol::V5,
        client_id: u.client_id.clone(),
        host: addr.host,
        port: addr.port,
        keepalive: Duration::from_secs(u.config.keepalive_secs),
        credentials,
        transport: match (
            addr.tls,
            crate::tls::upstream::client_config(u.config.tls_settings()),
        ) {
            (false, _) => None,
            (true, Ok(None)) => Some(Transport::tls_with_default_config()),
            (true, Ok(Some(c))) => Some(Transport::tls_with_config(
                rumqttc::TlsConfiguration::Rustls(c),
            )),
            (true, Err(e)) => {
                return Err(crate::Error::setting(
                    format!("upstreams[{}].{}", u.index, e.key),
                    e.problem,
                ))
            }
        },
        max_packet: MAX_MQTT_PACKET,
        request_capacity: REQUEST_CAPACITY,
        session_expiry_secs: u.config.session_expiry_secs,
        qos2: u.config.subscriptions.iter().any(|s| s.qos == 2),
    })
}

/// Topic of the placeholder publishes that mark packet ids (never seen by
/// the rest of ingest).
pub(super) const REPAIR_TOPIC: &str = "$firstseen/qos2-pubrel";

/// What an I/O failure of the connection means. The standard library has
/// no error kind for a name that does not resolve, so a failure of a kind
/// that a live connection would not give is checked by resolving the host
/// again: only on a failed connect, which then waits out a backoff anyway.
pub(super) async fn classify_io(e: std::io::Error, host: &str, port: u16) -> SessionError {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => SessionError::Refused,
        K::TimedOut => SessionError::Timeout,
        K::ConnectionReset
        | K::ConnectionAborted
        | K::BrokenPipe
        | K::UnexpectedEof
        | K::NotConnected => SessionError::Lost {
            detail: e.to_string(),
        },
        _ => match tokio::net::lookup_host((host, port)).await {
            Err(dns) => SessionError::Unresolved {
                host: host.to_string(),
                detail: dns.to_string(),
            },
            Ok(_) => SessionError::Lost {
                detail: e.to_string(),
            },
        },
    }
}
