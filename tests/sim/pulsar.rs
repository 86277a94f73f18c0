//! A model of Pulsar for the simulations, behind the publisher's broker port
//! (`firstseen::publish::port`): the broker as the node's adapter
//! (`publish::adapter` over `publish::producer`) shows it.
//!
//! What it does, as Pulsar 4.0 does it (tests/conformance.rs runs the same
//! operations against the real broker and this model, and fails where
//! they answer differently):
//! - Topic names are the broker's: `fs`, `public/default/fs` and
//!   `persistent://public/default/fs` are one topic ([`canonical`]).
//! - One exclusive producer per topic; a second is refused
//!   (`HeldElsewhere`, the broker's ProducerBusy/ProducerFenced) while the
//!   first holds it.
//! - Messages go in entries as the adapter makes them: those queued between
//!   two flushes, up to the adapter's bounds (one per entry on a topic whose
//!   batched entry was refused in this session). The broker judges each
//!   entry on its own when it arrives: one over the topic's own
//!   `maxMessageSize` is refused before it reaches the topic's ledger, and
//!   entries sent after it still land. The refusal may be read after the
//!   receipts of later entries; once read, the producer sends nothing more.
//! - Entries that reach the ledger are persisted in the order they reached
//!   it, whichever producer sent them, a few milliseconds later ([`disk`]),
//!   or not while the topic's storage is stalled ([`Pulsar::stall`]).
//! - A producer closed (dropped) sends nothing more, but what it had sent
//!   is still answered: the broker keeps the topic held until the
//!   producer's pending entries have landed (a graceful CloseProducer), and
//!   the adapter hears them out.
//! - A receipt that outlives the operation timeout makes the adapter close
//!   the producer, which keeps the topic held until its entries settle.
//! - A dropped connection ([`Pulsar::cut`]) frees the topic at once; of the
//!   entries sent on it, those the broker had read stay pending and land
//!   later, perhaps after another producer took the topic and read its
//!   tail.
//! - An unload ([`Pulsar::unload`]) lands what the ledger had, drops the
//!   rest, closes the producer (the client looks the topic up again) and
//!   refuses producers for a moment while the topic loads.
//! - An outage ([`Pulsar::outage`]) lands a prefix of every pending entry
//!   and loses the rest, with every producer.
//! - With the admin API, the adapter waits after taking a topic until the
//!   broker holds no pending write of it, at most one operation timeout,
//!   and gives it up (`WritesPending`) after that.
//! - The tail a new leader reads is the last message of ours that is not
//!   late, with the sequences between the watermark and it that the topic
//!   lacks. Every message in the model carries the cluster's proof; each
//!   keeps the generation it was written in (`firstseen-generation`), and
//!   the read reports the newest one, and, to a reader of a generation
//!   above 0, the messages of older ones above its watermark (not its
//!   tail: the cluster it was recovered from wrote them), as the adapter's
//!   read does ([`HasPulsar::generation`] says which generation the
//!   reading node's publisher goes by).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use firstseen::publish::port::{Broker, Receipt, SendError, Sending, Session};
use firstseen::publish::Error;
use firstseen_store::OutboxMessage;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{lock, Rng};

/// Bytes the adapter keeps free in an entry below the broker's limit (the
/// producer's `ENTRY_OVERHEAD`).
const ENTRY_OVERHEAD: usize = 4 * 1024;

/// The broker's own `maxMessageSize` (Pulsar's default).
pub const BROKER_MAX_MESSAGE: usize = 5 * 1024 * 1024;

/// A topic name as the broker reads it: a bare name is in `public/default`,
/// a `tenant/namespace/name` is persistent.
pub fn canonical(topic: &str) -> String {
    if topic.contains("://") {
        topic.to_string()
    } else {
        match topic.matches('/').count() {
            0 => format!("persistent://public/default/{topic}"),
            2 => format!("persistent://{topic}"),
            _ => topic.to_string(),
        }
    }
}

/// About the bytes a message takes in an entry as the adapter writes it:
/// its body and its properties (sequence, key, MQTT topic, node, time,
/// proof).
pub fn message_bytes(m: &OutboxMessage, marker: bool) -> usize {
    let body = if marker { 0 } else { m.payload.len() };
    body + m.mqtt_topic.len() + 300
}

