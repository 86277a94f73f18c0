//! The Pulsar model of the simulations (`tests/sim/pulsar.rs`) against the
//! real broker: the same operation sequences through the publisher's
//! broker port, once on the shared standalone Pulsar through the node's own
//! adapter (`publish::adapter` over `publish::producer`), and under many
//! seeds on the model. Each run is written down as what a user of the port
//! sees: every acquisition's answer, every send's, flush's and receipt's
//! (Ok, Refused, RefusedEntry, Lost, HeldElsewhere), the tail, and what a
//! reader (the official Python client) reads back, with each message's
//! sequence and key, in order.
//!
//! Where the broker's answer depends on timing the model draws at random,
//! the model's runs give a set of outcomes: the test fails when the real
//! broker's outcome is not among them (the model is kinder, or just
//! different), and, for the lines the broker answers the same whatever the
//! timing (what is read back after a graceful close, which spelling of a
//! topic is held), when any model outcome differs from the broker's (the
//! model does what the broker never does).
//!
//! The sequences: entries in flight; a refused single entry and a refused
//! batched entry between entries that land (the topic's own
//! `maxMessageSize`, which the adapter does not know without the admin
//! API), and the next producer of the session sending one message per
//! entry; receipts after a close with entries pending; an unload under a
//! live producer; a topic held in one spelling and asked for in the other.
//! Exclusive access handed over while writes are pending in a stalled
//! storage is covered on the model only here (see
//! `a_dropped_connection_frees_the_topic_with_writes_pending_on_the_model`).

mod common;
mod sim;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use firstseen::publish::adapter::PulsarBroker;
use firstseen::publish::port::{Broker, Receipt, SendError, Sending, Session};
use firstseen::publish::tail::Ours;
use firstseen::secret::ClusterKey;
use firstseen_store::{OutboxMessage, StateStore};
use sim::pulsar::{HasPulsar, Pulsar, SimBroker};
use sim::{lock, Rng};
use tokio_util::sync::CancellationToken;

/// The adapter's operation timeout on both sides: short, so that a stall
/// of one timeout shows in seconds.
const WAIT: Duration = Duration::from_millis(3_000);
/// The topic's own `maxMessageSize` in the refusal sequences.
const POLICY: usize = 16 * 1024;
/// Model runs per sequence.
const MODEL_RUNS: u64 = 300;

/// Message `seq` with a body of `size` bytes.
fn message(seq: u64, size: usize) -> OutboxMessage {
    OutboxMessage {
        key: *blake3::hash(format!("conformance {seq}").as_bytes()).as_bytes(),
        mqtt_topic: format!("/conformance/{seq}"),
        payload: vec![b'x'; size],
        node: 1,
        first_seen_ms: 1_700_000_000_000 + seq,
        properties: None,
    }
}

/// What an answer of the port was, by kind.
fn kind(r: &Result<(), SendError>) -> String {
    match r {
        Ok(()) => "Ok".into(),
        Err(SendError::Refused(_)) => "Refused".into(),
        Err(SendError::RefusedEntry { messages, .. }) => format!("RefusedEntry({messages})"),
        Err(SendError::Lost(_)) => "Lost".into(),
        Err(SendError::HeldElsewhere(_)) => "HeldElsewhere".into(),
        #[allow(unreachable_patterns)]
        Err(other) => format!("{other:?}")
            .split('(')
            .next()
            .unwrap_or("?")
            .to_string(),
    }
}

/// One side of the comparison: the real broker or the model.
trait Side {
    type B: Broker;
    fn broker(&self) -> &Self::B;
    /// The topic's own `maxMessageSize`, in force before it returns.
    fn policy(&self, topic: &str, bytes: usize) -> impl Future<Output = ()>;
    /// The admin API's unload of the topic.
    fn unload(&self, topic: &str) -> impl Future<Output = ()>;
    /// What a reader reads back: (firstseen-seq, firstseen-key) in order.
    fn read(&self, topic: &str) -> impl Future<Output = Vec<(u64, String)>>;
}

type Producer<S> = <<<S as Side>::B as Broker>::Session as Session>::Producer;
type Sess<S> = <<S as Side>::B as Broker>::Session;

/// The outcome of one run, line by line.
#[derive(Default)]
struct Log(Vec<String>);

impl Log {
    fn say(&mut self, line: impl Into<String>) {
        self.0.push(line.into());
    }

