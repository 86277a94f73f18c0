//! One connection to a Pulsar broker for the publisher's producers, as the
//! producers call it: requests and their answers, the exclusive producers,
//! entries sent on them, and their closes at the broker. The frames are the
//! `pulsar` crate's public codec and `proto` types; dialling and the
//! handshake are `dial.rs`, the socket's two tasks `socket.rs`, and what
//! the broker's answers do to the entries in flight `receipts.rs`.
//!
//! Letting go of a producer while the broker can still be talked to closes
//! it at the broker first ([`Conn::close_producer`], [`Conn::shut`]). The
//! broker answers a close only after every entry of the producer has been
//! persisted or failed, and writes each one's receipt or error on the
//! connection before that answer; only then does it give up the topic's
//! exclusive access. A dropped connection, instead, frees exclusive access
//! at once while entries may still be on their way to the log, to land
//! after a successor has read the topic's end: twice in the topic. So a
//! connection with a close under way is never dropped while the broker is
//! alive: a close not answered within the operation timeout (a stalled
//! bookie, say) leaves the producer in doubt for its caller, but the
//! connection stays, and with it the broker's exclusive access, which
//! fences successors on every node (they are refused as busy) until the
//! broker answers. Such a connection ends when the close is answered (and
//! no other close is under way on it), when the broker has been silent for
//! [`DEAD_AFTER`](super::socket::DEAD_AFTER) and then an operation timeout more (its keepalive drops
//! ours too), or when the process stops: only then may the topic be freed
//! with writes pending, and only the adapter's check of the topic's pending
//! writes through the admin API keeps a successor from reading its end too
//! early. [`closes_settled`] keeps this process's next producer on a topic
//! until its previous one's close is settled.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use firstseen_store::lock::lock;
use pulsar::message::{Message, Payload};
use pulsar::proto::{self, base_command::Type, BaseCommand};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::super::port::SendError;
use super::dial::{self, command, Dialled};
use super::entry::Entry;
use super::receipts::{refusal, Close, Pending, ProducerSlot, Waiter};

/// Where a connection goes; declared with the dialling, named here too for
/// the publisher's adapter.
pub use super::dial::Target;

/// What the connection's callers and its reader share.
#[derive(Default)]
pub(super) struct Shared {
    /// Who waits for the answer to each request, by request id.
    pub(super) requests: HashMap<u64, oneshot::Sender<BaseCommand>>,
    /// Each producer's entries in flight and state, by producer id.
    pub(super) producers: HashMap<u64, ProducerSlot>,
    /// Why the connection ended, once it has.
    pub(super) closed: Option<String>,
}

/// A live connection; cheap to clone.
#[derive(Clone)]
pub struct Conn {
    pub(super) out: mpsc::Sender<Message>,
    pub(super) shared: Arc<Mutex<Shared>>,
    pub(super) ids: Arc<AtomicU64>,
    pub(super) closed: CancellationToken,
    pub(super) timeout: Duration,
    /// Where the connection's own tasks run, and the closes that a `Drop`
    /// cannot await.
    pub(super) tasks: tokio_util::task::TaskTracker,
}

/// Closes of producers under way in this process, by topic: the fence that
/// keeps this process's next producer on a topic from taking exclusive
/// access (and reading the topic's end) while its previous one may still
/// have entries on their way. Process-wide because each leadership term
/// dials its own connections, and the next term's producer must wait for
/// the last term's close as much as for its own.
static CLOSING: Mutex<Vec<(u64, String, CancellationToken)>> = Mutex::new(Vec::new());
static CLOSING_IDS: AtomicU64 = AtomicU64::new(0);

/// One producer's close, held in [`CLOSING`] until dropped; dropping it
/// (the close settled, or its task gone with the process) lifts the fence.
struct Closing {
    id: u64,
    close: Close,
}

impl Closing {
    fn hold(topic: &str, close: Close) -> Self {
        let id = CLOSING_IDS.fetch_add(1, Ordering::Relaxed);
        lock(&CLOSING).push((id, topic.to_string(), close.settled.clone()));
        Self { id, close }
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        self.close.heard.cancel();
        self.close.settled.cancel();
        lock(&CLOSING).retain(|(id, _, _)| *id != self.id);
    }
}

