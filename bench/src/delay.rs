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

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Chunks held per direction of one connection before the reading side
/// waits: a bound on memory, far above what a delay of milliseconds holds
/// at the benchmark's rates.
const HELD_CHUNKS: usize = 4096;

/// Relays every connection to `listen` on to `to`, each byte `delay` late,
/// until the process is stopped.
pub async fn run(listen: SocketAddr, to: SocketAddr, delay: Duration) -> Result<()> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    loop {
        let (inbound, _) = listener.accept().await?;
        tokio::spawn(async move {
            // A node that is down refuses the relay as it would refuse
            // the peer: the inbound connection closes at once.
            let Ok(outbound) = TcpStream::connect(to).await else {
                return;
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let (ir, iw) = inbound.into_split();
            let (or, ow) = outbound.into_split();
            tokio::join!(pump(ir, ow, delay), pump(or, iw, delay));
        });
    }
}

/// Moves bytes from `from` to `to`, each chunk written `delay` after it was
/// read, in order. Ends when either side closes; the write side is shut so
/// that the far end sees the close, `delay` late like the bytes.
async fn pump<R, W>(mut from: R, mut to: W, delay: Duration)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(HELD_CHUNKS);
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        Instant::now() + delay
    });
    while let Some((due, chunk)) = rx.recv().await {
        tokio::time::sleep_until(due).await;
        if to.write_all(&chunk).await.is_err() {
            reader.abort();
            return;
        }
    }
    if let Ok(closed_at) = reader.await {
        tokio::time::sleep_until(closed_at).await;
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes arrive in order, each no sooner than the delay after it left,
    /// and the close follows them.
    #[tokio::test]
    async fn bytes_arrive_in_order_after_the_delay() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            loop {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                s.write_all(&buf[..n]).await.unwrap();
            }
        });
        let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let listen = probe.local_addr().unwrap();
        drop(probe);
        let delay = Duration::from_millis(30);
        tokio::spawn(run(listen, to, delay));
        let mut c = loop {
            match TcpStream::connect(listen).await {
                Ok(c) => break c,
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        };
        for round in 0..3u8 {
            let sent = std::time::Instant::now();
            c.write_all(&[round; 100]).await.unwrap();
            let mut got = [0u8; 100];
            c.read_exact(&mut got).await.unwrap();
            assert_eq!(got, [round; 100]);
            // There and back: the delay twice.
            assert!(sent.elapsed() >= delay * 2, "{:?}", sent.elapsed());
        }
        c.shutdown().await.unwrap();
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }
}