    /// A reader's view: the sequences in order, and whether each carries
    /// its own key.
    fn read(&mut self, what: &str, back: &[(u64, String)]) {
        let seqs: Vec<u64> = back.iter().map(|(s, _)| *s).collect();
        self.say(format!("{what}: read {seqs:?}"));
        let wrong: Vec<u64> = back
            .iter()
            .filter(|(s, k)| *k != hex::encode(message(*s, 0).key))
            .map(|(s, _)| *s)
            .collect();
        self.say(format!("{what}: keys not their own {wrong:?}"));
    }
}

/// Queues `seqs` (bodies of `size` bytes) on `producer` and flushes them
/// as one entry, writing down each send's and the flush's answer; returns
/// the receipts.
async fn entry<S: Side>(
    log: &mut Log,
    session: &Sess<S>,
    producer: &mut Producer<S>,
    seqs: std::ops::RangeInclusive<u64>,
    size: usize,
) -> Vec<(u64, Receipt)> {
    let mut receipts = Vec::new();
    for seq in seqs.clone() {
        match session
            .send(producer, seq, message(seq, size), Sending::default())
            .await
        {
            Ok(r) => receipts.push((seq, r)),
            Err(e) => log.say(format!("send {seq}: {}", kind(&Err(e)))),
        }
    }
    let flushed = session.flush(producer).await;
    log.say(format!("flush {seqs:?}: {}", kind(&flushed)));
    receipts
}

/// Awaits `receipts` in order, writing each answer down, and whether any
/// took the whole operation timeout (the model never stalls so).
async fn receipts(log: &mut Log, receipts: Vec<(u64, Receipt)>) {
    let started = tokio::time::Instant::now();
    for (seq, r) in receipts {
        let answer = r.await;
        log.say(format!("receipt {seq}: {}", kind(&answer)));
    }
    if started.elapsed() >= WAIT {
        log.say("a receipt waited out the operation timeout");
    }
}

/// Takes `topic` exclusively, trying again every 50 ms for up to 10 s
/// while refused; writes down the kinds of answer in order, each once.
async fn acquire<S: Side>(
    log: &mut Log,
    what: &str,
    session: &Sess<S>,
    topic: &str,
) -> Option<Producer<S>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut answers: Vec<String> = Vec::new();
    let got = loop {
        let r = session.exclusive(topic, "conformance").await;
        let k = kind(&r.as_ref().map(|_| ()).map_err(Clone::clone));
        if answers.last() != Some(&k) {
            answers.push(k);
        }
        match r {
            Ok(p) => break Some(p),
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(_) => break None,
        }
    };
    log.say(format!("{what}: {}", answers.join(" then ")));
    got
}

/// Several entries in flight at once, all landing.
async fn in_flight<S: Side>(side: &S, topic: &str) -> Vec<String> {
    let mut log = Log::default();
    let session = side.broker().connect().await.expect("connects");
    let Some(mut p) = acquire::<S>(&mut log, "acquire", &session, topic).await else {
        return log.0;
    };
    let mut all = Vec::new();
    for seqs in [1..=4, 5..=8, 9..=12] {
        all.extend(entry::<S>(&mut log, &session, &mut p, seqs, 100).await);
    }
    receipts(&mut log, all).await;
    let tail = session.last_seq(topic, 12, true).await.map(|t| t.seq);
    log.say(format!("tail {tail:?}"));
    log.read("topic", &side.read(topic).await);
    log.0
}

/// An entry over the topic's own bound between two that land: `batched`,
/// six messages that only together are too large, else one message too
/// large alone. After it, a send on the same producer, and a new producer
/// of the same session sending four messages that only together are too
/// large.
async fn refused<S: Side>(side: &S, topic: &str, batched: bool) -> Vec<String> {
    let mut log = Log::default();
    side.policy(topic, POLICY).await;
    let session = side.broker().connect().await.expect("connects");
    let Some(mut p) = acquire::<S>(&mut log, "acquire", &session, topic).await else {
        return log.0;
    };
    let mut all = entry::<S>(&mut log, &session, &mut p, 1..=3, 100).await;
    if batched {
        all.extend(entry::<S>(&mut log, &session, &mut p, 4..=9, 4 * 1024).await);
    } else {
        all.extend(entry::<S>(&mut log, &session, &mut p, 4..=4, 40 * 1024).await);
        all.extend(entry::<S>(&mut log, &session, &mut p, 5..=9, 100).await);
    }
    all.extend(entry::<S>(&mut log, &session, &mut p, 10..=12, 100).await);
    receipts(&mut log, all).await;
    let after = entry::<S>(&mut log, &session, &mut p, 13..=13, 100).await;
    receipts(&mut log, after).await;
    drop(p);
    let tail = session.last_seq(topic, 13, true).await.map(|t| t.seq);
    log.say(format!("tail {tail:?}"));
    let Some(mut p) = acquire::<S>(&mut log, "acquire again", &session, topic).await else {
        return log.0;
    };
    let next = entry::<S>(&mut log, &session, &mut p, 14..=17, 5 * 1024).await;
    receipts(&mut log, next).await;
    drop(p);
    log.read("topic", &side.read(topic).await);
    log.0
}

