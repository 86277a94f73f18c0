//! Dialling a peer: the TCP connection (from the node's source address,
//! with keepalive), TLS when configured, and the handshake that proves both
//! ends know the cluster's secret and which member answered
//! ([`Dialer::dial`]).
//!
//! Apart from the links and their connections (`peers.rs`): how a
//! connection is made and proven changes with security and deployment
//! (TLS, the secret, a source address), not with how requests are carried
//! on it once made; a caller never waits on this directly (a dial runs in
//! a task of its own, see `peers.rs`).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use firstseen_raft::NodeId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

use super::super::wire::{self, ClusterKey};
use super::CallError;
use crate::tls::{BoxStream, PeerTls};

/// Bounds the connect, the TLS handshake and the peer handshake, each.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection's frame seals: (outgoing, incoming).
pub(super) type Seals = (wire::FrameSeal, wire::FrameSeal);

/// What this node needs to reach and prove itself to a peer.
pub(super) struct Dialer {
    /// This node's id, which the handshake proves to the peer.
    pub(super) me: NodeId,
    /// The key derived from the cluster's secret, that both ends prove.
    pub(super) key: ClusterKey,
    /// Outgoing connections come from this address when set, so that a
    /// node's traffic has one source address (firewalls, and the fault
    /// tests' proxies, rely on it).
    pub(super) source_ip: Option<IpAddr>,
    /// TLS around the connection, when configured.
    pub(super) tls: Option<PeerTls>,
}

/// A peer for the tests, from the tests below.
#[cfg(test)]
pub(super) use tests::{node_one, slow_peer};

