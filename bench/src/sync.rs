//! `firstseen-bench sync`: what a durable flush costs on this machine's disk.
//!
//! Appends entries of `bytes` bytes to a sled database, one flush after each,
//! first with sled's own flush (`sync_file_range` on Linux: not durable),
//! then with firstseen's sync (`firstseen_store::disk::Db::sync`: sled's
//! flush, then `fdatasync`), and reports the latency of each kind. One Raft
//! group commit costs one such sync, whatever it covers.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use firstseen_store::disk::{Db, Options};

pub struct Params {
    pub count: usize,
    pub bytes: usize,
    /// Where the databases go (the disk that is measured).
    pub dir: Option<String>,
}

fn summary(mut us: Vec<u64>) -> serde_json::Value {
    us.sort_unstable();
    let at = |q: f64| us[((us.len() as f64 * q) as usize).min(us.len() - 1)];
    let mean = us.iter().sum::<u64>() as f64 / us.len() as f64;
    serde_json::json!({
        "count": us.len(),
        "mean_us": mean.round(),
        "p50_us": at(0.5),
        "p99_us": at(0.99),
        "max_us": us[us.len() - 1],
        "per_sec": if mean > 0.0 { (1e6 / mean).round() } else { 0.0 },
    })
}

fn run_one(dir: &Path, p: &Params, durable: bool) -> Result<serde_json::Value> {
    let _ = std::fs::remove_dir_all(dir);
    let options = Options {
        cache_bytes: 64 << 20,
        flush_every_ms: None,
    };
    let db = if durable {
        Db::open("log", dir, options).context("open")?
    } else {
        let sled = sled::Config::new()
            .path(dir)
            .flush_every_ms(None)
            .cache_capacity(options.cache_bytes)
            .open()
            .context("open")?;
        Db::wrap("log", sled)
    };
    let tree = db.sled().open_tree("raft_log")?;
    let value = vec![b'x'; p.bytes];
    let mut us = Vec::with_capacity(p.count);
    for i in 0..p.count as u64 {
        tree.insert(i.to_be_bytes(), value.as_slice())?;
        let t = Instant::now();
        if durable {
            db.sync()?;
        } else {
            db.sled().flush()?;
        }
        us.push(t.elapsed().as_micros() as u64);
        // Paced like a busy cluster's appends, not back to back.
        std::thread::sleep(Duration::from_micros(200));
    }
    drop(tree);
    drop(db);
    let _ = std::fs::remove_dir_all(dir);
    Ok(summary(us))
}

pub fn run(p: Params) -> Result<serde_json::Value> {
    let base = p
        .dir
        .clone()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("firstseen-sync-{}", std::process::id()));
    let flush_only = run_one(&base.join("flush"), &p, false)?;
    let durable = run_one(&base.join("durable"), &p, true)?;
    let _ = std::fs::remove_dir_all(&base);
    let ratio = durable["mean_us"].as_f64().unwrap_or(0.0)
        / flush_only["mean_us"].as_f64().unwrap_or(1.0).max(1.0);
    Ok(serde_json::json!({
        "entry_bytes": p.bytes,
        "sled_flush_only": flush_only,
        "durable_sync": durable,
        "durable_over_flush": (ratio * 100.0).round() / 100.0,
    }))
}