/// A message in a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub seq: u64,
    pub key: [u8; 32],
    /// Sent with `firstseen-late`.
    pub late: bool,
    /// A marker in the message's place.
    pub marker: bool,
    /// The generation of the cluster that wrote it (0: never recovered).
    pub generation: u64,
}

type Answer = Result<(), SendError>;

/// An entry handed to a topic's ledger, not yet persisted.
struct Entry {
    producer: u64,
    messages: Vec<Stored>,
    waiters: Vec<oneshot::Sender<Answer>>,
}

/// A refusal the client has not read yet.
struct Unread {
    error: SendError,
    waiters: Vec<oneshot::Sender<Answer>>,
    /// Disk ticks until it is read.
    after: u32,
    /// A later entry of the same producer landed meanwhile: should the
    /// producer go before the refusal is read, the adapter fails it as
    /// refused (it is surely not in the topic), not as lost.
    overtaken: bool,
}

struct Producer {
    node: u64,
    session: u64,
    topic: String,
    /// The entry being filled (the adapter's open entry): its messages,
    /// bytes and waiters.
    open: Vec<(Stored, oneshot::Sender<Answer>)>,
    open_bytes: usize,
    /// The adapter's bound on an entry's bytes.
    entry_max: usize,
    /// Why the adapter sends nothing more on it (a refusal read, the
    /// connection dropped, the broker closed it).
    gone: Option<SendError>,
    unread: Vec<Unread>,
    /// Closed by the client: the broker holds the topic for it until its
    /// pending entries have landed.
    closing: bool,
    /// Its connection dropped: the handle fails every send until dropped.
    dropped: bool,
}

/// One topic at the broker.
#[derive(Default)]
pub struct Topic {
    /// Its persisted messages, in order.
    pub messages: Vec<Stored>,
    adds: VecDeque<Entry>,
    holder: Option<u64>,
    /// The topic's own `maxMessageSize` policy.
    pub policy: Option<usize>,
    /// Its storage holds every write unanswered.
    pub stalled: bool,
    /// Unloaded: refuses producers until then.
    loading_until: Option<Instant>,
}

/// The broker's topics and producers.
pub struct Pulsar {
    pub topics: BTreeMap<String, Topic>,
    producers: BTreeMap<u64, Producer>,
    next_producer: u64,
    next_session: u64,
    /// While set, the broker refuses producers and sends (an outage).
    pub down: bool,
    /// The adapter's operation timeout: a receipt that takes longer makes it
    /// abandon the connection.
    pub wait: Duration,
    /// The adapter reads topic policies through the admin API (`admin_url`
    /// set): a producer acquired after a policy changed knows it.
    pub admin: bool,
    /// `pulsar.max_message_bytes`.
    pub max_message_bytes: usize,
    /// Lines for the trace from operations that have no world at hand.
    notes: Vec<String>,
}

impl Default for Pulsar {
    fn default() -> Self {
        Pulsar {
            topics: BTreeMap::new(),
            producers: BTreeMap::new(),
            next_producer: 0,
            next_session: 0,
            down: false,
            wait: Duration::from_millis(5_000),
            admin: true,
            max_message_bytes: BROKER_MAX_MESSAGE,
            notes: Vec::new(),
        }
    }
}

/// What a simulation's world gives the model: itself, a generator and a
/// trace.
pub trait HasPulsar: Send + 'static {
    fn pulsar(&mut self) -> &mut Pulsar;
    fn rng(&mut self) -> &mut Rng;
    fn log(&mut self, line: String);

    /// The generation node `node`'s publisher reads tails by (its
    /// `Ours::generation`): 0 where no cluster is ever recovered.
    fn generation(&mut self, _node: u64) -> u64 {
        0
    }
}

/// How the adapter fails a producer's waiters when it goes: refused if
/// overtaken, else lost.
fn fail_unread(u: Unread, why: &SendError) {
    let answer = if u.overtaken { u.error } else { why.clone() };
    for w in u.waiters {
        let _ = w.send(Err(answer.clone()));
    }
}

impl Pulsar {
    /// Topic `name`'s messages (either spelling), oldest first.
    pub fn messages(&self, name: &str) -> &[Stored] {
        self.topics
            .get(&canonical(name))
            .map_or(&[][..], |t| &t.messages[..])
    }

    /// Sets topic `name`'s own `maxMessageSize`: producers that hold it now
    /// do not know.
    pub fn set_policy(&mut self, name: &str, bytes: Option<usize>) {
        self.topics.entry(canonical(name)).or_default().policy = bytes;
    }

