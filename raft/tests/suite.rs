//! openraft's storage conformance suite, run against the sled log store and
//! state machine.

use firstseen_raft::{LogStore, StateMachine, TypeConfig};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::StorageError;
use tempfile::TempDir;

struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for SledBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sled_storage_passes_openraft_suite() {
    if let Err(e) = Suite::test_all(SledBuilder).await {
        panic!("openraft storage suite failed: {e}");
    }
}
