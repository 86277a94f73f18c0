//! The socket loop of a producer connection: two tasks own the socket, a
//! writer that sends what it is given, and a reader that answers the
//! broker's pings and credentials challenges, notices a silent broker, and
//! hands every other frame to whoever waits for it (a request by its id, a
//! receipt by its producer, settled by
//! [`ProducerSlot::settle`](super::receipts::ProducerSlot::settle)). When
//! either ends, the connection is closed for everyone ([`Conn::close`]).
//!
//! Apart from the handle the publisher calls (`conn.rs`) and from the
//! protocol state (`receipts.rs`), as rumqtt keeps its event loop's I/O
//! apart from its state: this file is the only one that reads or writes
//! the socket after the handshake (`dial.rs`).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use firstseen_store::lock::lock;
use futures::{SinkExt, StreamExt};
use pulsar::message::{Codec, Message};
use pulsar::proto::{base_command::Type, BaseCommand};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use super::super::port::SendError;
use super::conn::{Conn, Shared};
use super::dial::{answer_challenge, command, handshake, Auth, Target};
use super::receipts::{Answer, OutOfOrder};

/// How often this side pings a quiet connection, and how long without any
/// frame from the broker before the connection counts as dead. The broker
/// pings too (every 30 s by default), so a live connection is never quiet
/// that long.
pub(super) const PING_EVERY: Duration = Duration::from_secs(15);
pub(super) const DEAD_AFTER: Duration = Duration::from_secs(45);

/// Frames queued for the writer before a sender waits.
pub(super) const WRITE_QUEUE: usize = 1024;

impl Conn {
    /// Completes the handshake on `stream` and starts the connection's
    /// tasks on `tasks`.
    pub(super) async fn start<S>(
        stream: S,
        target: &Target,
        tasks: &tokio_util::task::TaskTracker,
    ) -> Result<Conn, SendError>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (mut reader, mut writer) = handshake(stream, target).await?;