    /// Topic `name`'s storage stops answering (`true`) or carries on.
    pub fn stall(&mut self, name: &str, stalled: bool) {
        self.topics.entry(canonical(name)).or_default().stalled = stalled;
    }

    /// Entries pending in topic `name`'s ledger.
    pub fn pending(&self, name: &str) -> usize {
        self.topics
            .get(&canonical(name))
            .map_or(0, |t| t.adds.len())
    }

    /// Messages sent to `topic` and not yet persisted, by every producer
    /// (open entries, and entries pending in the ledger).
    pub fn queued(&self, topic: &str) -> usize {
        let topic = canonical(topic);
        let open: usize = self
            .producers
            .values()
            .filter(|p| p.topic == topic)
            .map(|p| p.open.len())
            .sum();
        let adds: usize = self
            .topics
            .get(&topic)
            .map_or(0, |t| t.adds.iter().map(|e| e.messages.len()).sum());
        open + adds
    }

    /// Persists the first `n` entries pending on `topic`, answering their
    /// receipts; frees the topic of a closed producer whose entries have
    /// all landed.
    fn persist(&mut self, topic: &str, n: usize) -> usize {
        let Some(t) = self.topics.get_mut(topic) else {
            return 0;
        };
        let mut landed = 0;
        for _ in 0..n {
            let Some(e) = t.adds.pop_front() else { break };
            landed += e.messages.len();
            t.messages.extend(e.messages);
            for w in e.waiters {
                let _ = w.send(Ok(()));
            }
            if let Some(p) = self.producers.get_mut(&e.producer) {
                for u in &mut p.unread {
                    u.overtaken = true;
                }
            }
        }
        self.release_closed(topic);
        landed
    }

    /// A closed producer holding `topic` lets go once none of its entries
    /// is pending.
    fn release_closed(&mut self, topic: &str) {
        let Some(t) = self.topics.get_mut(topic) else {
            return;
        };
        let Some(holder) = t.holder else { return };
        let closing = self.producers.get(&holder).is_some_and(|p| p.closing);
        if closing && !t.adds.iter().any(|e| e.producer == holder) {
            t.holder = None;
            // The close's answer comes after every answer to its entries.
            if let Some(p) = self.producers.remove(&holder) {
                for u in p.unread {
                    for w in u.waiters {
                        let _ = w.send(Err(u.error.clone()));
                    }
                }
            }
        }
    }

    /// The client side of a producer going: its open entry is dropped, its
    /// waiters fail (refused where a later entry overtook a refused one),
    /// and it sends nothing more.
    fn client_gone(&mut self, producer: u64, why: SendError) {
        let Some(p) = self.producers.get_mut(&producer) else {
            return;
        };
        p.gone.get_or_insert(why.clone());
        p.open.clear();
        p.open_bytes = 0;
        for u in std::mem::take(&mut p.unread) {
            fail_unread(u, &why);
        }
        let topic = p.topic.clone();
        if let Some(t) = self.topics.get_mut(&topic) {
            for e in t.adds.iter_mut().filter(|e| e.producer == producer) {
                for w in e.waiters.drain(..) {
                    let _ = w.send(Err(why.clone()));
                }
            }
        }
    }

    /// The client closed `producer` (dropped it). Returns a line for the
    /// trace.
    fn close(&mut self, producer: u64) -> Option<String> {
        let p = self.producers.get(&producer)?;
        let (node, topic) = (p.node, p.topic.clone());
        // The adapter hears out what it had sent (the broker answers the
        // close once those entries are in): only the entry it had not sent
        // fails, and nothing more goes.
        let p = self.producers.get_mut(&producer).expect("found above");
        p.open.clear();
        p.open_bytes = 0;
        p.gone
            .get_or_insert(SendError::Lost("the producer was closed".into()));
        let holds = self
            .topics
            .get(&topic)
            .is_some_and(|t| t.holder == Some(producer));
        let pending = self.topics.get(&topic).map_or(0, |t| {
            t.adds.iter().filter(|e| e.producer == producer).count()
        });
        let dropped = self.producers.get(&producer).is_some_and(|p| p.dropped);
        if holds && !dropped {
            if let Some(p) = self.producers.get_mut(&producer) {
                p.closing = true;
            }
            self.release_closed(&topic);
        } else {
            self.producers.remove(&producer);
        }
        Some(format!(
            "node {node}'s producer on {topic} closed: {pending} entries still pending land before the topic is free"
        ))
    }

