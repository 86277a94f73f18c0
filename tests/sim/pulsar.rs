//! A model of Pulsar for the simulations, behind the publisher's broker port
//! (`firstseen::publish::port`).
//!
//! What it does, as Pulsar does it:
//! - One exclusive producer per topic; a second is refused ("ProducerBusy")
//!   until the first is closed or its connection fails.
//! - A producer's messages are persisted in the order they were sent, a few
//!   milliseconds later ([`disk`]), and each receipt then resolves.
//! - When a producer dies (closed, or its node's connection cut), some prefix
//!   of what it had queued is persisted anyway, and every receipt still
//!   pending is lost, persisted or not.
//! - The tail a new leader reads is the last message's sequence.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use firstseen::publish::port::{Broker, Receipt, SendError, Sending, Session};
use firstseen::Error;
use firstseen_store::OutboxMessage;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{lock, Rng};

/// A message queued on a producer, not yet persisted.
struct Queued {
    seq: u64,
    key: [u8; 32],
    receipt: oneshot::Sender<Result<(), SendError>>,
}

struct Producer {
    node: u64,
    topic: String,
    queue: VecDeque<Queued>,
}

/// The broker's topics and producers.
#[derive(Default)]
pub struct Pulsar {
    /// Each topic's persisted messages: (firstseen-seq, key), in order.
    pub topics: BTreeMap<String, Vec<(u64, [u8; 32])>>,
    holders: BTreeMap<String, u64>,
    producers: BTreeMap<u64, Producer>,
    next_producer: u64,
    /// While set, the broker refuses producers and sends (an outage).
    pub down: bool,
}

/// What a simulation's world gives the model: itself, a generator and a
/// trace.
pub trait HasPulsar: Send + 'static {
    fn pulsar(&mut self) -> &mut Pulsar;
    fn rng(&mut self) -> &mut Rng;
    fn log(&mut self, line: String);
}

impl Pulsar {
    /// Persists the first `n` queued messages of `producer`; with `receipts`
    /// their receipts resolve, without they are lost.
    fn persist(&mut self, producer: u64, n: usize, receipts: bool) {
        let Some(p) = self.producers.get_mut(&producer) else {
            return;
        };
        let done: Vec<Queued> = (0..n).filter_map(|_| p.queue.pop_front()).collect();
        let topic = self.topics.entry(p.topic.clone()).or_default();
        for q in done {
            topic.push((q.seq, q.key));
            if receipts {
                let _ = q.receipt.send(Ok(()));
            }
        }
    }

    /// The producer is gone: a prefix of its queue still reaches the topic,
    /// and no receipt comes back. Returns a line for the trace.
    fn kill(&mut self, producer: u64, rng: &mut Rng, why: &str) -> Option<String> {
        let p = self.producers.get(&producer)?;
        let (node, topic, queued) = (p.node, p.topic.clone(), p.queue.len());
        let persisted = rng.below(queued as u64 + 1) as usize;
        self.persist(producer, persisted, false);
        self.producers.remove(&producer);
        if self.holders.get(&topic) == Some(&producer) {
            self.holders.remove(&topic);
        }
        Some(format!(
            "node {node}'s producer on {topic} {why}: {persisted} of {queued} queued persisted"
        ))
    }

    /// Messages sent to `topic` and not yet persisted, by every producer.
    pub fn queued(&self, topic: &str) -> usize {
        self.producers
            .values()
            .filter(|p| p.topic == topic)
            .map(|p| p.queue.len())
            .sum()
    }

    /// The broker goes down: every producer dies, and nothing is accepted
    /// until it is back.
    pub fn outage(&mut self, rng: &mut Rng) -> Vec<String> {
        self.down = true;
        let all: Vec<u64> = self.producers.keys().copied().collect();
        all.into_iter()
            .filter_map(|id| self.kill(id, rng, "lost its connection: the broker went down"))
            .collect()
    }

    /// Node `node`'s connection to the broker fails: every producer on it
    /// dies.
    pub fn cut(&mut self, node: u64, rng: &mut Rng) -> Vec<String> {
        let theirs: Vec<u64> = self
            .producers
            .iter()
            .filter(|(_, p)| p.node == node)
            .map(|(id, _)| *id)
            .collect();
        theirs
            .into_iter()
            .filter_map(|id| self.kill(id, rng, "lost its connection"))
            .collect()
    }
}

