//! `delay`: a TCP relay that holds every byte for a fixed time in each
//! direction, so that the benchmark can put distance between zones.
//!
//! Why a relay: this machine's kernel has no `sch_netem` (`tc qdisc add …
//! netem` answers "Specified qdisc kind is unknown"), and no qdisc it has
//! delays packets by a fixed time. A relay in front of each node's peer
//! port, named as that node's address in the membership, delays every
//! connection to it both ways: a request from another zone arrives `delay`
//! later, and its answer `delay` later again, as on a link with `delay` of
//! one-way latency. What it does not model: packet loss, jitter, and the
//! kernel's own buffering between the relay and the node (loopback, about
//! ten microseconds).
//!
//! Why threads and not tokio's timer: tokio's timer wheel has a resolution
//! of one millisecond and rounds every sleep up to the next tick, so a hold
//! of 1 ms was 1.5–2 ms, and the benchmark's "1 ms apart" rows measured
//! zones farther apart than they said. Each direction of a connection has
//! its own reading thread, which stamps every chunk with the moment it
//! arrived, and its own writing thread, which releases it at that moment
//! plus the delay: an OS sleep (with the thread's timer slack cut to a
//! microsecond, so the kernel does not add its default 50 µs, and a
//! real-time priority where allowed) to just before the deadline, then a
//! short spin to it.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// Chunks held per direction of one connection before the reading side
/// waits: a bound on memory, far above what a delay of milliseconds holds
/// at the benchmark's rates.
const HELD_CHUNKS: usize = 4096;

/// How long before a deadline the writing thread stops sleeping and spins:
/// about the wake-up latency of a real-time thread with the slack cut (a
/// few microseconds), so the sleep rarely overshoots, and short enough that
/// spinning costs little CPU per chunk at the benchmark's rates.
const SPIN: Duration = Duration::from_micros(10);

/// Relays every connection to `listen` on to `to`, each byte `delay` late,
/// until the process is stopped.
pub async fn run(listen: SocketAddr, to: SocketAddr, delay: Duration) -> Result<()> {
    let listener =
        std::net::TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
    // The accepting loop blocks too: nothing here needs the runtime, which
    // only hosts the caller.
    tokio::task::spawn_blocking(move || accept(listener, to, delay))
        .await
        .context("the relay's accepting thread")?
}

/// Accepts connections on `listener` and relays each to `to`.
fn accept(listener: std::net::TcpListener, to: SocketAddr, delay: Duration) -> Result<()> {
    loop {
        let (inbound, _) = listener.accept()?;
        std::thread::spawn(move || {
            // A node that is down refuses the relay as it would refuse
            // the peer: the inbound connection closes at once.
            let Ok(outbound) = TcpStream::connect(to) else {
                return;
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let (Ok(i2), Ok(o2)) = (inbound.try_clone(), outbound.try_clone()) else {
                return;
            };
            pump(inbound, outbound, delay);
            pump(o2, i2, delay);
        });
    }
}

/// What the reading thread hands the writing one.
enum Held {
    Bytes(Instant, Vec<u8>),
    /// The reading side closed (or failed) at this moment: the write side
    /// is shut then plus the delay, so the far end sees the close late
    /// like the bytes.
    Closed(Instant),
}

/// Moves bytes from `from` to `to` on two threads of their own, each chunk
/// written `delay` after it was read, in order. Ends when either side
/// closes.
fn pump(from: TcpStream, to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::sync_channel::<Held>(HELD_CHUNKS);
    // The writer shuts the reading side if its own side fails, so that the
    // reader (blocked in `read`) ends too.
    let Ok(from_for_writer) = from.try_clone() else {
        return;
    };
    std::thread::spawn(move || read_side(from, tx));
    std::thread::spawn(move || write_side(rx, to, from_for_writer, delay));
}

fn read_side(mut from: TcpStream, tx: mpsc::SyncSender<Held>) {
    precise_thread();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                // Stamped as soon as `read` returns: the hold counts from
                // the arrival, not from when the writer gets to it.
                let at = Instant::now();
                if tx.send(Held::Bytes(at, buf[..n].to_vec())).is_err() {
                    return;
                }
            }
        }
    }
    let _ = tx.send(Held::Closed(Instant::now()));
}

