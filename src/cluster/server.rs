//! The peer listener: authenticates each connection once, then serves the
//! requests it carries, many at a time, each answered with its own id as
//! soon as it is ready. A peer that fails the handshake, or sends an
//! oversized or undecodable frame, is disconnected with a logged reason;
//! the node itself is never affected.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use firstseen_raft::{NodeId, Raft};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::answer::{dispatch, PeerService};
use super::frames::{write_frames, FrameReader, ReadError};
use super::wire::{self, Envelope, Request};
use crate::telemetry::RefusalLog;
use crate::tls::BoxStream;

/// How long a connecting peer has to complete the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests of one connection served at once; more wait to be read.
const IN_FLIGHT_PER_CONN: usize = 256;
/// Connections that have not yet authenticated, served at once. A real
/// cluster needs a handful (one per peer, once); a flood of half-open
/// connections is refused beyond this instead of each holding a task, a
/// socket and a TLS state for the handshake timeout.
const MAX_HANDSHAKES: usize = 64;
/// Of those, what one address (an IPv6 /64) may hold. Without it a single
/// host opening connections faster than they time out holds all 64, and a
/// member's connection gets in only when one times out.
const MAX_HANDSHAKES_PER_ADDRESS: usize = 8;
/// Handshakes each member address may have under way, apart from the 64:
/// a flood from other addresses, however many, cannot hold these (G8: a
/// host that is not a member cannot keep members from reaching each other).
/// A member opens one connection per peer, so a few are plenty.
const MEMBER_HANDSHAKES: usize = 4;
/// Accepts peer connections until `shutdown`, and waits for them to end.
pub async fn serve(listener: TcpListener, service: Arc<PeerService>, shutdown: CancellationToken) {
    let tracker = TaskTracker::new();
    let admission = Arc::new(crate::peraddr::Admission::new(
        MAX_HANDSHAKES_PER_ADDRESS,
        MAX_HANDSHAKES,
        MEMBER_HANDSHAKES,
    ));
    for ip in member_ips(&service.raft).await {
        admission.learn(ip);
    }
    let refusals = Arc::new(RefusalLog::new(
        "firstseen_peer_refused_total",
        "peer connection",
    ));
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "peer accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let slot = match admission.take(peer.ip()) {
            Ok(slot) => slot,
            Err(crate::peraddr::Full::Client) => {
                refusals.refused(
                    peer,
                    "too many connections from one address still authenticating",
                );
                continue;
            }
            Err(crate::peraddr::Full::All) => {
                refusals.refused(peer, "too many connections still authenticating");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let stop = shutdown.clone();
        let refusals = refusals.clone();
        let admission = admission.clone();
        tracker.spawn(async move {
            tokio::select! {
                r = connection(stream, peer, &service, &stop, slot, &admission) => {
                    if let Err(reason) = r {
                        refusals.refused(peer, &reason.to_string());
                    }
                }
                _ = stop.cancelled() => {}
            }
        });
    }
    tracker.close();
    tracker.wait().await;
}

/// The addresses the configured members' peer addresses resolve to: the
/// members' reserve before any of them has connected. Where a member dials
/// from another address (a proxy, a NAT), its first authenticated
/// connection teaches it.
async fn member_ips(raft: &Raft) -> Vec<std::net::IpAddr> {
    let addrs: Vec<String> = raft
        .metrics()
        .borrow()
        .membership_config
        .nodes()
        .map(|(_, m)| m.addr.clone())
        .collect();
    let mut ips = Vec::new();
    for addr in addrs {
        if let Ok(Ok(found)) = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::lookup_host(addr.as_str()),
        )
        .await
        {
            ips.extend(found.map(|a| a.ip()));
        }
    }
    ips
}