    /// The connection under `producer` dropped: the topic is free at once;
    /// of its entries on their way, a prefix (those the broker had read)
    /// stays pending and lands later, the rest never arrives.
    fn drop_conn(&mut self, producer: u64, rng: &mut Rng, why: &str) -> Option<String> {
        let p = self.producers.get(&producer)?;
        let (node, topic, closing_before) = (p.node, p.topic.clone(), p.closing);
        self.client_gone(producer, SendError::Lost(format!("connection lost: {why}")));
        let t = self.topics.entry(topic.clone()).or_default();
        if t.holder == Some(producer) {
            t.holder = None;
        }
        let mine = t.adds.iter().filter(|e| e.producer == producer).count();
        // A closing producer's entries all reached the broker before its
        // close did.
        let kept = if closing_before {
            mine
        } else {
            rng.below(mine as u64 + 1) as usize
        };
        let mut seen = 0;
        let mut seqs = (u64::MAX, 0);
        t.adds.retain(|e| {
            if e.producer != producer {
                return true;
            }
            seen += 1;
            if seen <= kept {
                for m in &e.messages {
                    seqs = (seqs.0.min(m.seq), seqs.1.max(m.seq));
                }
            }
            seen <= kept
        });
        let pending = if kept > 0 {
            format!(" (seqs {}..={})", seqs.0, seqs.1)
        } else {
            String::new()
        };
        let closing = self.producers.get(&producer).is_some_and(|p| p.closing);
        if closing {
            // Its handle is gone already.
            self.producers.remove(&producer);
        } else if let Some(p) = self.producers.get_mut(&producer) {
            p.dropped = true;
        }
        Some(format!(
            "node {node}'s producer on {topic} {why}: topic free; {kept} of {mine} entries sent stay pending{pending}"
        ))
    }

    /// The broker goes down: on every topic a prefix of what is pending
    /// lands and the rest is lost, every producer dies, and nothing is
    /// accepted until it is back.
    pub fn outage(&mut self, rng: &mut Rng) -> Vec<String> {
        self.down = true;
        let mut lines = Vec::new();
        let all: Vec<u64> = self.producers.keys().copied().collect();
        for id in all {
            self.client_gone(id, SendError::Lost("the broker went down".into()));
            let p = self.producers.get_mut(&id).expect("listed");
            p.dropped = true;
        }
        // Closed ones have nothing more to wait for.
        self.producers.retain(|_, p| !p.closing);
        let names: Vec<String> = self.topics.keys().cloned().collect();
        for name in names {
            let pending = self.topics[&name].adds.len();
            let n = rng.below(pending as u64 + 1) as usize;
            let landed = self.persist(&name, n);
            let t = self.topics.get_mut(&name).expect("listed");
            t.adds.clear();
            t.holder = None;
            if pending > 0 {
                lines.push(format!(
                    "the broker went down: {n} of {pending} pending entries on {name} landed ({landed} messages)"
                ));
            }
        }
        lines
    }

    /// Node `node`'s connection to the broker fails: every producer on it
    /// goes as a dropped connection.
    pub fn cut(&mut self, node: u64, rng: &mut Rng) -> Vec<String> {
        let theirs: Vec<u64> = self
            .producers
            .iter()
            .filter(|(_, p)| p.node == node && !p.dropped)
            .map(|(id, _)| *id)
            .collect();
        theirs
            .into_iter()
            .filter_map(|id| self.drop_conn(id, rng, "lost its connection"))
            .collect()
    }

    /// The topic is unloaded (the admin API's `unload`): what its ledger
    /// had lands, the rest is dropped, its producer is closed by the
    /// broker, and it refuses producers until it has loaded again.
    pub fn unload(&mut self, name: &str, rng: &mut Rng) -> Vec<String> {
        let name = canonical(name);
        let pending = self.topics.get(&name).map_or(0, |t| t.adds.len());
        let n = rng.below(pending as u64 + 1) as usize;
        self.persist(&name, n);
        let t = self.topics.entry(name.clone()).or_default();
        let dropped: Vec<Entry> = t.adds.drain(..).collect();
        t.holder = None;
        // The broker loads the topic again on the next lookup, at once or
        // after a moment.
        t.loading_until = Some(Instant::now() + rng.ms(0, 150) * rng.below(2) as u32);
        for e in dropped {
            for w in e.waiters {
                let _ = w.send(Err(SendError::Lost(
                    "the broker closed the producer (topic unloaded)".into(),
                )));
            }
        }
        let on: Vec<u64> = self
            .producers
            .iter()
            .filter(|(_, p)| p.topic == name)
            .map(|(id, _)| *id)
            .collect();
        for id in on {
            self.client_gone(
                id,
                SendError::Lost("the broker closed the producer (topic unloaded)".into()),
            );
            if self.producers.get(&id).is_some_and(|p| p.closing) {
                self.producers.remove(&id);
            }
        }
        vec![format!(
            "{name} unloaded: {n} of {pending} pending entries landed"
        )]
    }