fn write_side(rx: mpsc::Receiver<Held>, mut to: TcpStream, from: TcpStream, delay: Duration) {
    precise_thread();
    while let Ok(held) = rx.recv() {
        match held {
            Held::Bytes(at, chunk) => {
                sleep_until(at + delay);
                #[cfg(test)]
                tests::released(at + delay);
                if to.write_all(&chunk).is_err() {
                    let _ = from.shutdown(Shutdown::Read);
                    return;
                }
            }
            Held::Closed(at) => {
                sleep_until(at + delay);
                break;
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Returns at `due`, within microseconds: sleeps to [`SPIN`] before it,
/// then spins (yielding, so a busy machine's other threads still run).
fn sleep_until(due: Instant) {
    loop {
        let now = Instant::now();
        if now >= due {
            return;
        }
        let left = due - now;
        if left > SPIN {
            std::thread::sleep(left - SPIN);
        } else {
            std::thread::yield_now();
        }
    }
}

/// Makes this thread wake when it should: timer slack cut from Linux's
/// default 50 µs to 1 µs, so a sleep ends when asked, and a real-time
/// priority (SCHED_FIFO) where allowed (root, as the benchmark and the
/// nemesis run), so that a due chunk or an arriving one does not wait for a
/// core behind the nodes and builds: on this two-core machine under load,
/// releases were up to 1.4 ms late at p99 without it and 3 µs with it. The
/// threads only sleep, block in a read or spin for [`SPIN`], so they hold
/// a core for microseconds at a time.
fn precise_thread() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and affects only the
    // calling thread; a failure leaves the default slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0);
    }
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: sets the calling thread's own policy from a valid parameter;
    // without the privilege it fails and the thread stays as it was.
    unsafe {
        libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::Mutex;

    /// How late each chunk was released, in nanoseconds: the relay's own
    /// error, without the loopback hops and wake-ups of the measurement.
    static LATENESS: Mutex<Vec<i64>> = Mutex::new(Vec::new());

    pub(super) fn released(due: Instant) {
        let late = Instant::now().saturating_duration_since(due).as_nanos() as i64;
        LATENESS.lock().unwrap().push(late);
    }

    fn quantiles(mut v: Vec<i64>) -> String {
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize] as f64 / 1e3;
        format!(
            "min {:.1} µs, p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
            at(0.0),
            at(0.5),
            at(0.99),
            at(1.0)
        )
    }

    /// Starts a relay to `to` on a free port of its own, in a runtime of
    /// its own as the binary does, and returns the address to dial.
    fn relay(to: SocketAddr, delay: Duration) -> SocketAddr {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        let listen = probe.local_addr().unwrap();
        drop(probe);
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(run(listen, to, delay))
                .unwrap();
        });
        for _ in 0..500 {
            if let Ok(c) = TcpStream::connect(listen) {
                // The relay accepted and connected on to `to`: dropping
                // this probe closes both, and the target sees a
                // connection that ends at once.
                drop(c);
                return listen;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("the relay did not start");
    }

    /// Bytes arrive intact and in order both ways, each no sooner than the
    /// delay after it left, and a close follows them.
    #[test]
    fn bytes_arrive_in_order_and_intact_after_the_delay() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let to = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in echo.incoming() {
                let mut s = s.unwrap();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => s.write_all(&buf[..n]).unwrap(),
                        }
                    }
                });
            }
        });
        let delay = Duration::from_millis(30);
        let listen = relay(to, delay);
        let mut c = TcpStream::connect(listen).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        for round in 0..3u8 {
            let sent = Instant::now();
            c.write_all(&[round; 100]).unwrap();
            let mut got = [0u8; 100];
            c.read_exact(&mut got).unwrap();
            assert_eq!(got, [round; 100]);
            // There and back: the delay twice.
            assert!(sent.elapsed() >= delay * 2, "{:?}", sent.elapsed());
        }
        // Many writes in a burst, each a run of counting bytes: they come
        // back as one stream in order, none lost, none doubled.
        let total: usize = 1 << 20;
        let data: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        let mut writer = c.try_clone().unwrap();
        let sending = std::thread::spawn(move || {
            for piece in data.chunks(1000) {
                writer.write_all(piece).unwrap();
            }
            writer.shutdown(Shutdown::Write).unwrap();
        });
        let mut back = Vec::new();
        c.read_to_end(&mut back).unwrap();
        sending.join().unwrap();
        assert_eq!(back.len(), total);
        assert!(back.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    }

    /// Figures, not a check (the team does not assert timings): how far
    /// from `delay` each hold is, for pings sent one way through the relay.
    /// Run with
    /// `cargo test --release -p firstseen-bench hold_error -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn hold_error() {
        for ms in [1u64, 10] {
            let delay = Duration::from_millis(ms);
            let sink = TcpListener::bind("127.0.0.1:0").unwrap();
            let to = sink.local_addr().unwrap();
            let base = Instant::now();
            let (tx, rx) = mpsc::channel::<Vec<i64>>();
            std::thread::spawn(move || {
                // The relay's start probe connects too and sends nothing:
                // only the connection that brings pings reports.
                for s in sink.incoming() {
                    let (mut s, tx) = (s.unwrap(), tx.clone());
                    std::thread::spawn(move || {
                        s.set_nodelay(true).unwrap();
                        precise_thread();
                        let mut errors = Vec::new();
                        let mut ping = [0u8; 8];
                        while s.read_exact(&mut ping).is_ok() {
                            let arrived = base.elapsed().as_nanos() as i64;
                            let sent = i64::from_be_bytes(ping);
                            errors.push(arrived - sent - delay.as_nanos() as i64);
                        }
                        if !errors.is_empty() {
                            let _ = tx.send(errors);
                        }
                    });
                }
            });
            let listen = relay(to, delay);
            LATENESS.lock().unwrap().clear();
            let mut c = TcpStream::connect(listen).unwrap();
            c.set_nodelay(true).unwrap();
            precise_thread();
            let pings = 3000;
            for i in 0..pings {
                let at = base.elapsed().as_nanos() as i64;
                c.write_all(&at.to_be_bytes()).unwrap();
                // Irregular gaps of 0.3 to 2.3 ms, so that pings land at
                // every phase of any timer tick.
                std::thread::sleep(Duration::from_micros(300 + (i * 7919 % 2000)));
            }
            c.shutdown(Shutdown::Write).unwrap();
            let errors = rx.recv().unwrap();
            let released = std::mem::take(&mut *LATENESS.lock().unwrap());
            println!(
                "hold {ms} ms, {} pings: end to end (arrival - sent - delay) {}; the relay's release after arrival + delay {}",
                errors.len(),
                quantiles(errors),
                quantiles(released)
            );
        }
    }
}
