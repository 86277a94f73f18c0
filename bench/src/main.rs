//! firstseen's benchmark tools, run by `scripts/bench.sh`:
//!
//! - `load`: publishes synthetic HFP messages (the capture's topics and
//!   payloads, each made unique and stamped with its send time) at a fixed
//!   rate, with injected upstream duplicates.
//! - `probe`: reads a Pulsar topic and reports end-to-end latency (send time
//!   in the payload to receipt by a consumer), copies per message, and the
//!   `firstseen verify` audit.
//! - `naive`: baseline (a), an HA forwarder without Raft or dedup built from
//!   the same crates (rumqttc → pulsar): run three and every message lands
//!   three times.
//! - `fanout`: baseline (b), Mosquitto's own delivery rate to three plain
//!   subscribers, the ceiling of this machine.
//! - `window`: disk bytes per key of the dedup window, on the real state
//!   machine at millions of keys.
//! - `delay`: a TCP relay that delays each direction, for zones apart.

mod bounds;
mod delay;
mod propcost;
mod sync;
mod window;

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use futures::StreamExt;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};

#[derive(Parser)]
#[command(
    name = "firstseen-bench",
    about = "Load, probe and baselines for the firstseen benchmark"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Publish synthetic HFP at a fixed rate.
    Load {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long)]
        port: u16,
        /// The HFP capture used as topic and payload templates.
        #[arg(long)]
        template: String,
        /// Messages per second (unique ones; duplicates come on top).
        #[arg(long)]
        rate: u64,
        #[arg(long)]
        secs: u64,
        /// Publish every K-th message twice (0: never).
        #[arg(long, default_value_t = 20)]
        dup_every: u64,
        /// Distinguishes runs, so keys never repeat across them.
        #[arg(long)]
        run: String,
    },
    /// Read a topic and report latency, copies and the audit.
    Probe {
        #[arg(long)]
        pulsar: String,
        #[arg(long)]
        topic: String,
        /// Unique messages expected.
        #[arg(long)]
        expect: u64,
        /// Give up this long after the last message arrived.
        #[arg(long, default_value_t = 20)]
        idle_secs: u64,
        /// Only count messages whose bench id starts with this run id.
        #[arg(long)]
        run: String,
        /// A file the driver writes a fault's time into (ms since epoch) when
        /// it causes it: report how long after it messages arrived again. A
        /// file that does not exist means no fault happened.
        #[arg(long)]
        mark_file: Option<String>,
    },
    /// Baseline (a): forward an MQTT subscription to Pulsar, no Raft, no dedup.
    Naive {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long)]
        port: u16,
        #[arg(long)]
        client_id: String,
        #[arg(long)]
        pulsar: String,
        #[arg(long)]
        topic: String,
    },
    /// Baseline (b): Mosquitto's delivery rate to `subs` plain subscribers.
    Fanout {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long)]
        port: u16,
        #[arg(long, default_value_t = 3)]
        subs: usize,
        #[arg(long, default_value_t = 100_000)]
        count: u64,
    },
    /// What a durable flush costs: sled's flush alone against sled's flush
    /// plus fdatasync, per entry appended.
    Sync {
        #[arg(long, default_value_t = 2_000)]
        count: usize,
        /// Bytes per entry (the HSL peak's entries average about 7.5 KB).
        #[arg(long, default_value_t = 7_500)]
        bytes: usize,
        /// Directory on the disk to measure (default: the temp dir).
        #[arg(long)]
        dir: Option<String>,
    },
    /// Relay TCP connections from `listen` to `to`, every byte `ms` late in
    /// each direction: the one-way latency between two zones.
    Delay {
        #[arg(long)]
        listen: std::net::SocketAddr,
        #[arg(long)]
        to: std::net::SocketAddr,
        #[arg(long)]
        ms: u64,
    },
    /// What the hostile-input bounds cost per message, against the key's
    /// blake3 hash, over the HFP capture.
    Bounds {
        /// The HFP capture.
        #[arg(long)]
        template: String,
        #[arg(long, default_value_t = 200)]
        rounds: u32,
    },
    /// Disk bytes per key of the dedup window, on the real state machine.
    Window {
        /// Keys in the window when it is measured.
        #[arg(long, default_value_t = 1_000_000)]
        keys: u64,
        /// First-seen keys per entry. 20 gives the entry rate the HSL peak
        /// profile measures: about 400 Raft entries/s for 2,000 keys/s,
        /// counting the other zones' copies and the receipts.
        #[arg(long, default_value_t = 20)]
        batch: usize,
        #[arg(long, default_value_t = 350)]
        payload_bytes: usize,
        /// Keys per second of window clock.
        #[arg(long, default_value_t = 2_000)]
        rate: u64,
    },
    /// The broker's CPU per stored message with firstseen's properties or
    /// without, by messages per entry (bench/src/propcost.rs).
    Propcost {
        #[arg(long)]
        pulsar: String,
        /// The Pulsar JVM's pid, whose CPU time is read.
        #[arg(long)]
        pulsar_pid: u32,
        #[arg(long)]
        template: String,
        #[arg(long, default_value_t = 100_000)]
        messages: u64,
        #[arg(long, default_value_t = 2_000)]
        rate: u64,
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        #[arg(long, default_value_t = 60)]
        warm_secs: u64,
        #[arg(long, default_value_t = 20)]
        idle_secs: u64,
        /// PROPS:PER_ENTRY, PROPS one of full, seven, seqkey, none.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "full:1,full:5,full:20,full:100,none:5,seqkey:5,none:20"
        )]
        cases: Vec<propcost::Case>,
    },
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// (topic, payload) pairs of the capture.
fn templates(path: &str) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let rest = line.split_once(' ').map(|p| p.1).unwrap_or("");
        if let Some(cut) = rest.find(" {") {
            out.push((rest[..cut].to_string(), rest[cut + 1..].to_string()));
        }
    }
    if out.is_empty() {
        bail!("no messages in {path}");
    }
    Ok(out)
}

