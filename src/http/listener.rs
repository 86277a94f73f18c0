//! The HTTP API's listener: plain TCP, or TLS when `node.http_tls` is set.
//!
//! TLS handshakes run in their own tasks, at most [`MAX_HANDSHAKES`] at once
//! and each for at most [`HANDSHAKE_TIMEOUT`], and only finished ones reach
//! axum. Doing the handshake inside `accept` would let one client that
//! opens a connection and sends nothing stall the whole API, status page
//! and readiness probe included.
//!
//! Every connection, plain or TLS, is also bounded: one address holds at
//! most [`MAX_PER_ADDRESS`] at once, and a connection that sends nothing for
//! [`IDLE_TIMEOUT`] is closed. Without them one client could open
//! connections (or send a header a byte a minute) until the node ran out of
//! file descriptors, and the readiness probe with it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::tls::BoxStream;

/// Longest a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// TLS handshakes in progress at once; a flood beyond this is refused at
/// accept instead of each holding a task and a TLS state.
const MAX_HANDSHAKES: usize = 64;

/// Connections one client address (an IPv6 /64) may hold open at once;
/// more are closed at accept. Far above what a browser, a scraper and a
/// probe need.
pub const MAX_PER_ADDRESS: usize = 32;
/// Connections every client together may hold open at once: without it a
/// few dozen addresses, each within its own cap, held enough connections to
/// run the node out of file descriptors, and the readiness probe and the
/// peer port with it.
pub const MAX_CONNECTIONS: usize = 512;
/// A connection that sends nothing for this long, with no request waiting
/// for its answer, is closed: a keep-alive client opens a new one.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The same while the client has sent bytes the node has not answered yet:
/// a handler at work (adding a member waits for it to catch up) or a
/// request still arriving. Longer, so that a slow handler is not cut off;
/// bounded, so that a header sent a byte at a time still ends.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// A connection holding its [`crate::peraddr::Slot`], whose reads fail once
/// it has sent nothing for [`IDLE_TIMEOUT`] (or [`REQUEST_TIMEOUT`] while
/// a request waits for its answer); hyper then closes it. Hyper reads while
/// a handler runs, to notice a client that went away, so the longer bound
/// is what keeps a slow handler's connection open.
struct Bounded {
    inner: BoxStream,
    _slot: crate::peraddr::Slot,
    idle: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// Bytes came in since the node last wrote: a request is in progress.
    awaiting_answer: bool,
}

impl Bounded {
    fn new(inner: BoxStream, slot: crate::peraddr::Slot) -> Self {
        Self {
            inner,
            _slot: slot,
            idle: Box::pin(tokio::time::sleep(IDLE_TIMEOUT)),
            awaiting_answer: false,
        }
    }

    fn rearm(&mut self) {
        let bound = if self.awaiting_answer {
            REQUEST_TIMEOUT
        } else {
            IDLE_TIMEOUT
        };
        let next = tokio::time::Instant::now() + bound;
        self.idle.as_mut().reset(next);
    }
}

impl tokio::io::AsyncRead for Bounded {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut self.inner).poll_read(cx, buf) {
            std::task::Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.awaiting_answer = true;
                    self.rearm();
                }
                std::task::Poll::Ready(r)
            }
            std::task::Poll::Pending => match self.idle.as_mut().poll(cx) {
                std::task::Poll::Ready(()) => {
                    metrics::counter!("firstseen_http_connections_closed_total", "reason" => "idle")
                        .increment(1);
                    std::task::Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no request bytes within the idle timeout",
                    )))
                }
                std::task::Poll::Pending => std::task::Poll::Pending,
            },
        }
    }
}

impl tokio::io::AsyncWrite for Bounded {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let written = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(written, std::task::Poll::Ready(Ok(n)) if n > 0) && self.awaiting_answer {
            // The answer is going out: from now on the client has
            // IDLE_TIMEOUT to send its next request.
            self.awaiting_answer = false;
            self.rearm();
        }
        written
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What a handler knows about the connection a request came on.
#[derive(Clone, Copy, Debug)]
pub struct Client {
    pub addr: SocketAddr,
    /// True when the request came over TLS.
    pub tls: bool,
}

/// The listener axum serves: connections whose handshake finished.
pub struct Listener {
    ready: mpsc::Receiver<(BoxStream, Client)>,
    local: SocketAddr,
}

impl Listener {
    /// The listener, and its accept loop to run until `shutdown` (under the
    /// node's supervisor). With `tls`, every connection must complete a TLS
    /// handshake first; each handshake is a task on `tasks`.
    pub fn start(
        tcp: TcpListener,
        tls: Option<Arc<ServerConfig>>,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> std::io::Result<(Self, impl Future<Output = ()> + Send + 'static)> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(MAX_HANDSHAKES);
        let accepting = accept_loop(tcp, tls.map(TlsAcceptor::from), tx, shutdown, tasks);
        Ok((Self { ready, local }, accepting))
    }
}

async fn accept_loop(
    tcp: TcpListener,
    tls: Option<TlsAcceptor>,
    ready: mpsc::Sender<(BoxStream, Client)>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    let per_address = crate::peraddr::PerAddress::with_total(MAX_PER_ADDRESS, MAX_CONNECTIONS);
    loop {
        let (stream, addr) = tokio::select! {
            a = tcp.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and the like: wait instead of spinning.
                    tracing::warn!(error = %e, "http accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => return,
            _ = ready.closed() => return,
        };
        let slot = match per_address.take(addr.ip()) {
            Ok(slot) => slot,
            Err(full) => {
                let reason = match full {
                    crate::peraddr::Full::Client => "per_address",
                    crate::peraddr::Full::All => "total",
                };
                metrics::counter!("firstseen_http_connections_closed_total", "reason" => reason)
                    .increment(1);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Some(acceptor) = tls.clone() else {
            let client = Client { addr, tls: false };
            let stream: BoxStream = Box::new(Bounded::new(Box::new(stream), slot));
            if ready.send((stream, client)).await.is_err() {
                return;
            }
            continue;
        };
        let Ok(permit) = handshakes.clone().try_acquire_owned() else {
            metrics::counter!("firstseen_http_tls_refused_total", "reason" => "busy").increment(1);
            continue;
        };
        let ready = ready.clone();
        tasks.spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(s)) => {
                    let stream: BoxStream = Box::new(Bounded::new(Box::new(s), slot));
                    let _ = ready.send((stream, Client { addr, tls: true })).await;
                }
                // A failed handshake is the client's problem (a wrong CA on
                // its side, a plain-HTTP request, a scanner); counted, and
                // logged at debug so a flood cannot fill the log.
                Ok(Err(e)) => {
                    metrics::counter!("firstseen_http_tls_refused_total", "reason" => "handshake")
                        .increment(1);
                    tracing::debug!(client = %addr, error = %e, "http TLS handshake failed");
                }
                Err(_) => {
                    metrics::counter!("firstseen_http_tls_refused_total", "reason" => "timeout")
                        .increment(1);
                }
            }
        });
    }
}

impl axum::serve::Listener for Listener {
    type Io = BoxStream;
    type Addr = Client;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accept loop ended (shutdown): never hand out another
            // connection; axum's graceful shutdown ends the server.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(Client {
            addr: self.local,
            tls: false,
        })
    }
}

impl Connected<IncomingStream<'_, Listener>> for Client {
    fn connect_info(stream: IncomingStream<'_, Listener>) -> Self {
        *stream.remote_addr()
    }
}
