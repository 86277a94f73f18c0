//! `firstseen-bench window`: disk bytes per key of the dedup window, measured
//! on the real state machine (firstseen-store over sled) at a key count the
//! cluster run cannot reach in minutes.
//!
//! The full benchmark divides a node's whole database by the keys in its
//! window, which at 60k keys is mostly fixed cost: the Raft log before its
//! first purge, sled's preallocated segments. An HSL window of one hour holds
//! millions of keys, so this applies the same commands a three-zone cluster
//! commits (each key observed by three nodes, outbox trimmed by receipts as
//! the publisher would) until the window holds `keys` keys, then reports
//! what sled keeps on disk.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use firstseen_store::{Command, Observation, StateStore};

pub struct Params {
    pub keys: u64,
    pub batch: usize,
    pub payload_bytes: usize,
    /// Keys per second of window clock: sets how far the clock moves per entry.
    pub rate: u64,
}

/// Sum of file sizes under `dir`: what `du --apparent-size` would say.
fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

pub fn run(p: Params) -> Result<serde_json::Value> {
    let dir = std::env::temp_dir().join(format!("firstseen-window-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let db = sled::Config::new()
        .path(&dir)
        .flush_every_ms(Some(1_000))
        .cache_capacity(64 * 1024 * 1024)
        .open()
        .context("opening sled")?;
    let store = StateStore::open(&db)?;
    let topic = "persistent://public/default/window";
    let payload = vec![b'x'; p.payload_bytes];
    let ms_per_batch = (p.batch as u64 * 1_000 / p.rate.max(1)).max(1);
    let mut clock = 1_700_000_000_000u64;
    let mut applied = 0u64;
    let mut next_key = 0u64;
    let started = Instant::now();
    let mut apply = |cmd: &Command| -> Result<()> {
        applied += 1;
        store.apply(Some(cmd), applied, &applied.to_be_bytes())?;
        Ok(())
    };
    while next_key < p.keys {
        let n = (p.keys - next_key).min(p.batch as u64);
        let keys: Vec<[u8; 32]> = (next_key..next_key + n)
            .map(|i| *blake3::hash(&i.to_le_bytes()).as_bytes())
            .collect();
        next_key += n;
        clock += ms_per_batch;
        // Zone a's copies come first; b and c follow in their own entries,
        // as duplicates that update each key's coverage.
        for node in 1..=3u64 {
            let observations = keys
                .iter()
                .map(|k| Observation {
                    key: *k,
                    mqtt_topic: "/hfp/v2/journey/ongoing/vp/bus/0022/01234/1010/1/Kamppi/7:01/1020107/0/60;24/19/86/98".into(),
                    pulsar_topic: topic.into(),
                    payload: payload.clone(),
                    qos: 1,
                    retain: false,
                    node,
                    received_ms: clock,
                })
                .collect();
            apply(&Command::Observe {
                stamped_ms: clock,
                window: firstseen_store::Window::from_ms(3_600_000),
                observations,
            })?;
        }
        let seq = store.topic_state(topic)?.last_seq;
        apply(&Command::Published {
            pulsar_topic: topic.into(),
            seq,
        })?;
    }
    db.flush()?;
    let secs = started.elapsed().as_secs_f64();
    let totals = store.totals()?;
    let sled_bytes = store.size_on_disk()?;
    let file_bytes = dir_bytes(&dir)?;
    drop(store);
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
    let keys = totals.window_keys.max(1) as f64;
    Ok(serde_json::json!({
        "window_keys": totals.window_keys,
        "outbox_messages": totals.outbox_messages,
        "entries_applied": applied,
        "apply_secs": (secs * 100.0).round() / 100.0,
        "keys_per_sec": (totals.window_keys as f64 / secs).round(),
        "sled_size_on_disk": sled_bytes,
        "file_bytes": file_bytes,
        "bytes_per_key": ((file_bytes as f64 / keys) * 10.0).round() / 10.0,
    }))
}
