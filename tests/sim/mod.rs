//! What the simulations share: a seedable generator and the seed list, and
//! the model of Pulsar ([`pulsar`]).

// Not every test binary uses every helper (the conformance test runs the
// model without seeds' checker).
#![allow(dead_code)]

pub mod pulsar;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// A run's trace and the problems its checker found.
pub type Outcome = (Vec<String>, Vec<String>);

/// How many seeds run at once: `SIM_JOBS`, or one per core. Each seed has
/// its own runtime, directory and world, so they share nothing; a seed's
/// schedule is the same whichever worker runs it.
pub fn jobs() -> usize {
    std::env::var("SIM_JOBS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}

/// Runs `run` for every seed of [`seeds`]`(default)`, [`jobs`] at a time,
/// failing on a seed that reports problems, with its replay command and the
/// end of its trace. Once one seed fails no new seed starts; of the seeds
/// that failed, the lowest is reported, so the report does not depend on
/// which worker was faster. `SIM_SEED` also prints the whole trace.
pub fn check_seeds(
    test: &str,
    default: u64,
    faults_for: Duration,
    run: impl Fn(u64) -> (Vec<String>, Vec<String>) + Sync,
) {
    let seeds = seeds(default);
    let workers = jobs().min(seeds.len()).max(1);
    let started = std::time::Instant::now();
    let next = AtomicUsize::new(0);
    let failed: Mutex<BTreeMap<u64, Outcome>> = Mutex::default();
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                while lock(&failed).is_empty() {
                    let Some(seed) = seeds.get(next.fetch_add(1, Ordering::Relaxed)) else {
                        break;
                    };
                    let (trace, problems) = run(*seed);
                    if std::env::var("SIM_SEED").is_ok() {
                        eprintln!("{}", trace.join("\n"));
                    }
                    if !problems.is_empty() {
                        lock(&failed).insert(*seed, (trace, problems));
                    }
                }
            });
        }
    });
    if let Some((seed, (trace, problems))) = lock(&failed).pop_first() {
        panic!(
            "seed {seed} (replay: SIM_SEED={seed} cargo test --test {test} -- --nocapture):\n{}\n--- trace (last 60 events) ---\n{}",
            problems[..problems.len().min(20)].join("\n"),
            trace[trace.len().saturating_sub(60)..].join("\n")
        );
    }
    eprintln!(
        "{} seeds, {faults_for:?} of faults each, {workers} at a time, in {:.1} s",
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
}
