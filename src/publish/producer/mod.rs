//! The publisher's own Pulsar producer: messages go in batched entries,
//! several entries in flight per topic.
//!
//! Why our own: the `pulsar` crate (6.9) sends either one entry per message
//! or, batching, one entry at a time, awaiting each receipt before the next
//! entry leaves, and the types that would let us do otherwise are private
//! to it. Batched entries cost the broker and the bookie one write, one
//! receipt and one index slot per entry instead of per message; several in
//! flight keep a round trip out of every message's latency. That is what
//! the Java and Go clients do, and what Benthos gets from the Go client.
//!
//! What is ours is the send path only, one idea per file, the protocol's
//! state apart from its I/O as rumqtt keeps them:
//! - `dial.rs`: the URL, TCP and TLS, and the handshake with the same
//!   credentials as the crate's (`auth.rs`'s providers);
//! - [`conn`]: the connection as the producers call it: requests, the
//!   exclusive producers, sends, and closes at the broker;
//! - `socket.rs`: the two tasks that own the socket (writer, reader);
//! - `receipts.rs`: the entries in flight and how the broker's answers
//!   settle them, and what a refusal means (no I/O, tested without a
//!   socket);
//! - [`entry`]: the batched entries themselves.
//!
//! The frames are the crate's public codec and `proto` types; the topic
//! lookup is the crate's client; the tail read and `verify` read with the
//! crate's consumer, which splits batched entries by batch index.
//!
//! Ordering and receipts keep the publisher's contract (`port.rs`): a
//! producer's entries are persisted in the order they are sent, so a
//! message's receipt comes only after every message queued before it. A
//! message's receipt is its entry's.

pub mod conn;
mod dial;
pub mod entry;
#[cfg(test)]
mod fake;
mod receipts;
mod socket;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::port::{Receipt, SendError};
use conn::{Conn, Target};
use entry::{Open, Outgoing};
use receipts::{Failure, Waiter};

/// Bytes kept free in an entry for its own metadata and the frame around
/// it, below the broker's message limit.
const ENTRY_OVERHEAD: usize = 4 * 1024;

/// The producers' connections of one leadership term, one per broker.
pub struct Producers {
    /// How to reach a broker, but for its URL.
    base: Target,
    conns: Mutex<HashMap<String, Conn>>,
    tasks: tokio_util::task::TaskTracker,
}

impl Drop for Producers {
    /// The term's end: each connection closes its producers at the broker,
    /// hearing out their entries, and then itself ([`Conn::shut`]), in the
    /// background; the next term's producer on a topic waits for it
    /// ([`conn::closes_settled`]). A connection whose close the broker does
    /// not answer stays open after the term, so that the broker keeps the
    /// topic while that producer's writes are pending, until the broker
    /// answers, goes silent for long, or the process stops.
    fn drop(&mut self) {
        for conn in self
            .conns
            .get_mut()
            .map(|c| c.values())
            .into_iter()
            .flatten()
        {
            conn.shut("the term ended".into());
        }
    }
}

impl Producers {
    /// `base` has everything but the URL: credentials, TLS, the timeout.
    pub fn new(base: Target) -> Self {
        Self {
            base,
            conns: Mutex::new(HashMap::new()),
            tasks: tokio_util::task::TaskTracker::new(),
        }
    }

    /// A live connection to `url` (through the proxy `proxy_to` names),
    /// dialled when there is none.
    async fn conn(&self, url: &str, proxy_to: Option<String>) -> Result<Conn, SendError> {
        let key = format!("{url} {}", proxy_to.as_deref().unwrap_or(""));
        if let Some(c) = lock(&self.conns).get(&key).filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let target = Target {
            url: url.to_string(),
            proxy_to,
            ..self.base.clone()
        };
        let conn = Conn::open(&target, &self.tasks).await?;
        lock(&self.conns).insert(key, conn.clone());
        Ok(conn)
    }

