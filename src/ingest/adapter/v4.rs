//! The session on rumqttc's MQTT 3.1.1 client.

use std::time::Duration;

use futures::future::BoxFuture;
use rumqttc::{AsyncClient, ConnectionError, Event as E, EventLoop, MqttOptions, Packet, QoS};

use super::{classify_io, Options, REPAIR_TOPIC};
use crate::ingest::port::{
    Event, Message, QueueFull, SessionError, UpstreamClient, UpstreamSession,
};

fn qos(level: u8) -> QoS {
    match level {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

/// Sends what ingest sends upstream.
#[derive(Clone)]
pub struct Client(AsyncClient);

/// The event loop of one upstream connection.
pub struct Session {
    eventloop: EventLoop,
    qos2: bool,
}

/// A client and its session; nothing connects before the first poll.
pub fn connect(o: Options) -> (Client, Session) {
    let mut m = MqttOptions::new(o.client_id, o.host, o.port);
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
    let (client, eventloop) = AsyncClient::new(m, o.request_capacity);
    let mut s = Session {
        eventloop,
        qos2: o.qos2,
    };
    s.expect_any_pubrel();
    (Client(client), s)
}

impl UpstreamClient for Client {
    fn try_ack(&self, pkid: u16, level: u8) -> Result<(), QueueFull> {
        let mut p = rumqttc::Publish::new("", qos(level), Vec::new());
        p.pkid = pkid;
        self.0.try_ack(&p).map_err(|_| QueueFull)
    }

    fn try_subscribe(&self, filters: &[(String, u8)]) -> Result<(), QueueFull> {
        self.0
            .try_subscribe_many(
                filters
                    .iter()
                    .map(|(f, q)| rumqttc::SubscribeFilter::new(f.clone(), qos(*q))),
            )
            .map_err(|_| QueueFull)
    }

    fn try_unsubscribe(&self, filters: &[String]) -> Result<(), QueueFull> {
        for f in filters {
            self.0.try_unsubscribe(f.clone()).map_err(|_| QueueFull)?;
        }
        Ok(())
    }

    fn try_disconnect(&self) {
        // A full queue drops the DISCONNECT; the broker keeps the session
        // either way, and notices the closed connection.
        let _ = self.0.try_disconnect();
    }
}

impl Session {
    /// See the module docs of `adapter`: marks every packet id as one a
    /// PUBREL may come for.
    fn expect_any_pubrel(&mut self) {
        if !self.qos2 {
            return;
        }
        let state = &mut self.eventloop.state;
        let before = state.events.len();
        for pkid in 1..=u16::MAX {
            let mut p = rumqttc::Publish::new(REPAIR_TOPIC, QoS::ExactlyOnce, Vec::new());
            p.pkid = pkid;
            let _ = state.handle_incoming_packet(Packet::Publish(p));
        }
        state.events.truncate(before);
    }

    async fn next_event(&mut self) -> Result<Event, SessionError> {
        match self.eventloop.poll().await {
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
                let (host, port) = self.eventloop.mqtt_options.broker_address();
                Err(match e {
                    ConnectionError::Io(io) => classify_io(io, &host, port).await,
                    ConnectionError::NetworkTimeout | ConnectionError::FlushTimeout => {
                        SessionError::Timeout
                    }
                    ConnectionError::Tls(t) => SessionError::Tls {
                        detail: t.to_string(),
                    },
                    ConnectionError::ConnectionRefused(code) => SessionError::RefusedByBroker {
                        code: format!("{code:?}"),
                    },
                    other => SessionError::Lost {
                        detail: other.to_string(),
                    },
                })
            }
        }
    }

    async fn flush(&mut self, limit: Duration) {
        let _ = tokio::time::timeout(limit, async {
            loop {
                match self.eventloop.poll().await {
                    Ok(E::Outgoing(rumqttc::Outgoing::Disconnect)) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
    }
}

impl UpstreamSession for Session {
    fn poll(&mut self) -> BoxFuture<'_, Result<Event, SessionError>> {
        Box::pin(self.next_event())
    }

    fn clean(&mut self) {
        self.eventloop.clean();
        self.expect_any_pubrel();
    }

    fn flush_disconnect(&mut self, limit: Duration) -> BoxFuture<'_, ()> {
        Box::pin(self.flush(limit))
    }
}
