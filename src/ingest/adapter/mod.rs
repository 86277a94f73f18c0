//! The upstream session on rumqttc, behind ingest's port (`port.rs`), the
//! same to the rest of ingest whether the broker speaks MQTT 3.1.1 or 5.
//!
//! - [`Client`] sends acks (PUBACK for QoS 1, PUBREC for QoS 2), subscribes
//!   and disconnects; [`Session`] owns the event loop and turns its events
//!   into [`Event`]s, MQTT 5 properties included.
//! - **QoS 2 across reconnects.** rumqttc 0.25 forgets, on every reconnect
//!   (and in a new process), which QoS 2 messages it sent PUBREC for; the
//!   broker then resends PUBREL for them, rumqttc calls that unsolicited
//!   and drops the connection, and the broker resends it again: a node
//!   stuck reconnecting for good (rumqtt issue #664, unfixed in 0.25). So
//!   after each reset of rumqttc's state the session marks every packet id
//!   as one rumqttc may get a PUBREL for ([`Session::expect_any_pubrel`]);
//!   a PUBREL is then answered with PUBCOMP, as MQTT says it must be.
//!   Marking an id that the broker never uses has no effect.

use std::time::Duration;

use firstseen_store::Properties;
use futures::future::BoxFuture;
use rumqttc::Transport;

use super::port::{Event, Message, QueueFull, SessionError, UpstreamClient, UpstreamSession};
use super::{Upstream, UpstreamAddr};

/// The largest MQTT packet rumqttc will read. Set to the protocol maximum so
/// that an oversized payload reaches our documented policy instead of
/// breaking the connection in a redelivery loop.
const MAX_MQTT_PACKET: usize = 268_435_455;

/// Requests rumqttc may queue. Above the 65,535 packet ids a broker can have
/// in flight to us, so an ack never finds the queue full.
const REQUEST_CAPACITY: usize = 70_000;

/// Sends what ingest sends upstream.
#[derive(Clone)]
pub enum Client {
    V4(rumqttc::AsyncClient),
    V5(rumqttc::v5::AsyncClient),
}

fn qos4(level: u8) -> rumqttc::QoS {
    match level {
        0 => rumqttc::QoS::AtMostOnce,
        1 => rumqttc::QoS::AtLeastOnce,
        _ => rumqttc::QoS::ExactlyOnce,
    }
}