/// The producer is closed with three entries on their way; then the topic
/// is taken again.
async fn close_with_pending<S: Side>(side: &S, topic: &str) -> Vec<String> {
    let mut log = Log::default();
    let session = side.broker().connect().await.expect("connects");
    let Some(mut p) = acquire::<S>(&mut log, "acquire", &session, topic).await else {
        return log.0;
    };
    let mut all = Vec::new();
    for seqs in [1..=4, 5..=8, 9..=12] {
        all.extend(entry::<S>(&mut log, &session, &mut p, seqs, 100).await);
    }
    drop(p);
    receipts(&mut log, all).await;
    let other = side.broker().connect().await.expect("connects");
    let p = acquire::<S>(&mut log, "acquire again", &other, topic).await;
    let tail = other.last_seq(topic, 12, true).await.map(|t| t.seq);
    log.say(format!("tail {tail:?}"));
    drop(p);
    log.read("topic", &side.read(topic).await);
    log.0
}

/// The topic is unloaded under a producer whose entries all landed; the
/// producer sends again, then the topic is taken again.
async fn unload<S: Side>(side: &S, topic: &str) -> Vec<String> {
    let mut log = Log::default();
    let session = side.broker().connect().await.expect("connects");
    let Some(mut p) = acquire::<S>(&mut log, "acquire", &session, topic).await else {
        return log.0;
    };
    let first = entry::<S>(&mut log, &session, &mut p, 1..=4, 100).await;
    receipts(&mut log, first).await;
    side.unload(topic).await;
    let after = entry::<S>(&mut log, &session, &mut p, 5..=8, 100).await;
    receipts(&mut log, after).await;
    drop(p);
    let Some(mut p) = acquire::<S>(&mut log, "acquire again", &session, topic).await else {
        return log.0;
    };
    let tail = session.last_seq(topic, 8, true).await.map(|t| t.seq);
    log.say(format!("tail {tail:?}"));
    let from = tail.ok().flatten().unwrap_or(0) + 1;
    let more = entry::<S>(&mut log, &session, &mut p, from..=from + 3, 100).await;
    receipts(&mut log, more).await;
    drop(p);
    log.read("topic", &side.read(topic).await);
    log.0
}

/// The topic held in its full spelling, asked for in its short one from
/// another connection; then taken in the short one and written to.
async fn names<S: Side>(side: &S, long: &str) -> Vec<String> {
    let short = long
        .strip_prefix("persistent://public/default/")
        .expect("in public/default");
    let mut log = Log::default();
    let a = side.broker().connect().await.expect("connects");
    let b = side.broker().connect().await.expect("connects");
    let Some(mut p) = acquire::<S>(&mut log, "acquire long", &a, long).await else {
        return log.0;
    };
    let second = b.exclusive(short, "conformance").await.map(|_| ());
    log.say(format!("acquire short meanwhile: {}", kind(&second)));
    let first = entry::<S>(&mut log, &a, &mut p, 1..=3, 100).await;
    receipts(&mut log, first).await;
    drop(p);
    let Some(mut q) = acquire::<S>(&mut log, "acquire short", &b, short).await else {
        return log.0;
    };
    let tail = b.last_seq(short, 6, true).await.map(|t| t.seq);
    log.say(format!("tail by the short name {tail:?}"));
    let next = entry::<S>(&mut log, &b, &mut q, 4..=6, 100).await;
    receipts(&mut log, next).await;
    drop(q);
    log.read("long", &side.read(long).await);
    log.read("short", &side.read(short).await);
    log.0
}

// ----- The real side -----

