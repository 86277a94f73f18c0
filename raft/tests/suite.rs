//! openraft's storage conformance suite, run against the sled log store and
//! state machine.

use firstseen_raft::{LogStore, NodeId, StateMachine, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;
use tempfile::TempDir;

struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for SledBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError<NodeId>> {
        let dir = TempDir::new().expect("temp dir");
        let storage = firstseen_raft::open(dir.path())
            .await
            .expect("open storage");
        // A node runs the reaper under its supervisor; here it runs beside
        // the suite, so purges delete entries as they do in a node.
        tokio::spawn(storage.reaper);
        Ok((dir, storage.log, storage.state_machine))
    }
}

#[test]
fn sled_storage_passes_openraft_suite() {
    if let Err(e) = Suite::test_all(SledBuilder) {
        panic!("openraft storage suite failed: {e}");
    }
}