impl Dialer {
    /// Connects, runs TLS if configured, and authenticates member `node`.
    pub(super) async fn dial(
        &self,
        node: NodeId,
        addr: &str,
    ) -> Result<(BoxStream, NodeId, Seals), CallError> {
        let unreachable = |reason: String| CallError::Unreachable {
            addr: addr.to_string(),
            reason,
        };
        let target: SocketAddr = tokio::net::lookup_host(addr)
            .await
            .map_err(|e| unreachable(e.to_string()))?
            .next()
            .ok_or_else(|| unreachable("no address".into()))?;
        let socket = if target.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }
        .map_err(|e| unreachable(e.to_string()))?;
        if let Some(ip) = self.source_ip {
            if ip.is_ipv4() == target.is_ipv4() {
                socket
                    .bind(SocketAddr::new(ip, 0))
                    .map_err(|e| unreachable(e.to_string()))?;
            }
        }
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(target))
            .await
            .map_err(|_| unreachable("connect timed out".into()))?
            .map_err(|e| unreachable(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        // A peer that vanishes without a FIN (a cut cable, a paused VM) is
        // noticed by TCP keepalive too, not only by request timeouts.
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(5))
            .with_interval(Duration::from_secs(1));
        let _ = socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive);
        let mut s: BoxStream = match &self.tls {
            Some(tls) => Box::new(
                tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    tls.connector.connect(tls.server_name.clone(), tcp),
                )
                .await
                .map_err(|_| CallError::Handshake {
                    addr: addr.into(),
                    reason: "TLS handshake timed out".into(),
                })?
                .map_err(|e| CallError::Handshake {
                    addr: addr.into(),
                    reason: format!("TLS: {e}"),
                })?,
            ),
            None => Box::new(tcp),
        };
        let (peer, seals) = tokio::time::timeout(CONNECT_TIMEOUT, self.handshake(&mut s, addr))
            .await
            .map_err(|_| CallError::Handshake {
                addr: addr.into(),
                reason: "timed out".into(),
            })??;
        if peer != node {
            metrics::counter!("firstseen_peer_wrong_node_total").increment(1);
            return Err(CallError::WrongPeer {
                addr: addr.into(),
                expected: node,
                answered: peer,
            });
        }
        Ok((s, peer, seals))
    }

    async fn handshake(&self, s: &mut BoxStream, addr: &str) -> Result<(NodeId, Seals), CallError> {
        let fail = |reason: String| CallError::Handshake {
            addr: addr.to_string(),
            reason,
        };
        let mut hello = [0u8; wire::handshake::HELLO];
        s.read_exact(&mut hello)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let client_nonce = wire::nonce();
        let answer = wire::handshake::answer(&self.key, &hello, self.me, &client_nonce)
            .map_err(|e| fail(e.to_string()))?;
        s.write_all(&answer)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let mut reply = [0u8; wire::handshake::SERVER];
        s.read_exact(&mut reply)
            .await
            .map_err(|e| fail(format!("refused by the peer (wrong cluster secret?): {e}")))?;
        let server = wire::handshake::confirm(&self.key, &client_nonce, &reply)
            .map_err(|e| fail(e.to_string()))?;
        let challenge: [u8; 32] = hello[8..].try_into().expect("32 bytes");
        let seals = wire::handshake::seals(&self.key, &challenge, &client_nonce, false);
        Ok((server, seals))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio_util::task::TaskTracker;

    use super::super::super::liveness::Liveness;
    use super::super::super::wire::{Envelope, Reply, Request};
    use super::super::Peers;
    use super::*;

    /// Node 1's peer network, and a pre-vote of node 1 to send on it.
    pub(in crate::cluster::peers) fn node_one(key: ClusterKey) -> (Peers, Request) {
        let peers = Peers::new(
            1,
            key,
            None,
            None,
            Arc::new(Liveness::new()),
            TaskTracker::new(),
        );
        let request = Request::PreVote(wire::PreVote {
            candidate: 1,
            term: 1,
            last_log: None,
        });
        (peers, request)
    }

    /// A peer that waits `delay` before it starts each handshake, then
    /// answers every pre-vote. Returns its address.
    pub(in crate::cluster::peers) async fn slow_peer(key: ClusterKey, delay: Duration) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let key = key.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let challenge = wire::nonce();
                    s.write_all(&wire::handshake::hello(&challenge)).await?;
                    let mut client = [0u8; wire::handshake::CLIENT];
                    s.read_exact(&mut client).await?;
                    let (_, answer) =
                        wire::handshake::accept(&key, &challenge, &client, 2).unwrap();
                    s.write_all(&answer).await?;
                    let (mut seal, mut check) = wire::handshake::seals(
                        &key,
                        &challenge,
                        &wire::handshake::client_nonce(&client),
                        true,
                    );
                    loop {
                        let mut header = [0u8; 4];
                        s.read_exact(&mut header).await?;
                        let mut body = vec![0u8; wire::frame_len(header).unwrap()];
                        s.read_exact(&mut body).await?;
                        let mut mac = [0u8; wire::FRAME_MAC];
                        s.read_exact(&mut mac).await?;
                        assert!(check.open(&body, &mac));
                        let req: Envelope<Request> = wire::decode(&body).unwrap();
                        let reply = Envelope {
                            id: req.id,
                            body: Reply::PreVote(wire::PreVoteReply {
                                granted: true,
                                reason: String::new(),
                            }),
                        };
                        let mut frame = wire::encode(&reply).unwrap();
                        seal.seal(&mut frame);
                        s.write_all(&frame).await?;
                    }
                    #[allow(unreachable_code)]
                    Ok::<(), std::io::Error>(())
                });
            }
        });
        addr
    }

    /// A relay, a reused IP or a wrong address puts member 2 where member 3
    /// is dialled. Member 2 knows the secret, so the handshake passes; its
    /// answers must still not count as member 3's (a vote or an ack counted
    /// twice). Before the check, this call came back granted.
    #[tokio::test]
    async fn a_member_answering_for_another_is_refused() {
        let key = ClusterKey::from_secret(b"secret");
        // The peer proves it is node 2.
        let addr = slow_peer(key.clone(), Duration::ZERO).await;
        let (peers, request) = node_one(key);
        let wrong = peers.call(3, &addr, &request, Duration::from_secs(5)).await;
        assert!(
            matches!(
                wrong,
                Err(CallError::WrongPeer {
                    expected: 3,
                    answered: 2,
                    ..
                })
            ),
            "{wrong:?}"
        );
        // The same address called as the node it is answers.
        let right = peers.call(2, &addr, &request, Duration::from_secs(5)).await;
        assert!(
            matches!(&right, Ok(Reply::PreVote(r)) if r.granted),
            "{right:?}"
        );
        peers.close();
    }
}