/// Waits until every close of a producer on `topic` begun in this process
/// so far has settled: answered by the broker, or its connection gone (the
/// broker silent for long). `false` when `bound` passes first: the broker
/// has not answered yet, and still holds the topic for that producer. A new producer on the topic waits for this, so that the tail it
/// reads is final as far as this process's own writes go.
pub async fn closes_settled(topic: &str, bound: Duration) -> bool {
    let waits: Vec<CancellationToken> = lock(&CLOSING)
        .iter()
        .filter(|(_, t, _)| t == topic)
        .map(|(_, _, done)| done.clone())
        .collect();
    tokio::time::timeout(bound, async {
        for done in waits {
            done.cancelled().await;
        }
    })
    .await
    .is_ok()
}

/// Why a request got no answer.
enum Unanswered {
    /// The connection ended first.
    Lost(SendError),
    /// Not within the operation timeout; the connection is still open.
    Timeout,
}

impl Conn {
    /// Dials `target`, completes the handshake, and starts the connection's
    /// tasks on `tasks`.
    pub async fn open(
        target: &Target,
        tasks: &tokio_util::task::TaskTracker,
    ) -> Result<Conn, SendError> {
        match dial::connect(target).await? {
            Dialled::Tcp(stream) => Self::start(stream, target, tasks).await,
            Dialled::Tls(stream) => Self::start(stream, target, tasks).await,
        }
    }