    /// Whether node `node` is still closing a producer on `topic` (the
    /// adapter's next producer there waits for that).
    fn closing_on(&self, node: u64, topic: &str) -> bool {
        self.producers
            .values()
            .any(|p| p.node == node && p.topic == topic && p.closing)
    }

    /// Whether `producer` is still being closed.
    fn still_closing(&self, producer: u64) -> bool {
        self.producers.get(&producer).is_some_and(|p| p.closing)
    }

    /// One disk tick: on every topic whose storage answers, up to `most - 1`
    /// pending entries land; refusals due are read.
    fn tick(&mut self, rng: &mut Rng, most: u64) -> Vec<String> {
        let lines = Vec::new();
        let names: Vec<String> = self.topics.keys().cloned().collect();
        for name in names {
            if self.topics[&name].stalled {
                continue;
            }
            let n = rng.below(most) as usize;
            self.persist(&name, n);
        }
        for p in self.producers.values_mut() {
            let mut i = 0;
            while i < p.unread.len() {
                if p.unread[i].after == 0 {
                    let u = p.unread.remove(i);
                    // Read: the adapter sends nothing more on this producer.
                    p.gone.get_or_insert(SendError::Lost(format!(
                        "the broker refused an entry: {}",
                        u.error
                    )));
                    for w in u.waiters {
                        let _ = w.send(Err(u.error.clone()));
                    }
                } else {
                    p.unread[i].after -= 1;
                    i += 1;
                }
            }
        }
        lines
    }

    /// Sends `producer`'s open entry, as the adapter's flush does: refused
    /// at once if it is larger than the topic takes, else handed to the
    /// topic's ledger.
    fn flush(&mut self, producer: u64, rng: &mut Rng) -> Result<(), SendError> {
        let Some(p) = self.producers.get_mut(&producer) else {
            return Err(SendError::Lost("the producer was closed".into()));
        };
        if p.open.is_empty() {
            return Ok(());
        }
        let open = std::mem::take(&mut p.open);
        let bytes = std::mem::take(&mut p.open_bytes) + 50;
        if let Some(why) = &p.gone {
            // The adapter fails the flush; the entry's waiters are dropped.
            return Err(why.clone());
        }
        let topic = p.topic.clone();
        let (messages, waiters): (Vec<Stored>, Vec<_>) = open.into_iter().unzip();
        let t_name = topic.clone();
        let t = self.topics.entry(topic).or_default();
        let limit = t
            .policy
            .unwrap_or(BROKER_MAX_MESSAGE)
            .min(BROKER_MAX_MESSAGE);
        if bytes > limit {
            let why = format!("NotAllowedError: Exceed maximum message size ({bytes} > {limit})");
            let error = match messages.len() {
                1 => SendError::Refused(why),
                n => SendError::RefusedEntry {
                    messages: n as u64,
                    why,
                },
            };
            self.notes.push(format!(
                "{t_name}: entry of {}..={} ({} messages, {bytes} bytes) refused over {limit}",
                messages[0].seq,
                messages[messages.len() - 1].seq,
                messages.len()
            ));
            let after = rng.below(3) as u32;
            let p = self.producers.get_mut(&producer).expect("found above");
            p.unread.push(Unread {
                error,
                waiters,
                after,
                overtaken: false,
            });
            return Ok(());
        }
        t.adds.push_back(Entry {
            producer,
            messages,
            waiters,
        });
        Ok(())
    }
}

/// Every pause of `pause` milliseconds (drawn between the two bounds), up
/// to `most - 1` pending entries of every topic land and refusals due are
/// read, until `stop`.
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
        logged(&mut *w, |p, rng| p.tick(rng, most));
    }
}