    /// An exclusive producer on `topic` named `name`, at the broker at
    /// `url`, entries at most `max_bytes` (the broker's limit for the
    /// topic).
    pub async fn exclusive(
        &self,
        url: &str,
        proxy_to: Option<String>,
        topic: &str,
        name: &str,
        max_bytes: usize,
    ) -> Result<Producer, SendError> {
        // This process's previous producer on the topic may still be
        // closing, with entries the broker has not persisted yet: exclusive
        // access taken now would let this producer read a tail that those
        // entries then land behind, and send them again. A close the broker
        // has not answered stays under way (its connection kept, the broker
        // holding the topic) for as long as the broker is alive and holds
        // the producer's writes: the topic is held, by this process's
        // earlier producer, and tried again soon.
        if !conn::closes_settled(topic, self.base.timeout).await {
            return Err(SendError::HeldElsewhere(format!(
                "an earlier producer of this node on {topic} is still being closed (the broker has not answered the close)"
            )));
        }
        let conn = self.conn(url, proxy_to).await?;
        let id = conn.producer(topic, name).await?;
        Ok(Producer {
            conn,
            id,
            name: name.to_string(),
            topic: topic.to_string(),
            open: Open::default(),
            waiters: Vec::new(),
            max_bytes: max_bytes
                .saturating_sub(ENTRY_OVERHEAD)
                .clamp(1, entry::MAX_BYTES),
            wait: self.base.timeout,
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An exclusive producer on one topic. Dropping it closes it at the
/// broker, releasing the topic once the broker has answered every entry in
/// flight ([`Conn::close_producer`]).
pub struct Producer {
    conn: Conn,
    id: u64,
    name: String,
    topic: String,
    open: Open,
    /// The receipts of the messages in `open`.
    waiters: Vec<Waiter>,
    max_bytes: usize,
    /// How long a receipt may take once its message was queued.
    wait: Duration,
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.conn.close_producer(self.id, "let go by the publisher");
    }
}

impl Producer {
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Queues `m` in the open entry, sending that entry first when `m`
    /// does not fit, or when it goes `alone` (the publisher's policy says
    /// when). Its receipt resolves once its entry is persisted, or fails
    /// once it cannot be.
    pub async fn push(&mut self, m: Outgoing, alone: bool) -> Result<Receipt, SendError> {
        if !self.open.is_empty() && (alone || !self.open.fits(&m, self.max_bytes)) {
            self.flush().await?;
        }
        let (tx, mut rx) = oneshot::channel();
        self.open.push(m);
        self.waiters.push(tx);
        let deadline = Instant::now() + self.wait;
        let conn = self.conn.clone();
        let id = self.id;
        let wait = self.wait;
        Ok(Box::pin(async move {
            let answer = match tokio::time::timeout_at(deadline, &mut rx).await {
                Ok(answer) => answer.ok(),
                Err(_) => {
                    // Closing the producer at the broker settles every
                    // entry on it, this one too: the broker answers each
                    // before it answers the close, so this learns whether
                    // the entry landed or was refused. A close not
                    // answered in time leaves the entry in doubt (lost,
                    // or refused if a later one overtook it), and the
                    // connection open, so that the broker keeps the topic
                    // until the entry has settled. Dropping the
                    // connection, as before, freed the topic with the
                    // entry possibly still on its way to the log.
                    conn.close_producer(id, &format!("no receipt within {wait:?}"))
                        .heard
                        .cancelled()
                        .await;
                    rx.try_recv().ok()
                }
            };
            match answer {
                Some(Ok(())) => Ok(()),
                Some(Err(Failure::Lost(e))) => Err(e),
                Some(Err(Failure::Refused { messages: 1, why })) => Err(SendError::Refused(why)),
                // Which of its messages the broker meant, it does not say;
                // what follows from that is the policy's
                // (`policy::Refusals::one_per_entry`).
                Some(Err(Failure::Refused { messages, why })) => Err(SendError::RefusedEntry {
                    messages: messages as u64,
                    why,
                }),
                None => Err(SendError::Lost(format!(
                    "no receipt from the broker within {wait:?}"
                ))),
            }
        }))
    }

    /// Sends the open entry, if any.
    pub async fn flush(&mut self) -> Result<(), SendError> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let Some(entry) = self.open.close(&self.name, now_ms) else {
            return Ok(());
        };
        let waiters = std::mem::take(&mut self.waiters);
        self.conn.send(self.id, entry, waiters).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(seq: u64) -> Outgoing {
        Outgoing {
            seq,
            key: format!("{seq:064x}"),
            ..Default::default()
        }
    }

    /// A receipt that does not come within the operation timeout: the
    /// producer is closed at the broker (not the connection dropped), the
    /// broker's receipt written before its answer to the close settles the
    /// message as landed (not lost), and this process's next producer on
    /// the topic is not requested before that answer. Before, the timeout
    /// dropped the connection, which frees the topic at the broker while
    /// the entry may still be on its way to the log, and the message
    /// counted as lost.
    #[tokio::test]
    async fn a_late_receipt_is_heard_through_the_close_and_the_next_producer_waits_for_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("pulsar://{}", listener.local_addr().unwrap());
        let topic = "persistent://public/default/late-receipt";
        let producers = Producers::new(Target {
            url: String::new(),
            proxy_to: None,
            tls: None,
            auth: None,
            timeout: Duration::from_millis(300),
        });
        let (first, mut broker) = tokio::join!(
            producers.exclusive(&url, None, topic, "p1", 1 << 20),
            async {
                let (tcp, _) = listener.accept().await.unwrap();
                let mut b = fake::Broker::accept(tcp).await;
                b.grant_producer().await;
                b
            }
        );
        let mut first = first.expect("granted");
        let id = first.id;
        let receipt = first.push(message(1), false).await.unwrap();
        first.flush().await.unwrap();
        assert_eq!(broker.next().await.send.unwrap().sequence_id, 1);
        let (closing, closed) = oneshot::channel();
        let (outcome, second, ()) = tokio::join!(
            receipt,
            async {
                closed.await.unwrap();
                producers.exclusive(&url, None, topic, "p2", 1 << 20).await
            },
            async {
                let close = broker
                    .next()
                    .await
                    .close_producer
                    .expect("the producer closed, not the connection dropped");
                assert_eq!(close.producer_id, id);
                closing.send(()).unwrap();
                assert!(
                    broker
                        .next_within(Duration::from_millis(150))
                        .await
                        .is_none(),
                    "the next producer waits for the close's answer"
                );
                broker.receipt(id, 1, 1).await;
                broker.success(close.request_id).await;
                broker.grant_producer().await;
            }
        );
        assert!(outcome.is_ok(), "landed, as the broker said: {outcome:?}");
        assert!(second.is_ok());
    }
}