fn qos5(level: u8) -> rumqttc::v5::mqttbytes::QoS {
    use rumqttc::v5::mqttbytes::QoS;
    match level {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

impl UpstreamClient for Client {
    fn try_ack(&self, pkid: u16, qos: u8) -> Result<(), QueueFull> {
        match self {
            Client::V4(c) => {
                let mut p = rumqttc::Publish::new("", qos4(qos), Vec::new());
                p.pkid = pkid;
                c.try_ack(&p).map_err(|_| QueueFull)
            }
            Client::V5(c) => {
                let mut p =
                    rumqttc::v5::mqttbytes::v5::Publish::new("", qos5(qos), Vec::new(), None);
                p.pkid = pkid;
                c.try_ack(&p).map_err(|_| QueueFull)
            }
        }
    }

    fn try_subscribe(&self, filters: &[(String, u8)]) -> Result<(), QueueFull> {
        match self {
            Client::V4(c) => c
                .try_subscribe_many(
                    filters
                        .iter()
                        .map(|(f, q)| rumqttc::SubscribeFilter::new(f.clone(), qos4(*q))),
                )
                .map_err(|_| QueueFull),
            Client::V5(c) => c
                .try_subscribe_many(
                    filters
                        .iter()
                        .map(|(f, q)| rumqttc::v5::mqttbytes::v5::Filter::new(f.clone(), qos5(*q))),
                )
                .map_err(|_| QueueFull),
        }
    }

    fn try_disconnect(&self) {
        let _ = match self {
            Client::V4(c) => c.try_disconnect().map_err(|_| ()),
            Client::V5(c) => c.try_disconnect().map_err(|_| ()),
        };
    }
}

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
        v5: u.config.protocol == crate::config::Protocol::V5,
        client_id: u.client_id.clone(),
        host: addr.host,
        port: addr.port,
        keepalive: Duration::from_secs(u.config.keepalive_secs),
        credentials,
        transport: match (addr.tls, crate::tls::upstream::client_config(&u.config)) {
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

/// The event loop of one upstream connection.
// One per upstream, made once and polled in place: the size of the larger
// variant costs nothing, and boxing it would only add an indirection.
#[allow(clippy::large_enum_variant)]
pub enum Session {
    V4 {
        eventloop: rumqttc::EventLoop,
        qos2: bool,
    },
    V5 {
        eventloop: rumqttc::v5::EventLoop,
        qos2: bool,
    },
}

/// Topic of the placeholder publishes that mark packet ids (never seen by
/// the rest of ingest).
const REPAIR_TOPIC: &str = "$firstseen/qos2-pubrel";

impl Session {
    /// A client and its session; nothing connects before the first poll.
    pub fn new(o: Options) -> (Client, Session) {
        if o.v5 {
            let mut m = rumqttc::v5::MqttOptions::new(o.client_id, o.host, o.port);
            m.set_keep_alive(o.keepalive)
                // A persistent session, as clean_session = false is in 3.1.1:
                // the broker keeps unacked messages while this node is away.
                .set_clean_start(false)
                .set_session_expiry_interval(Some(o.session_expiry_secs))
                .set_manual_acks(true)
                .set_max_packet_size(Some(o.max_packet as u32))
                .set_request_channel_capacity(o.request_capacity);
            if let Some((u, p)) = o.credentials {
                m.set_credentials(u, p);
            }
            if let Some(t) = o.transport {
                m.set_transport(t);
            }
            let (client, eventloop) = rumqttc::v5::AsyncClient::new(m, o.request_capacity);
            let mut s = Session::V5 {
                eventloop,
                qos2: o.qos2,
            };
            s.expect_any_pubrel();
            (Client::V5(client), s)
        } else {
            let mut m = rumqttc::MqttOptions::new(o.client_id, o.host, o.port);
            m.set_keep_alive(o.keepalive)
                // The session (and the broker's queue of unacked messages) must
                // outlive this process: that is what makes a crash lose nothing.
                .set_clean_session(false)
                .set_manual_acks(true)
                .set_max_packet_size(o.max_packet, o.max_packet)
                .set_request_channel_capacity(o.request_capacity);
            if let Some((u, p)) = o.credentials {
                m.set_credentials(u, p);
            }
            if let Some(t) = o.transport {
                m.set_transport(t);
            }
            let (client, eventloop) = rumqttc::AsyncClient::new(m, o.request_capacity);
            let mut s = Session::V4 {
                eventloop,
                qos2: o.qos2,
            };
            s.expect_any_pubrel();
            (Client::V4(client), s)
        }
    }

    /// After rumqttc forgot its QoS 2 state: mark every packet id, so that a
    /// PUBREL for any of them is answered with PUBCOMP (see the module
    /// docs). The placeholder events this makes are dropped at once.
    fn expect_any_pubrel(&mut self) {
        match self {
            Session::V4 { eventloop, qos2 } if *qos2 => {
                let before = eventloop.state.events.len();
                for pkid in 1..=u16::MAX {
                    let mut p =
                        rumqttc::Publish::new(REPAIR_TOPIC, rumqttc::QoS::ExactlyOnce, Vec::new());
                    p.pkid = pkid;
                    let _ = eventloop
                        .state
                        .handle_incoming_packet(rumqttc::Packet::Publish(p));
                }
                eventloop.state.events.truncate(before);
            }
            Session::V5 { eventloop, qos2 } if *qos2 => {
                let before = eventloop.state.events.len();
                for pkid in 1..=u16::MAX {
                    let mut p = rumqttc::v5::mqttbytes::v5::Publish::new(
                        REPAIR_TOPIC,
                        rumqttc::v5::mqttbytes::QoS::ExactlyOnce,
                        Vec::new(),
                        None,
                    );
                    p.pkid = pkid;
                    let _ = eventloop
                        .state
                        .handle_incoming_packet(rumqttc::v5::mqttbytes::v5::Packet::Publish(p));
                }
                eventloop.state.events.truncate(before);
            }
            _ => {}
        }
    }

    /// Forgets the connection and every ack rumqttc still queues for it
    /// (`EventLoop::clean`), then marks packet ids for PUBRELs again.
    fn reset(&mut self) {
        match self {
            Session::V4 { eventloop, .. } => eventloop.clean(),
            Session::V5 { eventloop, .. } => eventloop.clean(),
        }
        self.expect_any_pubrel();
    }

    /// The next event; `Err` with an operator-readable reason when the
    /// connection failed (rumqttc has then reset its state; the port's
    /// `clean` comes before the next poll).
    async fn next_event(&mut self) -> Result<Event, SessionError> {
        match self {
            Session::V4 { eventloop, .. } => {
                use rumqttc::{Event as E, Packet};
                match eventloop.poll().await {
                    Ok(E::Incoming(Packet::ConnAck(a))) => Ok(Event::Connected {
                        session_present: a.session_present,
                    }),
                    Ok(E::Incoming(Packet::SubAck(a))) => Ok(Event::Subscribed {
                        refused: a
                            .return_codes
                            .iter()
                            .enumerate()
                            .filter(|(_, c)| matches!(c, rumqttc::SubscribeReasonCode::Failure))
                            .map(|(i, _)| (i, "refused".to_string()))
                            .collect(),
                    }),
                    Ok(E::Incoming(Packet::Publish(p))) if p.topic != REPAIR_TOPIC => {
                        Ok(Event::Message(Message {
                            topic: p.topic,
                            payload: p.payload.to_vec(),
                            qos: p.qos as u8,
                            retain: p.retain,
                            pkid: p.pkid,
                            properties: None,
                        }))
                    }
                    Ok(_) => Ok(Event::Other),
                    Err(e) => {
                        use rumqttc::ConnectionError as C;
                        let (host, port) = eventloop.mqtt_options.broker_address();
                        Err(match e {
                            C::Io(io) => classify_io(io, &host, port).await,
                            C::NetworkTimeout | C::FlushTimeout => SessionError::Timeout,
                            C::Tls(t) => SessionError::Tls {
                                detail: t.to_string(),
                            },
                            C::ConnectionRefused(code) => SessionError::RefusedByBroker {
                                code: format!("{code:?}"),
                            },
                            other => SessionError::Lost {
                                detail: other.to_string(),
                            },
                        })
                    }
                }
            }
            Session::V5 { eventloop, .. } => {
                use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, Packet};
                use rumqttc::v5::Event as E;
                match eventloop.poll().await {
                    Ok(E::Incoming(Packet::ConnAck(a))) => {
                        if a.code != ConnectReturnCode::Success {
                            return Err(SessionError::RefusedByBroker {
                                code: format!("{:?}", a.code),
                            });
                        }
                        Ok(Event::Connected {
                            session_present: a.session_present,
                        })
                    }
                    Ok(E::Incoming(Packet::SubAck(a))) => Ok(Event::Subscribed {
                        refused: a
                            .return_codes
                            .iter()
                            .enumerate()
                            .filter(|(_, c)| {
                                !matches!(
                                    c,
                                    rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(_)
                                )
                            })
                            .map(|(i, c)| (i, format!("{c:?}")))
                            .collect(),
                    }),
                    Ok(E::Incoming(Packet::Publish(p))) if p.topic != REPAIR_TOPIC => {
                        let topic = String::from_utf8_lossy(&p.topic).into_owned();
                        let properties = p.properties.map(|pp| {
                            Box::new(Properties {
                                user: pp.user_properties,
                                content_type: pp.content_type,
                                payload_format: pp.payload_format_indicator,
                                message_expiry_secs: pp.message_expiry_interval,
                                response_topic: pp.response_topic,
                                correlation_data: pp.correlation_data.map(|b| b.to_vec()),
                            })
                        });
                        Ok(Event::Message(Message {
                            topic,
                            payload: p.payload.to_vec(),
                            qos: p.qos as u8,
                            retain: p.retain,
                            pkid: p.pkid,
                            properties: properties.filter(|p| **p != Properties::default()),
                        }))
                    }
                    Ok(_) => Ok(Event::Other),
                    Err(e) => {
                        use rumqttc::v5::ConnectionError as C;
                        let (host, port) = eventloop.options.broker_address();
                        Err(match e {
                            C::Io(io) => classify_io(io, &host, port).await,
                            C::Timeout(_) => SessionError::Timeout,
                            C::Tls(t) => SessionError::Tls {
                                detail: t.to_string(),
                            },
                            C::ConnectionRefused(code) => SessionError::RefusedByBroker {
                                code: format!("{code:?}"),
                            },
                            other => SessionError::Lost {
                                detail: other.to_string(),
                            },
                        })
                    }
                }
            }
        }
    }

    /// Polls until the DISCONNECT is written, or `limit` passes.
    async fn flush(&mut self, limit: Duration) {
        let _ = tokio::time::timeout(limit, async {
            loop {
                let done = match self {
                    Session::V4 { eventloop, .. } => match eventloop.poll().await {
                        Ok(rumqttc::Event::Outgoing(rumqttc::Outgoing::Disconnect)) => true,
                        Ok(_) => false,
                        Err(_) => true,
                    },
                    Session::V5 { eventloop, .. } => match eventloop.poll().await {
                        Ok(rumqttc::v5::Event::Outgoing(rumqttc::Outgoing::Disconnect)) => true,
                        Ok(_) => false,
                        Err(_) => true,
                    },
                };
                if done {
                    return;
                }
            }
        })
        .await;
    }
}

/// What an I/O failure of the connection means. The standard library has
/// no error kind for a name that does not resolve, so a failure of a kind
/// that a live connection would not give is checked by resolving the host
/// again: only on a failed connect, which then waits out a backoff anyway.
async fn classify_io(e: std::io::Error, host: &str, port: u16) -> SessionError {
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

impl UpstreamSession for Session {
    fn poll(&mut self) -> BoxFuture<'_, Result<Event, SessionError>> {
        Box::pin(self.next_event())
    }

    fn clean(&mut self) {
        self.reset()
    }

    fn flush_disconnect(&mut self, limit: Duration) -> BoxFuture<'_, ()> {
        Box::pin(self.flush(limit))
    }
}
