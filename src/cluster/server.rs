//! The peer listener: authenticates each connection, then answers Raft RPCs
//! and forwarded batches. A peer that fails the handshake, or sends an
//! oversized or undecodable frame, is disconnected with a logged reason; the
//! node itself is never affected.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use firstseen_raft::{NodeId, Raft};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::tls::{BoxStream, PeerTls};
use super::wire::{self, ClusterKey, ForwardError, Reply, Request};
use super::Proposer;

/// How long a connecting peer has to complete the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a frame's body may take once its header arrived.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// What a peer connection can reach on this node.
pub struct PeerService {
    pub node_id: NodeId,
    pub raft: Raft,
    pub key: ClusterKey,
    /// Commits forwarded batches when this node leads.
    pub proposer: Proposer,
    /// Set when peers must connect with TLS.
    pub tls: Option<PeerTls>,
    /// Replication that would write is refused while the disk is low.
    pub disk: Arc<crate::diskspace::DiskSpace>,
}

/// Accepts peer connections until `shutdown`.
pub async fn serve(listener: TcpListener, service: Arc<PeerService>, shutdown: CancellationToken) {
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
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                r = connection(stream, peer, &service) => {
                    if let Err(reason) = r {
                        metrics::counter!("firstseen_peer_refused_total").increment(1);
                        tracing::warn!(peer = %peer, reason = %reason, "peer connection refused");
                    }
                }
                _ = stop.cancelled() => {}
            }
        });
    }
}

/// Serves one connection. Returns `Err(reason)` when the peer is refused; a
/// clean close by the peer is `Ok`.
async fn connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    svc: &PeerService,
) -> Result<(), String> {
    let (mut s, node) = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let mut s: BoxStream = match &svc.tls {
            Some(tls) => Box::new(
                tls.acceptor
                    .accept(tcp)
                    .await
                    .map_err(|e| format!("TLS handshake failed: {e}"))?,
            ),
            None => Box::new(tcp),
        };
        let node = handshake(&mut s, svc).await?;
        Ok::<_, String>((s, node))
    })
    .await
    .map_err(|_| "handshake timed out".to_string())??;
    tracing::debug!(peer = %peer, node, "peer authenticated");
    loop {
        let mut header = [0u8; 4];
        match s.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(format!("read failed: {e}")),
        }
        let len = wire::frame_len(header).map_err(|e| format!("node {node}: {e}"))?;
        let mut body = vec![0u8; len];
        tokio::time::timeout(BODY_TIMEOUT, s.read_exact(&mut body))
            .await
            .map_err(|_| format!("node {node}: frame body timed out"))?
            .map_err(|e| format!("node {node}: read failed: {e}"))?;
        let request: Request =
            wire::decode(&body).map_err(|e| format!("node {node}: garbled frame: {e}"))?;
        let reply = dispatch(svc, request).await;
        let frame = wire::encode(&reply).map_err(|e| format!("cannot encode reply: {e}"))?;
        s.write_all(&frame)
            .await
            .map_err(|e| format!("write failed: {e}"))?;
    }
}

/// Mutual authentication; returns the peer's node id.
async fn handshake(s: &mut BoxStream, svc: &PeerService) -> Result<NodeId, String> {
    let challenge = wire::nonce();
    let mut hello = Vec::with_capacity(40);
    hello.extend_from_slice(wire::MAGIC);
    hello.extend_from_slice(&challenge);
    s.write_all(&hello)
        .await
        .map_err(|e| format!("write failed: {e}"))?;
    let mut reply = [0u8; 8 + 32 + 32];
    s.read_exact(&mut reply)
        .await
        .map_err(|e| format!("no handshake from peer: {e}"))?;
    let node = u64::from_be_bytes(reply[..8].try_into().expect("8 bytes"));
    let client_nonce: [u8; 32] = reply[8..40].try_into().expect("32 bytes");
    let proof: [u8; 32] = reply[40..].try_into().expect("32 bytes");
    if !svc.key.check_client(&challenge, node, &proof) {
        return Err(format!(
            "claims to be node {node} but does not know the cluster secret"
        ));
    }
    let answer = svc.key.server_proof(&client_nonce, svc.node_id);
    let mut out = Vec::with_capacity(40);
    out.extend_from_slice(&svc.node_id.to_be_bytes());
    out.extend_from_slice(&answer);
    s.write_all(&out)
        .await
        .map_err(|e| format!("write failed: {e}"))?;
    Ok(node)
}

async fn dispatch(svc: &PeerService, request: Request) -> Reply {
    // Refused before openraft sees it: a write that fails in sled is fatal
    // to the Raft node, and a leader carries on without this member. Empty
    // appends (heartbeats) still pass, so this node keeps its leader.
    let writes = match &request {
        Request::AppendEntries(r) => !r.entries.is_empty(),
        Request::InstallSnapshot(_) => true,
        Request::Vote(_) | Request::Forward(_) => false,
    };
    if writes {
        if let Some(reason) = svc.disk.reason() {
            return Reply::Refused(reason);
        }
    }
    match request {
        Request::AppendEntries(r) => Reply::AppendEntries(svc.raft.append_entries(r).await),
        Request::Vote(r) => Reply::Vote(svc.raft.vote(r).await),
        Request::InstallSnapshot(r) => Reply::InstallSnapshot(svc.raft.install_snapshot(r).await),
        Request::Forward(observations) => {
            Reply::Forward(svc.proposer.commit_here(observations).await)
        }
    }
}

impl From<crate::Error> for ForwardError {
    fn from(e: crate::Error) -> Self {
        ForwardError::Failed(e.to_string())
    }
}