/// Runs `f` on the world's model with a generator taken out of the world
/// (and put back), logging the model's notes.
pub fn with_rng<W: HasPulsar, T>(w: &mut W, f: impl FnOnce(&mut Pulsar, &mut Rng) -> T) -> T {
    let mut rng = w.rng().clone();
    let out = f(w.pulsar(), &mut rng);
    *w.rng() = rng;
    for l in std::mem::take(&mut w.pulsar().notes) {
        w.log(l);
    }
    out
}

/// [`with_rng`] for operations that return lines for the trace.
pub fn logged<W: HasPulsar>(w: &mut W, f: impl FnOnce(&mut Pulsar, &mut Rng) -> Vec<String>) {
    for l in with_rng(w, f) {
        w.log(l);
    }
}

/// The broker as node `node` reaches it.
pub struct SimBroker<W> {
    pub node: u64,
    pub world: Arc<Mutex<W>>,
}

/// One term's connection, as the adapter's session. A message goes in an
/// entry of its own when the publisher says so (`Sending::alone`).
pub struct SimSession<W> {
    node: u64,
    id: u64,
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
        if let Some(line) = w.pulsar().close(self.id) {
            w.log(line);
        }
    }
}

impl<W: HasPulsar> Broker for SimBroker<W> {
    type Session = SimSession<W>;

    fn connect(&self) -> impl Future<Output = Result<SimSession<W>, SendError>> + Send {
        let id = {
            let mut w = lock(&self.world);
            w.pulsar().next_session += 1;
            w.pulsar().next_session
        };
        let session = SimSession {
            node: self.node,
            id,
            world: self.world.clone(),
        };
        async move { Ok(session) }
    }
}

impl<W: HasPulsar> SimSession<W> {
    /// The largest message the adapter believes `topic` takes.
    fn known_limit(p: &Pulsar, topic: &str) -> Option<usize> {
        if !p.admin {
            return None;
        }
        let own = p.topics.get(topic).and_then(|t| t.policy);
        Some(own.map_or(BROKER_MAX_MESSAGE, |o| o.min(BROKER_MAX_MESSAGE)))
    }
}

impl<W: HasPulsar> Session for SimSession<W> {
    type Producer = SimProducer<W>;

    async fn exclusive(&self, topic: &str, name: &str) -> Result<SimProducer<W>, SendError> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let topic = canonical(topic);
        // As the adapter: this process's next producer on a topic waits
        // for its previous one's close, at most two operation timeouts.
        let bound = Instant::now() + lock(&self.world).pulsar().wait * 2;
        while lock(&self.world).pulsar().closing_on(self.node, &topic) {
            if Instant::now() >= bound {
                return Err(SendError::Lost(format!(
                    "an earlier producer on {topic} is still being closed"
                )));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (id, admin, wait) = {
            let mut w = lock(&self.world);
            let p = w.pulsar();
            if p.down {
                return Err(SendError::Lost(
                    "connection refused: the broker is down".into(),
                ));
            }
            let limit = Self::known_limit(p, &topic)
                .map_or(p.max_message_bytes, |l| l.min(p.max_message_bytes));
            let t = p.topics.entry(topic.clone()).or_default();
            if t.loading_until.is_some_and(|u| Instant::now() < u) {
                return Err(SendError::Lost(format!("{topic} is being loaded")));
            }
            if let Some(holder) = t.holder {
                return Err(SendError::HeldElsewhere(format!(
                    "{topic} is held by producer {holder}"
                )));
            }
            p.next_producer += 1;
            let id = p.next_producer;
            p.topics.get_mut(&topic).expect("made above").holder = Some(id);
            p.producers.insert(
                id,
                Producer {
                    node: self.node,
                    session: self.id,
                    topic: topic.clone(),
                    open: Vec::new(),
                    open_bytes: 0,
                    entry_max: limit
                        .saturating_sub(ENTRY_OVERHEAD)
                        .clamp(1, firstseen::publish::producer::entry::MAX_BYTES),
                    gone: None,
                    unread: Vec::new(),
                    closing: false,
                    dropped: false,
                },
            );
            w.log(format!("node {} holds {topic} as {name}", self.node));
            let admin = w.pulsar().admin;
            let wait = w.pulsar().wait;
            (id, admin, wait)
        };
        let producer = SimProducer {
            id,
            world: self.world.clone(),
        };
        // As the adapter, with the admin API: holding the topic, it waits
        // until the broker has no write of it pending (a dropped
        // connection's), at most one operation timeout, before the tail is
        // read; else it gives the topic up.
        if admin {
            let deadline = Instant::now() + wait;
            let mut pause = Duration::from_millis(20);
            loop {
                let pending = lock(&self.world).pulsar().pending(&topic);
                if pending == 0 {
                    break;
                }
                if Instant::now() + pause >= deadline {
                    lock(&self.world).log(format!(
                        "node {} gives {topic} up: {pending} writes still pending",
                        self.node
                    ));
                    return Err(SendError::WritesPending(format!(
                        "{topic}: {pending} writes still pending at the broker"
                    )));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(250));
            }
        }
        Ok(producer)
    }

    async fn message_limit(&self, topic: &str) -> Option<usize> {
        let mut w = lock(&self.world);
        Self::known_limit(w.pulsar(), &canonical(topic))
    }

    async fn last_seq(
        &self,
        topic: &str,
        assigned: u64,
        _strict: bool,
    ) -> Result<firstseen::publish::tail::Tail, Error> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let mut w = lock(&self.world);
        Ok(tail_of(&mut *w, self.node, topic, assigned, None))
    }