    /// Ends the connection for everyone still waiting on it.
    pub(super) fn close(&self, why: String) {
        self.closed.cancel();
        let mut shared = lock(&self.shared);
        if shared.closed.is_none() {
            tracing::debug!(reason = %why, "pulsar producer connection closed");
            shared.closed = Some(why.clone());
        }
        shared.requests.clear();
        for (_, slot) in shared.producers.drain() {
            for p in slot.pending {
                p.fail(|| SendError::Lost(format!("connection lost: {why}")));
            }
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends a request and waits for its answer, within the timeout. What
    /// an answer that does not come means is the caller's to decide.
    async fn ask(&self, id: u64, c: BaseCommand) -> Result<BaseCommand, Unanswered> {
        match tokio::time::timeout(self.timeout, self.request(id, c)).await {
            Ok(r) => r.map_err(Unanswered::Lost),
            Err(_) => Err(Unanswered::Timeout),
        }
    }

    /// Sends a request and waits for its answer for as long as the
    /// connection lives; the caller bounds it.
    async fn request(&self, id: u64, c: BaseCommand) -> Result<BaseCommand, SendError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut shared = lock(&self.shared);
            if let Some(why) = &shared.closed {
                return Err(SendError::Lost(format!("connection lost: {why}")));
            }
            shared.requests.insert(id, tx);
        }
        // Forgets the request however this ends, its future dropped too.
        struct Forget<'a>(&'a Conn, u64);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                lock(&self.0.shared).requests.remove(&self.1);
            }
        }
        let _forget = Forget(self, id);
        self.out
            .send(Message {
                command: c,
                payload: None,
            })
            .await
            .map_err(|_| SendError::Lost("connection lost".into()))?;
        rx.await
            .map_err(|_| SendError::Lost("connection lost before the answer".into()))
    }

    /// Creates a producer on `topic` named `name` with exclusive access.
    /// Refused with [`SendError::HeldElsewhere`] while another holds it.
    pub async fn producer(&self, topic: &str, name: &str) -> Result<u64, SendError> {
        let producer = self.next_id();
        let request = self.next_id();
        lock(&self.shared).producers.insert(
            producer,
            ProducerSlot {
                topic: topic.to_string(),
                ..Default::default()
            },
        );
        let c = command(Type::Producer, |c| {
            c.producer = Some(proto::CommandProducer {
                topic: topic.to_string(),
                producer_id: producer,
                request_id: request,
                producer_name: Some(name.to_string()),
                user_provided_producer_name: Some(true),
                producer_access_mode: Some(proto::ProducerAccessMode::Exclusive as i32),
                ..Default::default()
            })
        });
        let answer = self.ask(request, c).await;
        let result = match answer {
            Ok(a) if a.producer_success.is_some() => return Ok(producer),
            Ok(a) => Err(match a.error {
                Some(e) => refusal(e.error, &e.message),
                None => {
                    SendError::Lost("the broker answered the producer with something else".into())
                }
            }),
            Err(Unanswered::Lost(e)) => Err(e),
            Err(Unanswered::Timeout) => {
                // The broker may yet create it, and with it take the
                // topic: it is closed like any other, which also tells
                // whether the broker still answers on this connection.
                self.close_producer(producer, "its creation was not answered in time");
                return Err(SendError::Lost(format!(
                    "no answer from the broker within {:?}",
                    self.timeout
                )));
            }
        };
        lock(&self.shared).producers.remove(&producer);
        result
    }

    /// Closes `producer` at the broker and hears out its entries still in
    /// flight. The broker answers the close only after each of those
    /// entries has been persisted or failed, with every receipt and error
    /// written on the connection before the answer, and only then lets
    /// another producer take the topic: so each entry's waiters learn what
    /// became of it. An entry the broker did not answer before its answer
    /// to the close fails as lost.
    ///
    /// A close not answered within the operation timeout (or refused)
    /// cancels [`Close::heard`]: the caller moves on with what it has
    /// heard, its entries still unanswered in doubt. The connection is
    /// kept, though, and the close stays under way: dropping the connection
    /// now, with the broker still holding writes of the producer (a stalled
    /// bookie is the usual reason a close goes unanswered), would free the
    /// topic with those writes still to land. Kept, the broker holds the
    /// topic for the producer until they have settled (successors are
    /// refused as busy), and receipts it writes meanwhile still reach
    /// their waiters, if they still wait. [`Close::settled`] follows once
    /// the broker answers, or once the connection ends (the broker silent
    /// for long, [`Conn::read`]); a refused close is asked again. Process
    /// stop drops everything, and then only the adapter's check of the
    /// topic's pending writes protects a successor.
    ///
    /// No new entry goes on the producer once this is called. A second
    /// call returns the first one's [`Close`]. Runs on the connection's
    /// task tracker, so that a `Drop` may start it; [`closes_settled`]
    /// holds this process's next producer on the same topic until it has
    /// settled.
    pub fn close_producer(&self, producer: u64, why: &str) -> Close {
        let close = Close::new();
        let (topic, pending) = {
            let mut shared = lock(&self.shared);
            let Some(slot) = shared.producers.get_mut(&producer) else {
                // Never made, or already closed: nothing waits on it.
                return Close::done();
            };
            if let Some(closing) = &slot.closing {
                return closing.clone();
            }
            slot.closing = Some(close.clone());
            if slot.gone.is_none() {
                slot.gone = Some(SendError::Lost(format!("the producer was closed: {why}")));
            }
            (slot.topic.clone(), slot.pending.len())
        };
        if pending > 0 {
            tracing::warn!(
                topic,
                producer,
                pending,
                reason = why,
                "closing the producer at the broker with entries in flight; hearing them out"
            );
        } else {
            tracing::debug!(
                topic,
                producer,
                reason = why,
                "closing the producer at the broker"
            );
        }
        let fence = Closing::hold(&topic, close.clone());
        let me = self.clone();
        let why = why.to_string();
        self.spawn(async move {
            me.close_at_broker(producer, &topic, &why, &fence.close)
                .await;
            drop(fence);
        });
        close
    }

    /// Sends `CloseProducer` for `producer` until the broker accepts it,
    /// and settles what it had in flight by the answer
    /// ([`Conn::close_producer`]). Returns once the close has settled: the
    /// broker answered it, or the connection is gone.
    async fn close_at_broker(&self, producer: u64, topic: &str, why: &str, close: &Close) {
        loop {
            let request = self.next_id();
            let c = command(Type::CloseProducer, |c| {
                c.close_producer = Some(proto::CommandCloseProducer {
                    producer_id: producer,
                    request_id: request,
                })
            });
            let answer = self.request(request, c);
            tokio::pin!(answer);
            let answer = match tokio::time::timeout(self.timeout, &mut answer).await {
                Ok(a) => a,
                Err(_) => {
                    tracing::warn!(
                        topic,
                        producer,
                        reason = why,
                        timeout = ?self.timeout,
                        "the broker has not answered closing the producer; its entries still unanswered are in doubt, and the connection stays (the broker holds the topic until they settle) until it answers"
                    );
                    close.heard.cancel();
                    answer.await
                }
            };
            let refused = match answer {
                Ok(a) => a.error,
                // The connection ended: closing it here too fails what
                // waited on it before the close counts as settled (the
                // writer may have gone before the reader noticed).
                Err(e) => {
                    self.close(format!("while closing producer {producer}: {e}"));
                    return;
                }
            };
            let Some(e) = refused else {
                // Every receipt and error the broker wrote before its
                // answer has been read and settled: frames are handled in
                // order, and this answer was the last of them.
                let slot = lock(&self.shared).producers.remove(&producer);
                for p in slot.into_iter().flat_map(|s| s.pending) {
                    p.fail(|| {
                        SendError::Lost(
                            "the broker closed the producer without answering this entry".into(),
                        )
                    });
                }
                return;
            };
            // The producer may still be open at the broker, with writes:
            // as an unanswered close, the caller moves on and the
            // connection and the fence stay; the close is asked again (a
            // producer the broker no longer has, it reports closed).
            tracing::warn!(
                topic,
                producer,
                error = ?proto::ServerError::try_from(e.error).unwrap_or(proto::ServerError::UnknownError),
                message = %e.message,
                "the broker refused to close the producer; asking again"
            );
            close.heard.cancel();
            tokio::select! {
                _ = tokio::time::sleep(self.timeout) => {}
                _ = self.closed.cancelled() => {
                    self.close(format!("while closing producer {producer}: connection closed"));
                    return;
                }
            }
        }
    }

    /// Closes every producer on the connection at the broker, as
    /// [`Conn::close_producer`] does, and then the connection, once every
    /// close has settled: at the end of a term, and when the broker has
    /// been silent for long. A close the broker does not answer keeps the
    /// connection (in the background, the term over) until it does, or
    /// until the broker has been silent for long ([`Conn::read`]), or the
    /// process stops.
    pub fn shut(&self, why: String) {
        let producers: Vec<u64> = lock(&self.shared).producers.keys().copied().collect();
        let closes: Vec<Close> = producers
            .into_iter()
            .map(|p| self.close_producer(p, &why))
            .collect();
        let me = self.clone();
        self.spawn(async move {
            for close in closes {
                close.settled.cancelled().await;
            }
            me.close(why);
        });
    }

    /// Runs `task` on the connection's tracker; outside a runtime (a
    /// `Drop` while the process ends) there is nothing to await with, and
    /// the connection is closed at once: the one case where a connection
    /// goes with a close unanswered (see [`Conn::close_producer`]).
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        if tokio::runtime::Handle::try_current().is_ok() {
            self.tasks.spawn(task);
        } else {
            self.close("closed outside a runtime".into());
        }
    }

    /// Sends `entry` on `producer`; `waiters` learn its fate, each within
    /// the timeout of being sent.
    pub async fn send(
        &self,
        producer: u64,
        entry: Entry,
        waiters: Vec<Waiter>,
    ) -> Result<(), SendError> {
        // A place in the writer's queue first, then the frame is queued
        // under the same lock that [`Conn::close_producer`] marks the
        // producer closing under: no entry can go after the close, which
        // the broker would answer by dropping the connection or refusing.
        // Bounded: a broker that stopped reading fills the queue, and the
        // publisher must hear of it, not wait for ever. The entry was not
        // queued, so it never goes.
        let permit = match tokio::time::timeout(self.timeout, self.out.reserve()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(SendError::Lost("connection lost".into())),
            Err(_) => {
                return Err(SendError::Lost(format!(
                    "the connection's write queue stayed full for {:?} (the broker is not reading)",
                    self.timeout
                )))
            }
        };
        let c = command(Type::Send, |c| {
            c.send = Some(proto::CommandSend {
                producer_id: producer,
                sequence_id: entry.first,
                num_messages: Some(entry.count as i32),
                highest_sequence_id: Some(entry.last),
                ..Default::default()
            })
        });
        let mut shared = lock(&self.shared);
        if let Some(why) = &shared.closed {
            return Err(SendError::Lost(format!("connection lost: {why}")));
        }
        let Some(slot) = shared.producers.get_mut(&producer) else {
            return Err(SendError::Lost("the producer was closed".into()));
        };
        if let Some(why) = &slot.gone {
            return Err(why.clone());
        }
        slot.pending.push_back(Pending {
            first: entry.first,
            last: entry.last,
            messages: entry.count,
            waiters,
            overtaken: false,
        });
        permit.send(Message {
            command: c,
            payload: Some(Payload {
                metadata: entry.metadata,
                data: entry.data,
            }),
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::{connected, entry, producer_on};
    use super::super::receipts::Failure;
    use super::*;

    /// Closing a producer with entries in flight: nothing goes on it after
    /// the close, the topic stays fenced for this process until the broker
    /// answers, and each entry gets the broker's own answer (which Pulsar
    /// writes before it answers the close): the first landed, the second
    /// was refused. The connection stays. Before, the entries failed as
    /// lost at once and the close was not awaited, or (at a term's end or a
    /// receipt timeout) the connection was dropped under them.
    #[tokio::test]
    async fn a_closed_producer_hears_its_entries_out_before_the_topic_is_free() {
        let topic = "persistent://public/default/close-hears-out";
        let (conn, mut broker) = connected(Duration::from_secs(30)).await;
        let id = producer_on(&conn, &mut broker, topic).await;
        let (w1, mut r1) = oneshot::channel();
        let (w2, mut r2) = oneshot::channel();
        conn.send(id, entry(1, 2), vec![w1]).await.unwrap();
        conn.send(id, entry(3, 4), vec![w2]).await.unwrap();
        for first in [1, 3] {
            assert_eq!(broker.next().await.send.unwrap().sequence_id, first);
        }
        let done = conn.close_producer(id, "test");
        assert!(conn.send(id, entry(5, 5), Vec::new()).await.is_err());
        assert!(
            !closes_settled(topic, Duration::ZERO).await,
            "the topic is fenced while the close is under way"
        );
        let close = broker
            .next()
            .await
            .close_producer
            .expect("CLOSE_PRODUCER next");
        assert_eq!(close.producer_id, id);
        assert!(r1.try_recv().is_err() && r2.try_recv().is_err());
        broker.receipt(id, 1, 2).await;
        broker.refuse(id, 4).await;
        broker.success(close.request_id).await;
        tokio::time::timeout(Duration::from_secs(10), done.settled.cancelled())
            .await
            .expect("the close settles once answered");
        assert!(matches!(r1.try_recv(), Ok(Ok(()))));
        assert!(matches!(
            r2.try_recv(),
            Ok(Err(Failure::Refused { messages: 2, .. }))
        ));
        assert!(!conn.is_closed(), "an answered close keeps the connection");
        assert!(closes_settled(topic, Duration::ZERO).await);
    }

    /// A close the broker does not answer within the operation timeout
    /// (a stalled bookie): the caller hears at the timeout that the close
    /// is in doubt, but the connection stays, and with it the broker's
    /// exclusive access and this process's fence, for as long as the
    /// broker is alive; a receipt the broker writes meanwhile still
    /// reaches its waiter; the late answer then settles the close. Before,
    /// the connection was dropped at the timeout, which frees the topic at
    /// the broker with the producer's writes still pending, and the fence
    /// lifted with it: the next producer read a tail those writes then
    /// landed behind.
    #[tokio::test(start_paused = true)]
    async fn an_unanswered_close_keeps_the_connection_and_the_fence_until_it_is_answered() {
        let topic = "persistent://public/default/close-unanswered";
        let timeout = Duration::from_secs(3);
        let (conn, mut broker) = connected(timeout).await;
        let id = producer_on(&conn, &mut broker, topic).await;
        let (w1, mut r1) = oneshot::channel();
        let (w2, mut r2) = oneshot::channel();
        conn.send(id, entry(1, 1), vec![w1]).await.unwrap();
        conn.send(id, entry(2, 3), vec![w2]).await.unwrap();
        for first in [1, 2] {
            assert_eq!(broker.next().await.send.unwrap().sequence_id, first);
        }
        let started = tokio::time::Instant::now();
        let close = conn.close_producer(id, "test");
        let request = broker.next().await.close_producer.expect("CLOSE_PRODUCER");
        close.heard.cancelled().await;
        assert!(
            started.elapsed() >= timeout,
            "in doubt only after the timeout"
        );
        // Long past the timeout, the broker alive (it pings), the close
        // still unanswered.
        for _ in 0..4 {
            tokio::time::sleep(timeout * 2).await;
            broker.ping().await;
        }
        assert!(
            !conn.is_closed(),
            "the connection stays while the close is unanswered"
        );
        assert!(!close.settled.is_cancelled());
        assert!(
            !closes_settled(topic, Duration::ZERO).await,
            "the topic stays fenced while the broker may hold the producer's writes"
        );
        assert!(r1.try_recv().is_err() && r2.try_recv().is_err());
        broker.receipt(id, 1, 1).await;
        broker.success(request.request_id).await;
        tokio::time::timeout(timeout, close.settled.cancelled())
            .await
            .expect("the late answer settles the close");
        assert!(
            matches!(r1.try_recv(), Ok(Ok(()))),
            "the late receipt reached its waiter"
        );
        assert!(matches!(r2.try_recv(), Ok(Err(Failure::Lost(_)))));
        assert!(closes_settled(topic, Duration::ZERO).await);
        assert!(!conn.is_closed());
    }

    /// A close the broker answers with an error: the producer may still be
    /// open there, with writes. As an unanswered close, the caller moves
    /// on, but the connection and the fence stay, and the close is asked
    /// again until the broker accepts it. Before, the error counted as a
    /// settled close: the fence lifted with the producer still open.
    #[tokio::test(start_paused = true)]
    async fn a_refused_close_keeps_the_fence_and_is_asked_again() {
        let topic = "persistent://public/default/close-refused";
        let timeout = Duration::from_secs(3);
        let (conn, mut broker) = connected(timeout).await;
        let id = producer_on(&conn, &mut broker, topic).await;
        let (w1, mut r1) = oneshot::channel();
        conn.send(id, entry(1, 2), vec![w1]).await.unwrap();
        assert!(broker.next().await.send.is_some());
        let close = conn.close_producer(id, "test");
        let first = broker.next().await.close_producer.expect("CLOSE_PRODUCER");
        broker.error(first.request_id).await;
        close.heard.cancelled().await;
        assert!(!close.settled.is_cancelled());
        assert!(
            !closes_settled(topic, Duration::ZERO).await,
            "a refused close keeps the topic fenced"
        );
        let again = broker
            .next()
            .await
            .close_producer
            .expect("the close asked again");
        assert_eq!(again.producer_id, id);
        assert!(!conn.is_closed());
        broker.receipt(id, 1, 2).await;
        broker.success(again.request_id).await;
        tokio::time::timeout(timeout, close.settled.cancelled())
            .await
            .expect("settled once accepted");
        assert!(matches!(r1.try_recv(), Ok(Ok(()))));
        assert!(closes_settled(topic, Duration::ZERO).await);
    }

    /// The end of a term ([`Conn::shut`]): every producer is closed at the
    /// broker and heard out, and only then does the connection go.
    #[tokio::test]
    async fn shutting_a_connection_closes_its_producers_first() {
        let topic = "persistent://public/default/shut-closes-first";
        let (conn, mut broker) = connected(Duration::from_secs(30)).await;
        let id = producer_on(&conn, &mut broker, topic).await;
        let (w1, mut r1) = oneshot::channel();
        conn.send(id, entry(1, 3), vec![w1]).await.unwrap();
        assert!(broker.next().await.send.is_some());
        conn.shut("the term ended".into());
        let close = broker.next().await.close_producer.expect("CLOSE_PRODUCER");
        assert!(!conn.is_closed(), "the connection waits for the close");
        broker.receipt(id, 1, 3).await;
        broker.success(close.request_id).await;
        tokio::time::timeout(Duration::from_secs(10), conn.closed.cancelled())
            .await
            .expect("the connection goes after the close");
        assert!(matches!(r1.try_recv(), Ok(Ok(()))));
    }
}