/// Persists up to `most - 1` messages of every producer's queue after each
/// pause of `pause` milliseconds (drawn between the two bounds), until
/// `stop`.
pub async fn disk<W: HasPulsar>(
    world: Arc<Mutex<W>>,
    stop: CancellationToken,
    pause: (u64, u64),
    most: u64,
) {
    loop {
        let pause = lock(&world).rng().ms(pause.0, pause.1);
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.cancelled() => return,
        }
        let mut w = lock(&world);
        let ids: Vec<u64> = w.pulsar().producers.keys().copied().collect();
        for id in ids {
            let n = w.rng().below(most) as usize;
            w.pulsar().persist(id, n, true);
        }
    }
}

/// The broker as node `node` reaches it.
pub struct SimBroker<W> {
    pub node: u64,
    pub world: Arc<Mutex<W>>,
}

pub struct SimSession<W> {
    node: u64,
    world: Arc<Mutex<W>>,
}

/// A producer handle; dropping it closes the producer.
pub struct SimProducer<W: HasPulsar> {
    id: u64,
    world: Arc<Mutex<W>>,
}

impl<W: HasPulsar> Drop for SimProducer<W> {
    fn drop(&mut self) {
        let mut w = lock(&self.world);
        let mut rng = w.rng().clone();
        let line = w.pulsar().kill(self.id, &mut rng, "closed");
        *w.rng() = rng;
        if let Some(line) = line {
            w.log(line);
        }
    }
}

fn refused(why: &str) -> SendError {
    SendError::Lost(why.to_string())
}

impl<W: HasPulsar> Broker for SimBroker<W> {
    type Session = SimSession<W>;

    fn connect(&self) -> impl Future<Output = Result<SimSession<W>, SendError>> + Send {
        let session = SimSession {
            node: self.node,
            world: self.world.clone(),
        };
        async move { Ok(session) }
    }
}

impl<W: HasPulsar> Session for SimSession<W> {
    type Producer = SimProducer<W>;

    async fn exclusive(&self, topic: &str, name: &str) -> Result<SimProducer<W>, SendError> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let mut w = lock(&self.world);
        let p = w.pulsar();
        if p.down {
            return Err(refused("connection refused: the broker is down"));
        }
        if let Some(holder) = p.holders.get(topic) {
            // As the adapter sorts the broker's ProducerBusy: the typed
            // refusal the publisher's policy reads (never the text).
            return Err(SendError::HeldElsewhere(format!(
                "{topic} is held by producer {holder}"
            )));
        }
        p.next_producer += 1;
        let id = p.next_producer;
        p.holders.insert(topic.to_string(), id);
        p.producers.insert(
            id,
            Producer {
                node: self.node,
                topic: topic.to_string(),
                queue: VecDeque::new(),
            },
        );
        w.log(format!("node {} holds {topic} as {name}", self.node));
        Ok(SimProducer {
            id,
            world: self.world.clone(),
        })
    }

    async fn last_seq(
        &self,
        topic: &str,
        assigned: u64,
        _strict: bool,
    ) -> Result<firstseen::publish::tail::Tail, Error> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let mut w = lock(&self.world);
        let messages = w.pulsar().topics.get(topic);
        Ok(firstseen::publish::tail::Tail {
            seq: messages
                .and_then(|m| m.last())
                .map(|(s, _)| *s)
                .filter(|s| *s <= assigned),
            ..Default::default()
        })
    }

    async fn send(
        &self,
        producer: &mut SimProducer<W>,
        seq: u64,
        message: OutboxMessage,
        _how: Sending,
    ) -> Result<Receipt, SendError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut w = lock(&self.world);
            let Some(p) = w.pulsar().producers.get_mut(&producer.id) else {
                return Err(refused("producer is closed: its connection failed"));
            };
            p.queue.push_back(Queued {
                seq,
                key: message.key,
                receipt: tx,
            });
        }
        Ok(Box::pin(async move {
            match rx.await {
                Ok(r) => r,
                Err(_) => Err(refused("connection lost before the receipt")),
            }
        }))
    }
}
