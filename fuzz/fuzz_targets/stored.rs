//! What a node reads back from its own disk, each through the decoder the
//! node uses: a Raft log entry, the vote, the purge point and the commit
//! point, an outbox message, the applied marker, `current.meta` and a guard
//! slot. A damaged file must be refused, never panic or allocate without
//! bound; a guard slot that decodes must be one the guard would write.
#![no_main]

use firstseen_raft::{guard, log_store, state_machine};
use firstseen_store::OutboxMessage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = log_store::decode_entry(data);
    let _ = log_store::decode_vote(data);
    let _ = log_store::decode_log_id(data);
    let _ = log_store::decode_committed(data);
    let _ = OutboxMessage::decode(data);
    let _ = state_machine::decode_applied(data);
    let _ = state_machine::decode_current_meta(data);
    if let Some((_, marks)) = guard::decode_slot(data) {
        // A whole slot carries its own checksum: the fuzzer can only reach
        // here by building one, and what it holds must be a valid record.
        let _ = format!("{marks:?}");
    }
});