    async fn read_tail(
        &self,
        topic: &str,
        assigned: u64,
        watermark: u64,
        _strict: bool,
    ) -> Result<firstseen::publish::tail::Tail, Error> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let mut tail = tail_of(
            &mut *lock(&self.world),
            self.node,
            topic,
            assigned,
            Some(watermark),
        );
        // As the adapter's read back to the watermark: the sequences
        // between it and the tail that the topic lacks, late or not.
        let mut w = lock(&self.world);
        let there: BTreeSet<u64> = w.pulsar().messages(topic).iter().map(|m| m.seq).collect();
        let mut missing: Vec<(u64, u64)> = Vec::new();
        for seq in watermark + 1..=tail.seq.unwrap_or(0) {
            if there.contains(&seq) {
                continue;
            }
            match missing.last_mut() {
                Some((_, last)) if *last + 1 == seq => *last = seq,
                _ => missing.push((seq, seq)),
            }
        }
        if !missing.is_empty() {
            w.log(format!(
                "node {} finds {} lacking {missing:?}",
                self.node,
                canonical(topic)
            ));
        }
        tail.missing = Some(missing);
        Ok(tail)
    }

    async fn send(
        &self,
        producer: &mut SimProducer<W>,
        seq: u64,
        message: OutboxMessage,
        how: Sending,
    ) -> Result<Receipt, SendError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut w = lock(&self.world);
            let marker = how.set_aside.is_some();
            let bytes = message_bytes(&message, marker);
            let p = w.pulsar();
            let Some(pr) = p.producers.get(&producer.id) else {
                return Err(SendError::Lost("the producer was closed".into()));
            };
            let full = !pr.open.is_empty()
                && (how.alone
                    || pr.open.len() >= firstseen::publish::producer::entry::MAX_MESSAGES
                    || pr.open_bytes + bytes > pr.entry_max);
            if full {
                with_rng(&mut *w, |p, rng| p.flush(producer.id, rng))?;
            }
            let pr = w
                .pulsar()
                .producers
                .get_mut(&producer.id)
                .expect("found above");
            pr.open.push((
                Stored {
                    seq,
                    key: message.key,
                    late: how.late,
                    marker,
                    generation: how.generation,
                },
                tx,
            ));
            pr.open_bytes += bytes;
        }
        let wait = lock(&self.world).pulsar().wait;
        let deadline = Instant::now() + wait;
        let world = self.world.clone();
        let id = producer.id;
        Ok(Box::pin(async move {
            let mut rx = rx;
            let answer = match tokio::time::timeout_at(deadline, &mut rx).await {
                Ok(a) => a.ok(),
                Err(_) => {
                    // As the adapter: the producer is closed at the broker
                    // and its entries heard out; a close unanswered for
                    // the operation timeout drops the connection.
                    let line = lock(&world).pulsar().close(id);
                    if let Some(line) = line {
                        lock(&world).log(format!("no receipt in time: {line}"));
                    }
                    // A close not answered in time leaves the entry in
                    // doubt; the broker keeps the topic for the producer
                    // until its entries have settled.
                    let doubt = Instant::now() + wait;
                    while lock(&world).pulsar().still_closing(id) && Instant::now() < doubt {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    rx.try_recv().ok()
                }
            };
            match answer {
                Some(a) => a,
                None => Err(SendError::Lost("no receipt from the broker".into())),
            }
        }))
    }

    async fn flush(&self, producer: &mut SimProducer<W>) -> Result<(), SendError> {
        let mut w = lock(&self.world);
        with_rng(&mut *w, |p, rng| p.flush(producer.id, rng))
    }
}

