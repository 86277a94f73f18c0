//! What the broker's CPU per stored message depends on: the same HFP-like
//! messages sent at a fixed rate through firstseen's own producer
//! (`firstseen::publish::producer`), with firstseen's properties or without
//! them, in entries of a given number of messages, while the Pulsar JVM's
//! CPU time (utime + stime from `/proc/<pid>/stat`) is read before and
//! after each run.
//!
//! The cases run in rounds, one of each per round, so that the shared
//! machine's drift spreads over all of them rather than landing on one.
//! An idle stretch in each round gives the JVM's background CPU per second
//! (its timers, the bookie's flushes, GC), which is subtracted: what is
//! left is what the messages cost.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use firstseen::publish::producer::conn::Target;
use firstseen::publish::producer::entry::{Open, Outgoing};
use firstseen::publish::producer::Producers;
use firstseen::publish::{proof, props};
use firstseen::secret::ClusterKey;

/// Which of firstseen's properties a message carries.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Props {
    /// What the publisher writes for a raw-format route of a cluster of
    /// generation 0: seq, key, MQTT topic, node, first-seen time, proof.
    Full,
    /// As `Full`, with `firstseen-generation` too (a recovered cluster):
    /// the seven of the issue.
    Seven,
    /// Only `firstseen-seq` and `firstseen-key`.
    SeqKey,
    /// None at all (the partition key and event time stay: they are
    /// `SingleMessageMetadata` fields, not properties).
    None,
}

/// One measured configuration: the properties and messages per entry.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub props: Props,
    pub per_entry: usize,
}

impl std::str::FromStr for Case {
    type Err = anyhow::Error;

    /// `full:5`, `seven:20`, `seqkey:5`, `none:20`.
    fn from_str(s: &str) -> Result<Self> {
        let (p, n) = s.split_once(':').context("a case is PROPS:PER_ENTRY")?;
        let props = match p {
            "full" => Props::Full,
            "seven" => Props::Seven,
            "seqkey" => Props::SeqKey,
            "none" => Props::None,
            other => bail!("unknown property set {other}"),
        };
        let per_entry: usize = n.parse()?;
        if per_entry == 0 || per_entry > firstseen::publish::producer::entry::MAX_MESSAGES {
            bail!("messages per entry must be 1..=1000");
        }
        Ok(Case { props, per_entry })
    }
}

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = match self.props {
            Props::Full => "full",
            Props::Seven => "seven",
            Props::SeqKey => "seqkey",
            Props::None => "none",
        };
        write!(f, "{p}:{}", self.per_entry)
    }
}

pub struct Params {
    pub pulsar: String,
    pub pulsar_pid: u32,
    pub template: String,
    pub messages: u64,
    pub rate: u64,
    pub rounds: u32,
    pub warm_secs: u64,
    pub idle_secs: u64,
    pub cases: Vec<Case>,
}