struct Real {
    pulsar: common::Pulsar,
    broker: PulsarBroker,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Real {
    /// The node's adapter on the shared broker; `admin`: with the admin
    /// API, through which it reads topic policies.
    fn new(pulsar: &common::Pulsar, admin: bool) -> Real {
        let dir = tempfile::TempDir::new().unwrap();
        let key = ClusterKey::from_secret(b"a conformance test's secret, thirty-two bytes or more");
        let db = sled::open(dir.path().join("state")).unwrap();
        let mut config = firstseen::config::PulsarConfig::new(pulsar.url.clone());
        config.admin_url = admin.then(|| pulsar.admin_url.clone());
        config.operation_timeout_ms = WAIT.as_millis() as u64;
        Real {
            pulsar: pulsar.clone(),
            broker: PulsarBroker {
                config,
                state: StateStore::open(&db).unwrap(),
                ours: Ours::new(&key, &[], false),
            },
            http: reqwest::Client::new(),
            _dir: dir,
        }
    }

    async fn admin(&self, method: reqwest::Method, path: &str, body: Option<String>) -> String {
        let mut r = self
            .http
            .request(method.clone(), format!("{}{path}", self.pulsar.admin_url));
        if let Some(b) = body {
            r = r.header("Content-Type", "application/json").body(b);
        }
        let answer = r.send().await.expect("the admin API answers");
        let status = answer.status();
        let text = answer.text().await.unwrap_or_default();
        assert!(status.is_success(), "{method} {path}: {status} {text}");
        text
    }
}

impl Side for Real {
    type B = PulsarBroker;

    fn broker(&self) -> &PulsarBroker {
        &self.broker
    }

    async fn policy(&self, topic: &str, bytes: usize) {
        let path = topic.strip_prefix("persistent://").unwrap();
        self.admin(
            reqwest::Method::PUT,
            &format!("/admin/v2/persistent/{path}"),
            None,
        )
        .await;
        let policy = format!("/admin/v2/persistent/{path}/maxMessageSize");
        // Topic policies travel through a system topic: set until read back.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            self.admin(reqwest::Method::POST, &policy, Some(bytes.to_string()))
                .await;
            if self.admin(reqwest::Method::GET, &policy, None).await.trim() == bytes.to_string() {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "the topic's policy");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn unload(&self, topic: &str) {
        let path = topic.strip_prefix("persistent://").unwrap();
        self.admin(
            reqwest::Method::PUT,
            &format!("/admin/v2/persistent/{path}/unload"),
            None,
        )
        .await;
    }

    async fn read(&self, topic: &str) -> Vec<(u64, String)> {
        let (url, topic) = (self.pulsar.url.clone(), topic.to_string());
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("python3")
                .arg(repo().join("tests/tools/pulsar_read.py"))
                .args(["--url", &url, "--topic", &topic, "--with-properties"])
                .stderr(std::process::Stdio::null())
                .output()
                .expect("run pulsar_read.py")
        })
        .await
        .unwrap();
        assert!(out.status.success(), "pulsar_read.py failed");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        v["properties"]
            .as_array()
            .expect("properties")
            .iter()
            .map(|p| {
                (
                    p["firstseen-seq"].as_str().unwrap().parse().unwrap(),
                    p["firstseen-key"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }
}

// ----- The model side -----

struct World {
    pulsar: Pulsar,
    rng: Rng,
    trace: Vec<String>,
}

impl HasPulsar for World {
    fn pulsar(&mut self) -> &mut Pulsar {
        &mut self.pulsar
    }
    fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }
    fn log(&mut self, line: String) {
        self.trace.push(line);
    }
}

struct Model {
    world: Arc<Mutex<World>>,
    broker: SimBroker<World>,
}

impl Model {
    fn new(seed: u64, admin: bool) -> Model {
        let mut pulsar = Pulsar::default();
        pulsar.admin = admin;
        pulsar.wait = WAIT;
        let world = Arc::new(Mutex::new(World {
            pulsar,
            rng: Rng(seed),
            trace: Vec::new(),
        }));
        Model {
            broker: SimBroker {
                node: 1,
                world: world.clone(),
            },
            world,
        }
    }
}

impl Side for Model {
    type B = SimBroker<World>;

    fn broker(&self) -> &SimBroker<World> {
        &self.broker
    }

    async fn policy(&self, topic: &str, bytes: usize) {
        lock(&self.world).pulsar.set_policy(topic, Some(bytes));
    }

    async fn unload(&self, topic: &str) {
        let mut w = lock(&self.world);
        sim::pulsar::logged(&mut *w, |p, rng| p.unload(topic, rng));
    }

    async fn read(&self, topic: &str) -> Vec<(u64, String)> {
        // A reader comes later than the last answer: what is pending lands.
        tokio::time::sleep(Duration::from_secs(1)).await;
        lock(&self.world)
            .pulsar
            .messages(topic)
            .iter()
            .map(|m| (m.seq, hex::encode(m.key)))
            .collect()
    }
}

/// The model's outcomes of `sequence` over [`MODEL_RUNS`] seeds, each on
/// tokio's paused clock with the model's storage running.
fn model_outcomes<F, Fut>(admin: bool, sequence: F) -> BTreeSet<Vec<String>>
where
    F: Fn(Model) -> Fut,
    Fut: Future<Output = Vec<String>>,
{
    (0..MODEL_RUNS)
        .map(|seed| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let model = Model::new(seed, admin);
                let stop = CancellationToken::new();
                let disk = tokio::spawn(sim::pulsar::disk(
                    model.world.clone(),
                    stop.clone(),
                    (1, 8),
                    4,
                ));
                let out = sequence(model).await;
                stop.cancel();
                disk.await.unwrap();
                out
            })
        })
        .collect()
}