/// The tail of `topic` as node `node` reads it (with `watermark`, as a
/// publisher taking the topic reads it): the last message of ours that is
/// not late, numbered at most `assigned`, and the newest generation in the
/// topic. A reader of a generation above 0 with a watermark gathers the
/// messages of older generations above it apart: they are not its tail.
fn tail_of<W: HasPulsar>(
    w: &mut W,
    node: u64,
    topic: &str,
    assigned: u64,
    watermark: Option<u64>,
) -> firstseen::publish::tail::Tail {
    let own = w.generation(node);
    let older_above = watermark.filter(|_| own > 0);
    let pending = w.pulsar().pending(topic);
    let messages = w.pulsar().messages(topic);
    let is_older = |m: &Stored| older_above.is_some_and(|a| m.generation < own && m.seq > a);
    let seq = messages
        .iter()
        .rev()
        .filter(|m| !m.late && !is_older(m))
        .map(|m| m.seq)
        .find(|s| *s <= assigned);
    let generation = messages.iter().map(|m| m.generation).max().unwrap_or(0);
    let older: Vec<(u64, [u8; 32])> = messages
        .iter()
        .filter(|m| is_older(m))
        .map(|m| (m.seq, m.key))
        .collect();
    let line = format!(
        "node {node} reads the tail of {}: {seq:?}, {pending} entries pending, generation {generation}{}",
        canonical(topic),
        if older.is_empty() {
            String::new()
        } else {
            format!(", {} of an older one above {older_above:?}", older.len())
        }
    );
    w.log(line);
    firstseen::publish::tail::Tail {
        seq,
        generation,
        older,
        older_above,
        ..Default::default()
    }
}

/// What `firstseen verify` would say of a topic's messages, where the
/// group assigned `1..=assigned`: each sequence exactly once; those not
/// marked late in increasing order; each late one after a higher sequence.
/// Returns every problem found.
pub fn audit(name: &str, messages: &[Stored], assigned: u64) -> Vec<String> {
    // The common case, checked often while a run settles: 1, 2, 3... in
    // order, none late.
    if messages.len() as u64 == assigned
        && messages
            .iter()
            .zip(1..)
            .all(|(m, seq)| m.seq == seq && !m.late)
    {
        return Vec::new();
    }
    let mut problems = Vec::new();
    let mut counts = BTreeMap::<u64, u32>::new();
    let mut highest = 0;
    // (seq, the highest before it) of the first few out of order.
    let mut unmarked = Vec::new();
    let mut marked_early = Vec::new();
    for m in messages {
        *counts.entry(m.seq).or_default() += 1;
        if m.late && m.seq > highest {
            marked_early.push(m.seq);
        } else if !m.late && m.seq <= highest {
            unmarked.push((m.seq, highest));
        }
        highest = highest.max(m.seq);
    }
    let doubled: Vec<u64> = counts
        .iter()
        .filter(|(_, c)| **c > 1)
        .map(|(s, _)| *s)
        .collect();
    let lost: Vec<u64> = (1..=assigned).filter(|s| !counts.contains_key(s)).collect();
    let beyond: Vec<u64> = counts.keys().copied().filter(|s| *s > assigned).collect();
    if !doubled.is_empty() || !lost.is_empty() || !beyond.is_empty() {
        problems.push(format!(
            "{name}: {} messages for {assigned} assigned; doubled {:?}; lost {:?}; never assigned {:?}",
            messages.len(),
            &doubled[..doubled.len().min(20)],
            &lost[..lost.len().min(20)],
            &beyond[..beyond.len().min(20)],
        ));
    }
    if !unmarked.is_empty() {
        problems.push(format!(
            "{name}: {} messages came after a higher sequence without being marked late (G3), (seq, after) first: {:?}",
            unmarked.len(),
            &unmarked[..unmarked.len().min(8)]
        ));
    }
    if !marked_early.is_empty() {
        problems.push(format!(
            "{name}: marked late with nothing higher before them: {:?}",
            &marked_early[..marked_early.len().min(8)]
        ));
    }
    problems
}