/// A template payload made unique and stamped: `{"VP":{"bench":"run-n-ns",…`.
fn stamp(payload: &str, run: &str, n: u64) -> String {
    let id = format!("{{\"VP\":{{\"bench\":\"{run}-{n}-{}\",", now_ns());
    match payload.strip_prefix("{\"VP\":{") {
        Some(rest) => id + rest,
        None => id + "\"raw\":" + &serde_json::to_string(payload).unwrap_or_default() + "}}",
    }
}

/// The bench id of a payload: (run, send time in ns).
fn bench_id(payload: &[u8]) -> Option<(&str, u128)> {
    let text = std::str::from_utf8(payload).ok()?;
    let start = text.find("\"bench\":\"")? + 9;
    let end = start + text[start..].find('"')?;
    let id = &text[start..end];
    let ns = id.rsplit('-').next()?.parse().ok()?;
    Some((id, ns))
}

fn mqtt(client_id: &str, host: &str, port: u16, clean: bool) -> (AsyncClient, rumqttc::EventLoop) {
    let mut o = MqttOptions::new(client_id, host, port);
    o.set_keep_alive(Duration::from_secs(30))
        .set_clean_session(clean)
        .set_inflight(1000)
        .set_max_packet_size(1 << 20, 1 << 20);
    AsyncClient::new(o, 10_000)
}