/// Fails unless the broker's outcome is one the model allows, and unless
/// every model outcome agrees with the broker on the lines starting with
/// one of `fixed` (what the broker answers whatever the timing).
fn compare(what: &str, real: &[String], model: &BTreeSet<Vec<String>>, fixed: &[&str]) {
    let shown = |o: &[String]| o.join("\n    ");
    eprintln!("{what}: the broker:\n    {}", shown(real));
    eprintln!("{what}: {} distinct model outcomes", model.len());
    if !model.contains(real) {
        // The model outcome nearest the broker's, by lines in common.
        let nearest = model
            .iter()
            .max_by_key(|o| o.iter().zip(real).filter(|(a, b)| a == b).count())
            .expect("the model ran");
        let differ: Vec<String> = real
            .iter()
            .zip(nearest.iter().chain(std::iter::repeat(&String::new())))
            .filter(|(a, b)| a != b)
            .map(|(a, b)| format!("broker: {a:?} / model: {b:?}"))
            .collect();
        panic!(
            "{what}: the broker did what the model never does ({} model outcomes):\n  {}\nthe nearest model outcome:\n    {}",
            model.len(),
            differ.join("\n  "),
            shown(nearest)
        );
    }
    let of = |o: &[String]| -> Vec<String> {
        o.iter()
            .filter(|l| fixed.iter().any(|f| l.starts_with(f)))
            .cloned()
            .collect()
    };
    for o in model {
        assert_eq!(
            of(o),
            of(real),
            "{what}: the model does what the broker does not, whatever the timing:\n    {}",
            shown(o)
        );
    }
}

