//! `firstseen-bench bounds`: what the hostile-input bounds cost per message,
//! as a ratio to the blake3 hash every message already pays for its key.
//!
//! Two checks were added to the hot path by the hardening pass: ingest's
//! message bounds (`ingest::bound::Limits::check`) and the publisher's check
//! against the broker's limit (`publish::policy::set_aside_reason`). Both are
//! timed over the real HFP capture, plain and with a few MQTT 5 properties,
//! in the same run as the hash, so the machine's noise divides out.

use std::time::Instant;

use anyhow::{Context, Result};
use firstseen::ingest::bound::Limits;
use firstseen_store::{OutboxMessage, Properties};

pub struct Report {
    pub messages: usize,
    pub rounds: u32,
    pub hash_ns: f64,
    pub bounds_ns: f64,
    pub bounds_mqtt5_ns: f64,
    /// Bytes of a peer frame carrying a batch of 20 HFP messages.
    pub frame_bytes: usize,
    /// Encoding and decoding that frame (what every frame already costs).
    pub frame_codec_ns: f64,
    /// Sealing and opening it: the per-frame MAC, both ends.
    pub frame_mac_ns: f64,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} HFP messages x {} rounds, ns per message:",
            self.messages, self.rounds
        )?;
        writeln!(
            f,
            "  blake3 of the payload (the key)      {:8.1}",
            self.hash_ns
        )?;
        writeln!(
            f,
            "  both bounds, no properties           {:8.1}  ({:.3} of the hash)",
            self.bounds_ns,
            self.bounds_ns / self.hash_ns
        )?;
        writeln!(
            f,
            "  both bounds, 5 MQTT 5 properties     {:8.1}  ({:.3} of the hash)",
            self.bounds_mqtt5_ns,
            self.bounds_mqtt5_ns / self.hash_ns
        )?;
        writeln!(
            f,
            "a peer frame of 20 HFP messages ({} bytes), ns per frame:",
            self.frame_bytes
        )?;
        writeln!(
            f,
            "  bincode encode + decode              {:8.1}",
            self.frame_codec_ns
        )?;
        write!(
            f,
            "  MAC seal + open (both ends)          {:8.1}  ({:.3} of the codec)",
            self.frame_mac_ns,
            self.frame_mac_ns / self.frame_codec_ns
        )
    }
}

pub fn run(template: &str, rounds: u32) -> Result<Report> {
    let text = std::fs::read_to_string(template).with_context(|| template.to_string())?;
    let messages: Vec<(String, Vec<u8>)> = text
        .lines()
        .filter_map(|l| {
            let rest = l.split_once(' ')?.1;
            let cut = rest.find(" {")?;
            Some((rest[..cut].to_string(), rest.as_bytes()[cut + 1..].to_vec()))
        })
        .collect();
    anyhow::ensure!(!messages.is_empty(), "no HFP lines in {template}");
    let props = Properties {
        user: (0..5)
            .map(|i| (format!("name{i}"), format!("value-{i}")))
            .collect(),
        content_type: Some("application/json".into()),
        payload_format: Some(1),
        ..Default::default()
    };
    let limits = Limits {
        payload: 1024 * 1024,
        message: 4 * 1024 * 1024,
        topic: 4096,
        properties: 128,
    };
    let broker_limit = 5 * 1024 * 1024;
    let outbox: Vec<OutboxMessage> = messages
        .iter()
        .map(|(t, p)| OutboxMessage {
            key: [0; 32],
            mqtt_topic: t.clone(),
            payload: p.clone(),
            node: 1,
            first_seen_ms: 0,
            properties: None,
        })
        .collect();
    let with_props: Vec<OutboxMessage> = outbox
        .iter()
        .map(|m| OutboxMessage {
            properties: Some(Box::new(props.clone())),
            ..m.clone()
        })
        .collect();
    let n = (messages.len() as f64) * rounds as f64;

    let started = Instant::now();
    let mut sink = 0u8;
    for _ in 0..rounds {
        for (_, p) in &messages {
            sink ^= blake3::hash(std::hint::black_box(p)).as_bytes()[0];
        }
    }
    let hash_ns = started.elapsed().as_nanos() as f64 / n;

    let bounds = |ms: &[OutboxMessage]| {
        let started = Instant::now();
        let mut passed = 0usize;
        for _ in 0..rounds {
            for m in ms {
                let m = std::hint::black_box(m);
                if limits
                    .check(&m.mqtt_topic, &m.payload, m.properties.as_deref())
                    .is_ok()
                    && firstseen::publish::policy::set_aside_reason(
                        m,
                        broker_limit,
                        firstseen::publish::format::Format::Raw,
                    )
                    .is_none()
                {
                    passed += 1;
                }
            }
        }
        assert_eq!(passed as f64, n, "every HFP message is within the bounds");
        started.elapsed().as_nanos() as f64 / n
    };
    let bounds_ns = bounds(&outbox);
    let bounds_mqtt5_ns = bounds(&with_props);

    // A frame as a forwarded batch or an append carries it: 20 messages.
    use firstseen::cluster::wire;
    let batch: Vec<OutboxMessage> = outbox.iter().take(20).cloned().collect();
    let frames = 20_000u32;
    let started = Instant::now();
    let mut frame = Vec::new();
    for _ in 0..frames {
        frame = wire::encode(std::hint::black_box(&batch)).context("encode")?;
        let back: Vec<OutboxMessage> = wire::decode(&frame[4..]).context("decode")?;
        std::hint::black_box(back);
    }
    let frame_codec_ns = started.elapsed().as_nanos() as f64 / frames as f64;
    let key = wire::ClusterKey::from_secret(b"bench secret");
    let (mut seal, _) = wire::handshake::seals(&key, &[1; 32], &[2; 32], false);
    let (_, mut check) = wire::handshake::seals(&key, &[1; 32], &[2; 32], true);
    let started = Instant::now();
    for _ in 0..frames {
        let mut f = frame.clone();
        seal.seal(&mut f);
        let (body, mac) = f[4..].split_at(f.len() - 4 - wire::FRAME_MAC);
        let mac: [u8; wire::FRAME_MAC] = mac.try_into().expect("32 bytes");
        assert!(check.open(body, &mac));
    }
    let frame_mac_ns = started.elapsed().as_nanos() as f64 / frames as f64;
    std::hint::black_box(sink);
    Ok(Report {
        messages: messages.len(),
        rounds,
        hash_ns,
        bounds_ns,
        bounds_mqtt5_ns,
        frame_bytes: frame.len(),
        frame_codec_ns,
        frame_mac_ns,
    })
}
