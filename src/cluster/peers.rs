//! The client side of the peer protocol: authenticated, pooled connections,
//! and openraft's network factory on top of them.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use firstseen_raft::{Member, NodeId, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

use super::tls::{BoxStream, PeerTls};
use super::wire::{self, ClusterKey, Reply, Request};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Idle connections kept per peer.
const POOL_PER_PEER: usize = 4;

/// Why a call to a peer failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Could not connect: openraft backs off on this.
    #[error("cannot connect to {addr}: {source}")]
    Unreachable {
        addr: String,
        source: std::io::Error,
    },
    #[error("{addr} failed the handshake: {reason}")]
    Handshake { addr: String, reason: String },
    #[error("{addr}: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    #[error("{addr}: no reply within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    #[error("{addr}: {reason}")]
    Protocol { addr: String, reason: String },
}

struct Inner {
    me: NodeId,
    key: ClusterKey,
    /// Outgoing connections come from this address when set, so that a
    /// node's traffic has one source address (firewalls, and the fault
    /// tests' proxies, rely on it).
    source_ip: Option<IpAddr>,
    tls: Option<PeerTls>,
    pools: Mutex<HashMap<String, Vec<BoxStream>>>,
}

/// Connections to every peer.
#[derive(Clone)]
pub struct Peers {
    inner: Arc<Inner>,
}

impl Peers {
    pub fn new(
        me: NodeId,
        key: ClusterKey,
        source_ip: Option<IpAddr>,
        tls: Option<PeerTls>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                me,
                key,
                source_ip,
                tls,
                pools: Mutex::new(HashMap::new()),
            }),
        }
    }

    async fn connect(&self, addr: &str) -> Result<BoxStream, CallError> {
        let unreachable = |source| CallError::Unreachable {
            addr: addr.to_string(),
            source,
        };
        let target: SocketAddr = tokio::net::lookup_host(addr)
            .await
            .map_err(unreachable)?
            .next()
            .ok_or_else(|| unreachable(std::io::Error::other("no address")))?;
        let socket = if target.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }
        .map_err(unreachable)?;
        if let Some(ip) = self.inner.source_ip {
            if ip.is_ipv4() == target.is_ipv4() {
                socket.bind(SocketAddr::new(ip, 0)).map_err(unreachable)?;
            }
        }
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(target))
            .await
            .map_err(|_| {
                unreachable(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connect timed out",
                ))
            })?
            .map_err(unreachable)?;
        let _ = tcp.set_nodelay(true);
        let mut s: BoxStream = match &self.inner.tls {
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
        tokio::time::timeout(CONNECT_TIMEOUT, self.handshake(&mut s, addr))
            .await
            .map_err(|_| CallError::Handshake {
                addr: addr.into(),
                reason: "timed out".into(),
            })??;
        Ok(s)
    }

    async fn handshake(&self, s: &mut BoxStream, addr: &str) -> Result<(), CallError> {
        let fail = |reason: String| CallError::Handshake {
            addr: addr.to_string(),
            reason,
        };
        let mut hello = [0u8; 40];
        s.read_exact(&mut hello)
            .await
            .map_err(|e| fail(e.to_string()))?;
        if &hello[..8] != wire::MAGIC {
            return Err(fail("not a firstseen peer port".into()));
        }
        let challenge: [u8; 32] = hello[8..].try_into().expect("32 bytes");
        let client_nonce = wire::nonce();
        let mut out = Vec::with_capacity(72);
        out.extend_from_slice(&self.inner.me.to_be_bytes());
        out.extend_from_slice(&client_nonce);
        out.extend_from_slice(&self.inner.key.client_proof(&challenge, self.inner.me));
        s.write_all(&out).await.map_err(|e| fail(e.to_string()))?;
        let mut answer = [0u8; 40];
        s.read_exact(&mut answer)
            .await
            .map_err(|e| fail(format!("refused by the peer (wrong cluster secret?): {e}")))?;
        let server = u64::from_be_bytes(answer[..8].try_into().expect("8 bytes"));
        let proof: [u8; 32] = answer[8..].try_into().expect("32 bytes");
        if !self.inner.key.check_server(&client_nonce, server, &proof) {
            return Err(fail(format!(
                "node {server} does not know the cluster secret"
            )));
        }
        Ok(())
    }

    fn take_pooled(&self, addr: &str) -> Option<BoxStream> {
        self.inner
            .pools
            .lock()
            .expect("pool poisoned")
            .get_mut(addr)
            .and_then(|v| v.pop())
    }

    fn give_back(&self, addr: &str, s: BoxStream) {
        let mut pools = self.inner.pools.lock().expect("pool poisoned");
        let v = pools.entry(addr.to_string()).or_default();
        if v.len() < POOL_PER_PEER {
            v.push(s);
        }
    }

    /// Sends one request and waits for its reply. A pooled connection that
    /// turns out dead is replaced once: every request is safe to repeat
    /// (Raft RPCs are idempotent; a repeated forward yields duplicates).
    pub async fn call(
        &self,
        addr: &str,
        request: &Request,
        timeout: Duration,
    ) -> Result<Reply, CallError> {
        let frame = wire::encode(request).map_err(|e| CallError::Protocol {
            addr: addr.into(),
            reason: e.to_string(),
        })?;
        if let Some(s) = self.take_pooled(addr) {
            if let Ok(reply) = self.exchange(s, addr, &frame, timeout).await {
                return Ok(reply);
            }
        }
        let s = self.connect(addr).await?;
        self.exchange(s, addr, &frame, timeout).await
    }

    async fn exchange(
        &self,
        mut s: BoxStream,
        addr: &str,
        frame: &[u8],
        timeout: Duration,
    ) -> Result<Reply, CallError> {
        let io = |source| CallError::Io {
            addr: addr.to_string(),
            source,
        };
        let result = tokio::time::timeout(timeout, async {
            s.write_all(frame).await.map_err(io)?;
            let mut header = [0u8; 4];
            s.read_exact(&mut header).await.map_err(io)?;
            let len = wire::frame_len(header).map_err(|e| CallError::Protocol {
                addr: addr.into(),
                reason: e.to_string(),
            })?;
            let mut body = vec![0u8; len];
            s.read_exact(&mut body).await.map_err(io)?;
            wire::decode::<Reply>(&body).map_err(|e| CallError::Protocol {
                addr: addr.into(),
                reason: e.to_string(),
            })
        })
        .await
        .map_err(|_| CallError::Timeout {
            addr: addr.into(),
            timeout,
        })??;
        self.give_back(addr, s);
        Ok(result)
    }
}