/// CPU seconds (user + system) the process has used so far.
fn cpu_secs(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name may hold spaces; the fields after it do not.
    let rest = &stat[stat.rfind(')').context("no ) in stat")? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12
    // after the name (field 2), counting the state (field 3) as 0.
    let ticks: u64 = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks as f64 / hz)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Message `i` of a run: a capture line's topic and payload, a key of its
/// own, and the properties `props` says, built as the publisher builds
/// them (`publish::adapter::outgoing`: the v2 proof over the topic,
/// sequence, key, body and every other property).
fn message(
    topic: &str,
    run: &str,
    i: u64,
    t: &(String, String),
    props_of: Props,
    keys: &proof::ProofKeys,
) -> Outgoing {
    let seq = i + 1;
    let hash = blake3::hash(format!("{run}/{i}").as_bytes());
    let key_bytes: [u8; 32] = *hash.as_bytes();
    let key = hash.to_hex().to_string();
    let body = t.1.as_bytes().to_vec();
    let first_seen_ms = now_ms();
    let mut properties = match props_of {
        Props::None => Vec::new(),
        Props::SeqKey => vec![
            (props::SEQ.to_string(), seq.to_string()),
            (props::KEY.to_string(), key.clone()),
        ],
        Props::Full | Props::Seven => vec![
            (props::SEQ.to_string(), seq.to_string()),
            (props::KEY.to_string(), key.clone()),
            (props::MQTT_TOPIC.to_string(), t.0.clone()),
            (props::NODE.to_string(), "2".to_string()),
            (props::FIRST_SEEN_MS.to_string(), first_seen_ms.to_string()),
        ],
    };
    if props_of == Props::Seven {
        properties.push((props::GENERATION.to_string(), "1".to_string()));
    }
    if matches!(props_of, Props::Full | Props::Seven) {
        let view: Vec<(&str, &str)> = properties
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let p = keys.prove(&proof::Message {
            claim: proof::Claim {
                topic,
                seq,
                key: &key_bytes,
                marker: false,
                body: &body,
            },
            properties: &view,
        });
        properties.push((props::PROOF.to_string(), p));
    }
    Outgoing {
        seq,
        key,
        properties,
        event_time: first_seen_ms,
        body,
    }
}

/// What one run measured.
struct Run {
    case: Case,
    cpu: f64,
    secs: f64,
    payload_bytes: usize,
    entries: u64,
}

/// Sends `n` messages at `rate` in entries of `case.per_entry` to a fresh
/// topic, waits for every receipt, and returns the broker's CPU seconds
/// over the run (from the first send to the last receipt).
async fn one(
    p: &Params,
    templates: &[(String, String)],
    case: Case,
    n: u64,
    tag: &str,
) -> Result<Run> {
    let producers = Producers::new(Target {
        url: p.pulsar.clone(),
        proxy_to: None,
        tls: None,
        auth: None,
        timeout: Duration::from_secs(30),
    });
    let topic = format!(
        "persistent://public/default/propcost-{}-{}-{tag}",
        case.to_string().replace(':', "-"),
        now_ms()
    );
    let name = format!("propcost-{}", now_ms());
    // The lookup makes the broker serve the topic's bundle, as the
    // publisher's own lookup does before it takes a producer.
    let client = pulsar::Pulsar::builder(p.pulsar.clone(), pulsar::TokioExecutor)
        .build()
        .await?;
    let at = client.lookup_topic(topic.clone()).await?;
    let mut producer = producers
        .exclusive(at.url.as_str(), None, &topic, &name, 5 << 20)
        .await
        .map_err(|e| anyhow::anyhow!("producer on {topic}: {e:?}"))?;
    let keys = proof::ProofKeys::new(&ClusterKey::from_secret(b"propcost's secret"), &[]);
    // Receipts come in order; one task awaits them as they come.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<firstseen::publish::port::Receipt>();
    let waiter = tokio::spawn(async move {
        let mut failed = 0u64;
        while let Some(r) = rx.recv().await {
            if r.await.is_err() {
                failed += 1;
            }
        }
        failed
    });
    let every = Duration::from_secs_f64(case.per_entry as f64 / p.rate as f64);
    let cpu0 = cpu_secs(p.pulsar_pid)?;
    let start = Instant::now();
    let mut sent = 0u64;
    let mut entries = 0u64;
    let mut payload_bytes = 0usize;
    while sent < n {
        tokio::time::sleep_until((start + every.mul_f64(entries as f64)).into()).await;
        let k = (case.per_entry as u64).min(n - sent);
        for _ in 0..k {
            let t = &templates[(sent as usize) % templates.len()];
            let m = message(&topic, tag, sent, t, case.props, &keys);
            payload_bytes += Open::cost(&m);
            let r = producer
                .push(m, false)
                .await
                .map_err(|e| anyhow::anyhow!("push: {e:?}"))?;
            tx.send(r).ok();
            sent += 1;
        }
        producer
            .flush()
            .await
            .map_err(|e| anyhow::anyhow!("flush: {e:?}"))?;
        entries += 1;
    }
    drop(tx);
    let failed = waiter.await?;
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_secs(p.pulsar_pid)? - cpu0;
    if failed > 0 {
        bail!("{failed} of {n} messages were not stored");
    }
    Ok(Run {
        case,
        cpu,
        secs,
        payload_bytes,
        entries,
    })
}

fn spread(xs: &mut [f64]) -> (f64, f64, f64) {
    xs.sort_by(|a, b| a.total_cmp(b));
    (xs[0], xs[xs.len() / 2], xs[xs.len() - 1])
}

pub async fn run(p: Params) -> Result<()> {
    let templates = super::templates(&p.template)?;
    if p.warm_secs > 0 {
        eprintln!(
            "warming the broker: {} s at {} msg/s (not measured)",
            p.warm_secs, p.rate
        );
        let warm = Case {
            props: Props::Full,
            per_entry: 5,
        };
        one(&p, &templates, warm, p.warm_secs * p.rate, "warm").await?;
    }
    let mut idle = Vec::new();
    let mut runs: Vec<(u32, Run)> = Vec::new();
    for round in 0..p.rounds {
        // Rotate the order each round: no case always follows the same one.
        let mut order = p.cases.clone();
        let len = order.len().max(1);
        order.rotate_left(round as usize % len);
        let c0 = cpu_secs(p.pulsar_pid)?;
        tokio::time::sleep(Duration::from_secs(p.idle_secs)).await;
        let per_sec = (cpu_secs(p.pulsar_pid)? - c0) / p.idle_secs.max(1) as f64;
        idle.push(per_sec);
        println!("{{\"round\": {round}, \"idle_cpu_per_sec\": {per_sec:.4}}}");
        for case in order {
            let r = one(&p, &templates, case, p.messages, &format!("r{round}")).await?;
            println!(
                "{{\"round\": {round}, \"case\": \"{}\", \"messages\": {}, \"entries\": {}, \"secs\": {:.2}, \"broker_cpu_s\": {:.3}, \"payload_bytes_per_msg\": {:.1}}}",
                r.case,
                p.messages,
                r.entries,
                r.secs,
                r.cpu,
                r.payload_bytes as f64 / p.messages as f64
            );
            runs.push((round, r));
        }
    }
    let idle_mean = idle.iter().sum::<f64>() / idle.len().max(1) as f64;
    println!();
    println!(
        "idle broker CPU: {:.3} core-s/s (rounds: {})",
        idle_mean,
        idle.iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("| case | msgs/entry | entries/s | bytes/msg in the entry | broker CPU-s per 1,000 msgs, raw: min / median / max | idle subtracted: min / median / max |");
    println!("|---|---|---|---|---|---|");
    for case in &p.cases {
        let mine: Vec<&Run> = runs
            .iter()
            .filter(|(_, r)| r.case.to_string() == case.to_string())
            .map(|(_, r)| r)
            .collect();
        let k = 1000.0 / p.messages as f64;
        let mut raw: Vec<f64> = mine.iter().map(|r| r.cpu * k).collect();
        let mut net: Vec<f64> = mine
            .iter()
            .map(|r| (r.cpu - idle_mean * r.secs) * k)
            .collect();
        let (a, b, c) = spread(&mut raw);
        let (d, e, f) = spread(&mut net);
        let eps = mine.iter().map(|r| r.entries as f64 / r.secs).sum::<f64>() / mine.len() as f64;
        let bytes = mine[0].payload_bytes as f64 / p.messages as f64;
        println!(
            "| {case} | {} | {eps:.0} | {bytes:.0} | {a:.3} / {b:.3} / {c:.3} | {d:.3} / {e:.3} / {f:.3} |",
            case.per_entry
        );
    }
    Ok(())
}
