//! What the simulations share: a seedable generator and the seed list, and
//! the model of Pulsar ([`pulsar`]).

// Not every simulation publishes.
#[allow(dead_code)]
pub mod pulsar;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// splitmix64: small, seedable, and the same on every machine.
#[derive(Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// The seeds to run: `SIM_SEED=S` alone, or `SIM_SEEDS=N` (default
/// `default`) seeds from `SIM_BASE` (default: the time, so that each run
/// explores new schedules; a failure names its seed).
pub fn seeds(default: u64) -> Vec<u64> {
    if let Ok(s) = std::env::var("SIM_SEED") {
        return vec![s.parse().expect("SIM_SEED is a number")];
    }
    let n: u64 = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default);
    let base: u64 = std::env::var("SIM_BASE")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        });
    (0..n)
        .map(|i| base.wrapping_mul(1_000).wrapping_add(i))
        .collect()
}

/// Locks a model's shared state; a panic elsewhere has already failed the
/// run, so a poisoned lock is just taken.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A trace line, stamped with the simulated time since `started`.
pub fn traced(started: Instant, line: String) -> String {
    format!("{:>6} ms  {line}", started.elapsed().as_millis())
}

/// Runs `run` for every seed of [`seeds`]`(default)`, failing on the first
/// seed that reports problems, with its replay command and the end of its
/// trace. `SIM_SEED` also prints the whole trace.
pub fn check_seeds(
    test: &str,
    default: u64,
    faults_for: Duration,
    run: impl Fn(u64) -> (Vec<String>, Vec<String>),
) {
    let seeds = seeds(default);
    let started = std::time::Instant::now();
    for seed in &seeds {
        let (trace, problems) = run(*seed);
        if std::env::var("SIM_SEED").is_ok() {
            eprintln!("{}", trace.join("\n"));
        }
        assert!(
            problems.is_empty(),
            "seed {seed} (replay: SIM_SEED={seed} cargo test --test {test} -- --nocapture):\n{}\n--- trace (last 60 events) ---\n{}",
            problems[..problems.len().min(20)].join("\n"),
            trace[trace.len().saturating_sub(60)..].join("\n")
        );
    }
    eprintln!(
        "{} seeds, {faults_for:?} of faults each, in {:.1} s",
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
}
