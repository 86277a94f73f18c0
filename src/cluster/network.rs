//! openraft's network: Raft's RPCs (appends, snapshots, votes) over the
//! peer links of [`super::peers`], with the time each may take and the
//! mapping of link failures to what openraft backs off on.

use std::sync::Arc;
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

use super::peers::{Call, CallError};
use super::wire::{Reply, Request};

/// openraft's network: Raft's RPCs over a [`Call`].
#[derive(Clone)]
pub struct Network(pub Arc<dyn Call>);

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> PeerClient {
        PeerClient {
            peers: self.0.clone(),
            target,
            addr: node.addr.clone(),
        }
    }
}

/// openraft's connection to one peer.
pub struct PeerClient {
    peers: Arc<dyn Call>,
    target: NodeId,
    addr: String,
}

/// The shortest time an RPC that writes on the peer (an append with
/// entries, a vote) waits for its reply here. It cannot give an append more
/// than openraft does: openraft's own timer cuts the whole call at one
/// heartbeat interval (follower fsync included), and sends it again from the
/// start. Only a larger `cluster.heartbeat_ms` gives an append more time.
/// Likewise openraft cuts a vote at `election_timeout_min`. The floor only
/// matters where openraft's own budget is longer than what it passes here.
const WRITE_TTL_FLOOR: Duration = Duration::from_millis(500);

impl PeerClient {
    fn map_err<E: std::error::Error>(&self, e: CallError) -> RPCError<NodeId, Member, E> {
        match e {
            CallError::Unreachable { .. }
            | CallError::Handshake { .. }
            | CallError::WrongPeer { .. } => RPCError::Unreachable(Unreachable::new(&e)),
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
        let ttl = if rpc.entries.is_empty() {
            option.hard_ttl()
        } else {
            option.hard_ttl().max(WRITE_TTL_FLOOR)
        };
        match self
            .peers
            .call(self.target, &self.addr, &Request::AppendEntries(rpc), ttl)
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
                self.target,
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
        let ttl = option.hard_ttl().max(WRITE_TTL_FLOOR);
        match self
            .peers
            .call(self.target, &self.addr, &Request::Vote(rpc), ttl)
            .await
        {
            Ok(Reply::Vote(Ok(r))) => Ok(r),
            Ok(Reply::Vote(Err(e))) => Err(RPCError::RemoteError(RemoteError::new(self.target, e))),
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.map_err(e)),
        }
    }
}