async fn load(
    host: String,
    port: u16,
    template: String,
    rate: u64,
    secs: u64,
    dup_every: u64,
    run: String,
) -> Result<()> {
    let templates = templates(&template)?;
    let (client, mut eventloop) = mqtt(&format!("bench-load-{run}"), &host, port, true);
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = acked.clone();
    let driver = tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => {
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("load: mqtt: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    });
    let total = rate * secs;
    let started = Instant::now();
    let mut sent = 0u64;
    let mut unique = 0u64;
    // 10 ms ticks: fine enough for an even rate, coarse enough to be cheap.
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while unique < total {
        tick.tick().await;
        let due = ((started.elapsed().as_secs_f64() * rate as f64) as u64).min(total);
        while unique < due {
            let (topic, payload) = &templates[(unique as usize) % templates.len()];
            let body = stamp(payload, &run, unique);
            let copies = if dup_every > 0 && unique.is_multiple_of(dup_every) {
                2
            } else {
                1
            };
            for _ in 0..copies {
                client
                    .publish(topic.clone(), QoS::AtLeastOnce, false, body.clone())
                    .await?;
                sent += 1;
            }
            unique += 1;
        }
    }
    let publish_secs = started.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.load(std::sync::atomic::Ordering::Relaxed) < sent && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    driver.abort();
    println!(
        "{}",
        serde_json::json!({
            "sent": sent, "unique": unique, "acked_by_broker": acked.load(std::sync::atomic::Ordering::Relaxed),
            "secs": publish_secs, "rate": unique as f64 / publish_secs,
        })
    );
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

async fn probe(
    pulsar: String,
    topic: String,
    expect: u64,
    idle_secs: u64,
    run: String,
    mark_file: Option<String>,
) -> Result<()> {
    let client = pulsar::Pulsar::builder(pulsar, pulsar::TokioExecutor)
        .build()
        .await?;
    let mut consumer: pulsar::Consumer<Vec<u8>, _> = client
        .consumer()
        .with_topic(&topic)
        .with_subscription(format!("bench-probe-{}", now_ns()))
        .with_subscription_type(pulsar::SubType::Exclusive)
        .with_options(
            pulsar::ConsumerOptions::default()
                .durable(false)
                // Only what arrives from now on: the load starts after the
                // probe, and earlier runs on the same topic must not count
                // towards this one's latency.
                .with_initial_position(pulsar::consumer::InitialPosition::Latest),
        )
        .build()
        .await?;
    let mut seen = HashSet::new();
    let mut latencies = Vec::new();
    // The same latency split at the producer's send: the message's
    // `publish_time` is stamped (ms) as the producer writes it to its
    // connection. Before it: Mosquitto and the forwarder (firstseen or a
    // naive one); after it: Pulsar and the consumer.
    let mut to_send = Vec::new();
    let mut after_send = Vec::new();
    let mut received = 0u64;
    let mut worst: std::collections::BTreeMap<u64, f64> = std::collections::BTreeMap::new();
    // Receipt times (ms since epoch), for the gap a fault leaves.
    let mut receipts: Vec<u64> = Vec::new();
    let mut audit = firstseen::verify::Audit::new(&topic);
    let started = Instant::now();
    let prefix = format!("{run}-");
    while (seen.len() as u64) < expect {
        let next = tokio::time::timeout(Duration::from_secs(idle_secs), consumer.next()).await;
        let Ok(Some(msg)) = next else { break };
        let msg = msg?;
        let now = now_ns();
        // The payload as published upstream: raw, or inside the transitdata
        // envelope when the route writes that format.
        let Ok(contents) =
            firstseen::publish::format::contents_of(msg.metadata(), &msg.payload.data)
        else {
            continue;
        };
        let Some((id, sent_ns)) = bench_id(&contents.payload) else {
            continue;
        };
        if !id.starts_with(&prefix) {
            continue;
        }
        received += 1;
        receipts.push((now / 1_000_000) as u64);
        let meta = msg.metadata();
        audit.push(firstseen::verify::Seen {
            key: firstseen::publish::props::get(meta, firstseen::publish::props::KEY)
                .map(str::to_string),
            seq: firstseen::publish::props::get(meta, firstseen::publish::props::SEQ)
                .and_then(|s| s.parse().ok()),
            // The probe audits whatever system it measures, the naive
            // forwarders' producers included.
            source: firstseen::verify::Source::Ours,
            set_aside: firstseen::publish::props::get(meta, firstseen::publish::props::SET_ASIDE)
                .map(str::to_string),
            late: firstseen::publish::props::get(meta, firstseen::publish::props::LATE).is_some(),
            contents: firstseen::verify::Contents::Unchecked,
        });
        if seen.insert(id.to_string()) {
            let ms = (now.saturating_sub(sent_ns)) as f64 / 1e6;
            latencies.push(ms);
            let sent_at = u128::from(meta.publish_time) * 1_000_000;
            if sent_at > 0 {
                to_send.push(sent_at.saturating_sub(sent_ns) as f64 / 1e6);
                after_send.push(now.saturating_sub(sent_at) as f64 / 1e6);
            }
            // Worst latency per second of send time, to line spikes up with
            // what the nodes logged at that moment.
            let second = (sent_ns / 1_000_000_000) as u64;
            let slot = worst.entry(second).or_insert(0.0f64);
            *slot = slot.max(ms);
        }
    }
    for v in [&mut latencies, &mut to_send, &mut after_send] {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    }
    let split =
        |v: &[f64]| serde_json::json!({"p50": percentile(v, 0.5), "p99": percentile(v, 0.99)});
    let report = audit.finish();
    // No file: no fault was injected during this run.
    let mark_ms: Option<u64> = match mark_file.as_deref().map(std::fs::read_to_string) {
        Some(Ok(text)) => Some(
            text.trim()
                .parse()
                .with_context(|| format!("{mark_file:?} does not hold a time in ms"))?,
        ),
        Some(Err(e)) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("reading {mark_file:?}"))
        }
        _ => None,
    };
    let resumed = mark_ms.and_then(|mark| resumed_after(&receipts, mark));
    println!(
        "{}",
        serde_json::json!({
            "received": received, "unique": seen.len(), "expected": expect,
            "copies_per_message": if seen.is_empty() { 0.0 } else { received as f64 / seen.len() as f64 },
            "latency_ms": {"p50": percentile(&latencies, 0.5), "p99": percentile(&latencies, 0.99),
                           "max": latencies.last().copied().unwrap_or(f64::NAN)},
            // Whole milliseconds at the split: the producer's stamp has no
            // finer grain.
            "split_ms": {"to_producer_send": split(&to_send), "after_send": split(&after_send)},
            "verify_clean": report.is_clean(), "duplicate_messages": report.duplicate_messages,
            "missing_seqs": report.missing_seqs, "secs": started.elapsed().as_secs_f64(),
            // Seconds (since the epoch, by send time) whose worst latency
            // passed 100 ms.
            "slow_seconds": worst.iter().filter(|(_, ms)| **ms > 100.0)
                .map(|(s, ms)| serde_json::json!([s, ms.round()])).collect::<Vec<_>>(),
            "fault": resumed.map(|(gap, after)| serde_json::json!({
                "mark_ms": mark_ms, "gap_ms": gap, "resumed_after_mark_ms": after,
            })),
        })
    );
    Ok(())
}

/// The silence a fault at `mark` (ms) caused: the longest gap between two
/// receipts that starts no earlier than 1 s before the mark and ends after
/// it. Returns (gap, end of the gap − mark). Messages the old leader had sent
/// just before a SIGKILL may still land a few ms after the mark, so the gap
/// is looked for rather than the first receipt after the mark taken.
fn resumed_after(receipts: &[u64], mark: u64) -> Option<(u64, u64)> {
    receipts
        .windows(2)
        .filter(|w| w[0] + 1_000 >= mark && w[1] > mark)
        .map(|w| (w[1].saturating_sub(w[0]), w[1] - mark))
        .max_by_key(|(gap, _)| *gap)
}

async fn naive(
    host: String,
    port: u16,
    client_id: String,
    pulsar: String,
    topic: String,
) -> Result<()> {
    let client = pulsar::Pulsar::builder(pulsar, pulsar::TokioExecutor)
        .build()
        .await?;
    // Block when the client's queue is full, as a sensible forwarder would,
    // instead of failing the send with SlowDown.
    let mut producer = client
        .producer()
        .with_topic(&topic)
        .with_options(pulsar::producer::ProducerOptions {
            block_queue_if_full: true,
            ..Default::default()
        })
        .build()
        .await?;
    let (mqtt_client, mut eventloop) = mqtt(&client_id, &host, port, false);
    mqtt_client.subscribe("#", QoS::AtLeastOnce).await?;
    // Receipts are awaited off the event loop so forwarding never blocks on them.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<pulsar::producer::SendFuture>(10_000);
    tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            if let Err(e) = f.await {
                eprintln!("naive: send failed: {e}");
            }
        }
    });
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::Publish(p))) => {
                // What today's HA setups do: forward and let rumqttc ack at once.
                let f = producer.send_non_blocking(p.payload.to_vec()).await?;
                let _ = tx.send(f).await;
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!("naive: mqtt: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

async fn fanout(host: String, port: u16, subs: usize, count: u64) -> Result<()> {
    let mut handles = Vec::new();
    let topic = format!("bench/fanout/{}", now_ns());
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(subs);
    for i in 0..subs {
        let (c, mut el) = mqtt(&format!("bench-sub-{i}-{}", now_ns()), &host, port, true);
        c.subscribe(topic.clone(), QoS::AtLeastOnce).await?;
        let ready = ready_tx.clone();
        handles.push(tokio::spawn(async move {
            let mut got = 0u64;
            let mut first: Option<Instant> = None;
            loop {
                match el.poll().await {
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = ready.send(()).await;
                    }
                    Ok(Event::Incoming(Packet::Publish(_))) => {
                        first.get_or_insert_with(Instant::now);
                        got += 1;
                        if got == count {
                            return first.map(|f| f.elapsed().as_secs_f64()).unwrap_or(0.0);
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return f64::NAN,
                }
            }
        }));
    }
    for _ in 0..subs {
        ready_rx.recv().await;
    }
    let (publisher, mut el) = mqtt(&format!("bench-pub-{}", now_ns()), &host, port, true);
    tokio::spawn(async move { while el.poll().await.is_ok() {} });
    let payload = vec![b'x'; 350];
    for _ in 0..count {
        publisher
            .publish(topic.clone(), QoS::AtLeastOnce, false, payload.clone())
            .await?;
    }
    let mut rates = Vec::new();
    for h in handles {
        let secs = h.await?;
        rates.push(count as f64 / secs);
    }
    let min = rates.iter().cloned().fold(f64::INFINITY, f64::min);
    println!(
        "{}",
        serde_json::json!({"subscribers": subs, "messages": count, "rate_per_subscriber": min})
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Load {
            host,
            port,
            template,
            rate,
            secs,
            dup_every,
            run,
        } => load(host, port, template, rate, secs, dup_every, run).await,
        Cmd::Probe {
            pulsar,
            topic,
            expect,
            idle_secs,
            run,
            mark_file,
        } => probe(pulsar, topic, expect, idle_secs, run, mark_file).await,
        Cmd::Naive {
            host,
            port,
            client_id,
            pulsar,
            topic,
        } => naive(host, port, client_id, pulsar, topic).await,
        Cmd::Fanout {
            host,
            port,
            subs,
            count,
        } => fanout(host, port, subs, count).await,
        Cmd::Sync { count, bytes, dir } => {
            let out = sync::run(sync::Params { count, bytes, dir })?;
            println!("{out}");
            Ok(())
        }
        Cmd::Delay { listen, to, ms } => delay::run(listen, to, Duration::from_millis(ms)).await,
        Cmd::Bounds { template, rounds } => {
            println!("{}", bounds::run(&template, rounds)?);
            Ok(())
        }
        Cmd::Window {
            keys,
            batch,
            payload_bytes,
            rate,
        } => {
            let out = window::run(window::Params {
                keys,
                batch,
                payload_bytes,
                rate,
            })?;
            println!("{out}");
            Ok(())
        }
        Cmd::Propcost {
            pulsar,
            pulsar_pid,
            template,
            messages,
            rate,
            rounds,
            warm_secs,
            idle_secs,
            cases,
        } => {
            propcost::run(propcost::Params {
                pulsar,
                pulsar_pid,
                template,
                messages,
                rate,
                rounds,
                warm_secs,
                idle_secs,
                cases,
            })
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::resumed_after;

    #[test]
    fn the_gap_around_a_fault_is_found_despite_stragglers() {
        // Steady receipts, the fault at 1_000, two stragglers just after it,
        // then silence until 3_500.
        let receipts = [900, 950, 1_000, 1_004, 1_006, 3_500, 3_510];
        assert_eq!(resumed_after(&receipts, 1_000), Some((2_494, 2_500)));
        // Nothing after the mark: no figure rather than a made-up one.
        assert_eq!(resumed_after(&[10, 20], 1_000), None);
    }
}