/// Runs `sequence` on the broker (a fresh topic named after `name`) and on
/// the model, and compares.
fn conform<F, G, Fut1, Fut2>(name: &str, admin: bool, fixed: &[&str], real: F, model: G)
where
    F: FnOnce(Real, String) -> Fut1,
    Fut1: Future<Output = Vec<String>>,
    G: Fn(Model, String) -> Fut2,
    Fut2: Future<Output = Vec<String>>,
{
    let Some(pulsar) = shared_pulsar(name) else {
        return;
    };
    let topic = unique_topic(&format!("conformance-{name}"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let broker = rt.block_on(real(Real::new(&pulsar, admin), topic.clone()));
    let outcomes = model_outcomes(admin, |m| model(m, topic.clone()));
    compare(name, &broker, &outcomes, fixed);
}

#[test]
fn entries_in_flight() {
    conform(
        "in-flight",
        true,
        &["tail", "topic:"],
        |s, t| async move { in_flight(&s, &t).await },
        |m, t| async move { in_flight(&m, &t).await },
    );
}

#[test]
fn a_refused_single_entry_between_entries_that_land() {
    conform(
        "refused-single",
        false,
        &["tail", "topic:", "receipt"],
        |s, t| async move { refused(&s, &t, false).await },
        |m, t| async move { refused(&m, &t, false).await },
    );
}

#[test]
fn a_refused_batched_entry_between_entries_that_land() {
    conform(
        "refused-batch",
        false,
        &["tail", "topic:", "receipt", "a receipt waited"],
        |s, t| async move { refused(&s, &t, true).await },
        |m, t| async move { refused(&m, &t, true).await },
    );
}

#[test]
fn receipts_after_a_close_with_entries_pending() {
    conform(
        "close",
        true,
        &["tail", "topic:"],
        |s, t| async move { close_with_pending(&s, &t).await },
        |m, t| async move { close_with_pending(&m, &t).await },
    );
}

#[test]
fn an_unload_under_a_live_producer() {
    conform(
        "unload",
        true,
        &[],
        |s, t| async move { unload(&s, &t).await },
        |m, t| async move { unload(&m, &t).await },
    );
}

#[test]
fn a_topic_in_both_spellings_is_one_topic() {
    conform(
        "names",
        true,
        &["acquire short meanwhile", "tail", "long:", "short:"],
        |s, t| async move { names(&s, &t).await },
        |m, t| async move { names(&m, &t).await },
    );
}

/// Exclusive access handed over with writes pending, on the model: the
/// topic's storage stalls for 7 s, the holder's connection drops with
/// entries sent; another producer takes the topic at once. Without the
/// admin API (no fence) it reads a tail without them, and they land later,
/// before its own entries: some sequences twice (what tests/fence.rs saw on
/// the real broker without the fence). With it, the adapter gives the
/// topic up (`WritesPending`) until they have landed, and nothing is
/// twice. The real broker's side needs a stalled bookie: tests/fence.rs.
#[test]
fn a_dropped_connection_frees_the_topic_with_writes_pending_on_the_model() {
    const TOPIC: &str = "persistent://public/default/conformance-pending";
    let handover = |m: Model| async move {
        let mut log = Log::default();
        let a = m.broker().connect().await.unwrap();
        let Some(mut p) = acquire::<Model>(&mut log, "acquire", &a, TOPIC).await else {
            return log.0;
        };
        let first = entry::<Model>(&mut log, &a, &mut p, 1..=4, 100).await;
        receipts(&mut log, first).await;
        lock(&m.world).pulsar.stall(TOPIC, true);
        let world = m.world.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(7)).await;
            lock(&world).pulsar.stall(TOPIC, false);
        });
        let pending = entry::<Model>(&mut log, &a, &mut p, 5..=8, 100).await;
        {
            let mut w = lock(&m.world);
            sim::pulsar::logged(&mut *w, |p, rng| p.cut(1, rng));
        }
        receipts(&mut log, pending).await;
        let b = m.broker().connect().await.unwrap();
        let Some(mut q) = acquire::<Model>(&mut log, "acquire elsewhere", &b, TOPIC).await else {
            return log.0;
        };
        let tail = b.last_seq(TOPIC, 8, true).await.map(|t| t.seq);
        log.say(format!("tail {tail:?}"));
        let from = tail.ok().flatten().unwrap_or(0) + 1;
        let next = entry::<Model>(&mut log, &b, &mut q, from..=from + 3, 100).await;
        receipts(&mut log, next).await;
        log.read("topic", &m.read(TOPIC).await);
        drop((p, q));
        log.0
    };
    // Some of the dropped producer's writes landed after the tail was
    // read: their sequences are in the topic twice.
    let twice = |o: &Vec<String>| {
        let read = o.iter().find(|l| l.starts_with("topic: read")).unwrap();
        let seqs: Vec<&str> = read
            .trim_start_matches("topic: read [")
            .trim_end_matches(']')
            .split(", ")
            .collect();
        seqs.len() > seqs.iter().collect::<BTreeSet<_>>().len()
    };
    let unfenced = model_outcomes(false, handover);
    assert!(
        unfenced
            .iter()
            .all(|o| o.iter().any(|l| l == "acquire elsewhere: Ok")),
        "the topic was free at once: {unfenced:#?}"
    );
    assert!(
        unfenced.iter().any(twice),
        "the model never lands a dropped producer's pending writes after the next one read the tail"
    );
    let fenced = model_outcomes(true, handover);
    for o in &fenced {
        assert!(!twice(o), "fenced, yet twice:\n{}", o.join("\n"));
    }
    assert!(
        fenced.iter().any(|o| o
            .iter()
            .any(|l| l == "acquire elsewhere: WritesPending then Ok")),
        "the fence never held: {fenced:#?}"
    );
}
