//! What every stage knows of the node it runs in: its identity and place,
//! from `[node]`. A stage builds itself from its own section of the config
//! and this; none reads the config as a whole.

use std::path::PathBuf;

use firstseen_store::NodeId;

/// The node a stage runs in.
#[derive(Debug, Clone)]
pub struct NodeCx {
    pub id: NodeId,
    /// Its availability zone: coverage per zone, and the membership.
    pub zone: String,
    /// Where it keeps its data (`node.data_dir`).
    pub data_dir: PathBuf,
    /// Its HTTP API as other members reach it: carried in the membership,
    /// so that any node can point an operator at another's.
    pub http: String,
    /// Free space it keeps on the data directory's filesystem.
    pub disk_reserve_bytes: u64,
}