        let (out, mut queue) = mpsc::channel::<Message>(WRITE_QUEUE);
        let conn = Conn {
            out,
            shared: Arc::new(Mutex::new(Shared::default())),
            ids: Arc::new(AtomicU64::new(1)),
            closed: CancellationToken::new(),
            timeout: target.timeout,
            tasks: tasks.clone(),
        };
        let closed = conn.closed.clone();
        tasks.spawn(async move {
            // Once the connection is closed nothing more goes out, not even
            // a frame already taken from the queue or half written (its
            // waiters have been told it is lost; a broker that stopped
            // reading would otherwise get it later, and keep the socket
            // open while this task waits to write): `closed` comes first,
            // and interrupts a write. The write half is dropped, not shut
            // down gracefully, which would wait for the broker to read.
            loop {
                let message = tokio::select! {
                    biased;
                    _ = closed.cancelled() => break,
                    m = queue.recv() => match m { Some(m) => m, None => break },
                };
                // The kind of frame only: a CONNECT or AUTH_RESPONSE carries
                // credentials, which never go into a log.
                tracing::trace!(command = ?kind(&message.command), "to the broker");
                let wrote = tokio::select! {
                    biased;
                    _ = closed.cancelled() => break,
                    w = writer.send(message) => w,
                };
                if wrote.is_err() {
                    break;
                }
            }
            closed.cancel();
            drop(writer);
        });
        let me = conn.clone();
        let auth = target.auth.clone();
        tasks.spawn(async move {
            let why = me.read(&mut reader, auth).await;
            me.close(why);
        });
        Ok(conn)
    }

    /// Reads until the connection ends; returns why it did.
    async fn read<R>(&self, reader: &mut FramedRead<R, Codec>, auth: Option<Auth>) -> String
    where
        R: AsyncRead + Unpin,
    {
        let mut ping = tokio::time::interval(PING_EVERY);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut heard = tokio::time::Instant::now();
        let mut shutting = false;
        loop {
            let frame = tokio::select! {
                f = reader.next() => f,
                _ = ping.tick() => {
                    let quiet = heard.elapsed();
                    if quiet >= DEAD_AFTER + self.timeout {
                        // Not even the closes below were answered: the
                        // broker is gone, or cut off (its own keepalive
                        // has dropped this connection at its end too).
                        return format!("nothing from the broker for {quiet:?}");
                    }
                    if quiet >= DEAD_AFTER && !shutting {
                        // The broker may only be slow to answer: its
                        // producers are closed first, and their entries
                        // heard out, while this keeps reading; the
                        // connection goes once they are, or once the
                        // broker has been silent an operation timeout
                        // more.
                        shutting = true;
                        self.shut(format!("nothing from the broker for {DEAD_AFTER:?}"));
                    }
                    let _ = self.out.try_send(Message {
                        command: command(Type::Ping, |c| c.ping = Some(Default::default())),
                        payload: None,
                    });
                    continue;
                }
                _ = self.closed.cancelled() => return "closed".into(),
            };
            let c = match frame {
                Some(Ok(m)) => m.command,
                Some(Err(e)) => return format!("a frame from the broker: {e}"),
                None => return "the broker closed the connection".into(),
            };
            heard = tokio::time::Instant::now();
            tracing::trace!(command = ?kind(&c), "from the broker");
            if c.ping.is_some() {
                let _ = self.out.try_send(Message {
                    command: command(Type::Pong, |c| c.pong = Some(Default::default())),
                    payload: None,
                });
            } else if c.pong.is_some() {
            } else if c.auth_challenge.is_some() {
                // The broker's credentials are expiring. Bounded, and
                // queued without waiting: this task also notices a silent
                // broker and a closed connection, and settles every
                // receipt. Without fresh credentials the broker drops the
                // connection when the old ones expire; dropping it here
                // would free the topic no sooner and with less heard out.
                if let Some(auth) = &auth {
                    let Some(answer) = answer_challenge(auth, self.timeout).await else {
                        continue;
                    };
                    if self.out.try_send(answer).is_err() {
                        tracing::warn!("the answer to the broker's credentials challenge could not be queued (the broker is not reading)");
                    }
                }
            } else if let Some(r) = &c.send_receipt {
                if let Err(e) = self.receipt(r.producer_id, Answer::of_receipt(r)) {
                    return e.to_string();
                }
            } else if let Some(e) = &c.send_error {
                if let Err(e) = self.receipt(e.producer_id, Answer::of_error(e)) {
                    return e.to_string();
                }
            } else if let Some(close) = &c.close_producer {
                // The topic moved or was unloaded: this producer is done;
                // the publisher makes a new one, which looks the topic up
                // again.
                self.producer_gone(
                    close.producer_id,
                    SendError::Lost(
                        "the broker closed the producer (topic moved or unloaded)".into(),
                    ),
                );
            } else if let Some(id) = request_id(&c) {
                if let Some(waiter) = lock(&self.shared).requests.remove(&id) {
                    let _ = waiter.send(c);
                }
            }
        }
    }

    /// Settles an entry in flight of `producer` with the broker's answer.
    fn receipt(&self, producer: u64, answer: Answer) -> Result<(), OutOfOrder> {
        let mut shared = lock(&self.shared);
        match shared.producers.get_mut(&producer) {
            Some(slot) => slot.settle(producer, answer),
            // A producer closed here while its entries were on their way.
            None => Ok(()),
        }
    }

    fn producer_gone(&self, producer: u64, why: SendError) {
        let mut shared = lock(&self.shared);
        if let Some(slot) = shared.producers.get_mut(&producer) {
            slot.gone = Some(why.clone());
            for p in slot.pending.drain(..) {
                p.fail(|| why.clone());
            }
        }
    }
}