impl RaftNetworkFactory<TypeConfig> for Peers {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> PeerClient {
        PeerClient {
            peers: self.clone(),
            target,
            addr: node.addr.clone(),
        }
    }
}

/// openraft's connection to one peer.
pub struct PeerClient {
    peers: Peers,
    target: NodeId,
    addr: String,
}

impl PeerClient {
    fn map_err<E: std::error::Error>(&self, e: CallError) -> RPCError<NodeId, Member, E> {
        match e {
            CallError::Unreachable { .. } | CallError::Handshake { .. } => {
                RPCError::Unreachable(Unreachable::new(&e))
            }
            other => RPCError::Network(NetworkError::new(&other)),
        }
    }

    /// The peer would not take a write now: openraft backs off as for an
    /// unreachable node.
    fn refused<E: std::error::Error>(&self, reason: String) -> RPCError<NodeId, Member, E> {
        let e = CallError::Protocol {
            addr: self.addr.clone(),
            reason: format!("refused: {reason}"),
        };
        RPCError::Unreachable(Unreachable::new(&e))
    }

    fn unexpected<E: std::error::Error>(&self) -> RPCError<NodeId, Member, E> {
        let e = CallError::Protocol {
            addr: self.addr.clone(),
            reason: "reply of the wrong kind".into(),
        };
        RPCError::Network(NetworkError::new(&e))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        match self
            .peers
            .call(&self.addr, &Request::AppendEntries(rpc), option.hard_ttl())
            .await
        {
            Ok(Reply::AppendEntries(Ok(r))) => Ok(r),
            Ok(Reply::AppendEntries(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(Reply::Refused(reason)) => Err(self.refused(reason)),
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.map_err(e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Member, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self
            .peers
            .call(
                &self.addr,
                &Request::InstallSnapshot(rpc),
                option.hard_ttl(),
            )
            .await
        {
            Ok(Reply::InstallSnapshot(Ok(r))) => Ok(r),
            Ok(Reply::InstallSnapshot(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(Reply::Refused(reason)) => Err(self.refused(reason)),
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.map_err(e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        match self
            .peers
            .call(&self.addr, &Request::Vote(rpc), option.hard_ttl())
            .await
        {
            Ok(Reply::Vote(Ok(r))) => Ok(r),
            Ok(Reply::Vote(Err(e))) => Err(RPCError::RemoteError(RemoteError::new(self.target, e))),
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.map_err(e)),
        }
    }
}