/// Why a peer connection was refused or ended other than cleanly.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("TLS handshake failed: {0}")]
    Tls(#[source] std::io::Error),
    #[error("handshake timed out")]
    HandshakeTimeout,
    #[error("write failed: {0}")]
    Write(#[source] std::io::Error),
    #[error("no handshake from peer: {0}")]
    NoHandshake(#[source] std::io::Error),
    #[error(transparent)]
    Handshake(#[from] wire::HandshakeError),
    #[error("node {node}: {source}")]
    Frame {
        node: NodeId,
        #[source]
        source: ReadError,
    },
}

/// Serves one connection. Returns `Err` when the peer is refused; a clean
/// close by the peer is `Ok`.
async fn connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    svc: &Arc<PeerService>,
    stop: &CancellationToken,
    handshake_slot: crate::peraddr::Slot,
    admission: &crate::peraddr::Admission,
) -> Result<(), ConnectionError> {
    let s = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let mut s: BoxStream = match &svc.tls {
            Some(tls) => Box::new(
                tls.acceptor
                    .accept(tcp)
                    .await
                    .map_err(ConnectionError::Tls)?,
            ),
            None => Box::new(tcp),
        };
        let (node, out, inn) = handshake(&mut s, svc).await?;
        Ok::<_, ConnectionError>((s, node, out, inn))
    })
    .await
    .map_err(|_| ConnectionError::HandshakeTimeout)??;
    let (s, node, seal, check) = (s.0, s.1, s.2, s.3);
    drop(handshake_slot);
    // It proved the secret: its address gets the members' reserve from now
    // on, so a flood cannot keep it out when it connects again.
    admission.learn(peer.ip());
    tracing::debug!(peer = %peer, node, "peer authenticated");
    metrics::counter!("firstseen_peer_accepted_total").increment(1);
    let (rd, wr) = tokio::io::split(s);
    let (replies, out) = mpsc::channel::<Vec<u8>>(IN_FLIGHT_PER_CONN);
    let done = stop.child_token();
    // The connection's tasks: its writer, and one per request being served.
    let handlers = TaskTracker::new();
    let writer = handlers.spawn(write_frames(wr, seal, out, done.clone()));
    let slots = Arc::new(Semaphore::new(IN_FLIGHT_PER_CONN));
    // This connection's appends reach Raft in the order they arrived.
    let (lane, lane_task) = super::lane::Lane::new(svc.clone(), done.clone());
    handlers.spawn(lane_task);
    let mut incoming = FrameReader::new(rd, check);
    let result = loop {
        let read = tokio::select! {
            r = incoming.next::<Request>() => r,
            _ = done.cancelled() => break Ok(()),
        };
        let env = match read {
            Ok(env) => env,
            Err(ReadError::Closed) => break Ok(()),
            Err(source) => break Err(ConnectionError::Frame { node, source }),
        };
        svc.liveness.peer_seen(node);
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break Ok(());
        };
        let (svc, replies, gone) = (svc.clone(), replies.clone(), done.clone());
        // Queued here, on the reader, so that the lane has them in order.
        let laned = match env.body {
            Request::AppendEntries(r) => Ok(lane.submit(r)),
            other => Err(other),
        };
        handlers.spawn(async move {
            let _slot = slot;
            let serve = async {
                match laned {
                    // A lane that ended answers nothing: the connection is
                    // closing.
                    Ok(answer) => answer.await.ok(),
                    Err(request) => Some(dispatch(&svc, request).await),
                }
            };
            let reply = tokio::select! {
                Some(r) = serve => r,
                // The reply would have nowhere to go. What the request
                // started goes on without it: openraft still applies an
                // append, the coalescer still commits a forward, and the
                // follower repeats what it did not hear back about.
                _ = gone.cancelled() => return,
            };
            match wire::encode(&Envelope {
                id: env.id,
                body: reply,
            }) {
                Ok(frame) => {
                    let _ = replies.send(frame).await;
                }
                Err(e) => tracing::error!(error = %e, "cannot encode a peer reply"),
            }
        });
    };
    // Requests still being served (a forward waiting for its commit) stop
    // waiting: their replies have nowhere to go.
    done.cancel();
    handlers.close();
    drop(replies);
    // The writer's end is its own: a panic in it is reported, not lost.
    if let Err(e) = writer.await {
        tracing::error!(error = %e, node, "peer connection writer failed");
    }
    handlers.wait().await;
    result
}

/// Mutual authentication; returns the peer's node id and the connection's
/// frame seals (outgoing, incoming).
async fn handshake(
    s: &mut BoxStream,
    svc: &PeerService,
) -> Result<(NodeId, wire::FrameSeal, wire::FrameSeal), ConnectionError> {
    let challenge = wire::nonce();
    s.write_all(&wire::handshake::hello(&challenge))
        .await
        .map_err(ConnectionError::Write)?;
    let mut answer = [0u8; wire::handshake::CLIENT];
    s.read_exact(&mut answer)
        .await
        .map_err(ConnectionError::NoHandshake)?;
    let (node, reply) = wire::handshake::accept(&svc.key, &challenge, &answer, svc.node_id)?;
    s.write_all(&reply).await.map_err(ConnectionError::Write)?;
    let (out, inn) = wire::handshake::seals(
        &svc.key,
        &challenge,
        &wire::handshake::client_nonce(&answer),
        true,
    );
    Ok((node, out, inn))
}

#[cfg(test)]
mod tests {
    use crate::telemetry::refusal_kind;

    #[test]
    fn refusals_of_one_kind_share_a_kind_whatever_the_node_or_numbers() {
        assert_eq!(
            refusal_kind("node 9: garbled frame: bad tag 7"),
            refusal_kind("node 31: garbled frame: short read")
        );
        assert_eq!(
            refusal_kind("node 2: frame of 4294967295 bytes exceeds the limit of 67108864 bytes"),
            refusal_kind("node 5: frame of 99 bytes exceeds the limit of 8 bytes")
        );
        assert_ne!(
            refusal_kind("node 9: garbled frame: x"),
            refusal_kind("TLS handshake failed: unknown CA")
        );
        assert_eq!(
            refusal_kind("no handshake from peer: eof"),
            "no handshake from peer"
        );
    }
}