/// A frame's kind, for the trace log.
fn kind(c: &BaseCommand) -> Result<Type, i32> {
    Type::try_from(c.r#type).map_err(|_| c.r#type)
}

/// The request id an answer carries, for the answers this client asks for.
fn request_id(c: &BaseCommand) -> Option<u64> {
    c.success
        .as_ref()
        .map(|s| s.request_id)
        .or(c.error.as_ref().map(|e| e.request_id))
        .or(c.producer_success.as_ref().map(|p| p.request_id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::producer::conn::closes_settled;
    use crate::publish::producer::fake::{connected, connected_through, entry, producer_on};
    use crate::publish::producer::receipts::Failure;
    use tokio::sync::oneshot;

    /// The end of a term with a close the broker does not answer: the
    /// connection outlives the term, closed neither at the timeout nor
    /// ever while the broker answers pings, and goes once the broker has
    /// been silent for [`DEAD_AFTER`] and an operation timeout more; then
    /// the fence lifts. Nothing is kept for ever.
    #[tokio::test(start_paused = true)]
    async fn a_term_s_unanswered_close_keeps_the_connection_until_the_broker_goes_silent() {
        let topic = "persistent://public/default/shut-unanswered";
        let timeout = Duration::from_secs(3);
        let (conn, mut broker) = connected(timeout).await;
        let id = producer_on(&conn, &mut broker, topic).await;
        let (w1, mut r1) = oneshot::channel();
        conn.send(id, entry(1, 1), vec![w1]).await.unwrap();
        assert!(broker.next().await.send.is_some());
        conn.shut("the term ended".into());
        assert!(broker.next().await.close_producer.is_some());
        for _ in 0..4 {
            tokio::time::sleep(timeout * 2).await;
            broker.ping().await;
        }
        assert!(!conn.is_closed());
        assert!(!closes_settled(topic, Duration::ZERO).await);
        // Silent from now on.
        let silent = tokio::time::Instant::now();
        tokio::time::timeout(DEAD_AFTER * 2, conn.closed.cancelled())
            .await
            .expect("a silent broker's connection goes");
        assert!(silent.elapsed() >= DEAD_AFTER + timeout);
        assert!(closes_settled(topic, Duration::ZERO).await);
        assert!(matches!(r1.try_recv(), Ok(Err(Failure::Lost(_)))));
        drop(broker);
    }

    /// A broker that stops reading: a send that finds the write queue full
    /// fails as lost within the operation timeout instead of waiting for
    /// ever, and once the connection is closed (every waiter told its
    /// entry is lost) the socket is let go of at once and nothing more is
    /// written on it: the broker reads what was already in the pipe, not a
    /// byte more, and then the end of the stream. Before, the writer's
    /// write in progress could not be interrupted: it kept the socket open
    /// and, once the broker read again, finished, and more queued frames
    /// followed, after their waiters had been told they were lost.
    #[tokio::test(start_paused = true)]
    async fn a_closed_connection_writes_nothing_more_and_lets_go_of_the_socket() {
        const PIPE: usize = 16 * 1024;
        let timeout = Duration::from_secs(3);
        let (conn, mut broker) = connected_through(timeout, PIPE).await;
        let id = producer_on(
            &conn,
            &mut broker,
            "persistent://public/default/stops-reading",
        )
        .await;
        // The broker reads nothing more: the pipe fills, then the queue.
        let mut receipts = Vec::new();
        let full = tokio::time::timeout(timeout * 10, async {
            for seq in 1.. {
                let (w, r) = oneshot::channel();
                let started = tokio::time::Instant::now();
                match conn.send(id, entry(seq, seq), vec![w]).await {
                    Ok(()) => receipts.push(r),
                    Err(e) => return (e, started.elapsed()),
                }
            }
            unreachable!()
        })
        .await
        .expect("a send into a full queue gives up");
        assert!(matches!(full.0, SendError::Lost(_)), "{:?}", full.0);
        assert!(full.1 >= timeout);
        assert!(receipts.len() >= WRITE_QUEUE);
        conn.close("test".into());
        for r in &mut receipts {
            assert!(matches!(r.try_recv(), Ok(Err(Failure::Lost(_)))));
        }
        let rest = tokio::time::timeout(timeout, broker.rest())
            .await
            .expect("the socket is let go of at once")
            .expect("read");
        assert!(
            rest.len() <= PIPE,
            "{} bytes reached the broker after the close, more than the {PIPE} already in the pipe",
            rest.len()
        );
    }
}
