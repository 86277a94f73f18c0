//! The transport seam between Raft nodes.
//!
//! A group of one never calls it. [`NoPeers`] answers every RPC with
//! `Unreachable`, which makes openraft back off instead of spinning, so a
//! membership that names peers which do not exist yet degrades safely: the
//! node simply cannot reach a quorum.

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

use crate::{Member, NodeId, TypeConfig};

/// A network factory for a node without peers.
#[derive(Clone, Default)]
pub struct NoPeers;

/// The (absent) connection to one peer.
pub struct NoConnection {
    target: NodeId,
}

#[derive(Debug, thiserror::Error)]
#[error("node {0} is not reachable: this build has no peer transport configured")]
struct NoTransport(NodeId);

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = NoConnection;

    async fn new_client(&mut self, target: NodeId, _node: &Member) -> Self::Network {
        NoConnection { target }
    }
}

impl NoConnection {
    fn unreachable<E: std::error::Error>(&self) -> RPCError<NodeId, Member, E> {
        RPCError::Unreachable(Unreachable::new(&NoTransport(self.target)))
    }
}

impl RaftNetwork<TypeConfig> for NoConnection {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        Err(self.unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Member, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(self.unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        Err(self.unreachable())
    }
}
