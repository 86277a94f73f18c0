//! Every metric firstseen exports, by name, kind and help text: the one
//! list start-up registers and docs/metrics.md is held to.

/// (name, kind, help) of every metric firstseen exports. Kept in one table
/// so that start-up can register them all and a test can hold docs/metrics.md
/// to it.
pub const METRICS: &[(&str, &str, &str)] = &[
    (
        "firstseen_messages_received_total",
        "counter",
        "Upstream messages received by this node, per upstream",
    ),
    (
        "firstseen_first_seen_total",
        "counter",
        "Observations this node proposed that were the first copy of their key",
    ),
    (
        "firstseen_duplicates_total",
        "counter",
        "Observations this node proposed that were copies of a key already committed",
    ),
    (
        "firstseen_batches_total",
        "counter",
        "Batches this node committed (each one Raft entry)",
    ),
    (
        "firstseen_acks_total",
        "counter",
        "Upstream PUBACKs sent after commit",
    ),
    (
        "firstseen_propose_errors_total",
        "counter",
        "Batch proposals that failed and were retried",
    ),
    (
        "firstseen_published_total",
        "counter",
        "Messages this node published to Pulsar as leader",
    ),
    (
        "firstseen_publish_errors_total",
        "counter",
        "Times the publisher dropped its producer after an error",
    ),
    (
        "firstseen_publish_refusals_total",
        "counter",
        "Times the broker answered one message's send with an error instead of a receipt; the same message refused twice in a row goes as a marker",
    ),
    (
        "firstseen_published_late_total",
        "counter",
        "Messages the broker refused after later ones had landed, sent again (or as a marker) after them",
    ),
    (
        "firstseen_foreign_messages_total",
        "counter",
        "Messages at the end of a topic that firstseen did not write, skipped by the tail read",
    ),
    (
        "firstseen_tail_cut_short_total",
        "counter",
        "Tail reads that reached their bound (entries or time) before finding a message of the cluster's, or before reading back to the committed watermark: the publisher resumed after the watermark",
    ),
    (
        "firstseen_publish_superseded_total",
        "counter",
        "Topics this node stopped publishing for good because their tail holds messages of a newer generation of its cluster (a cluster recovered from this one publishes there)",
    ),
    (
        "firstseen_publish_rebased_total",
        "counter",
        "Rebases a recovered cluster committed: a topic continued after messages the cluster it was recovered from published and this node never received",
    ),
    (
        "firstseen_publish_writes_pending_total",
        "counter",
        "Times a new exclusive producer was let go because the broker still held an earlier producer's writes of the topic (or could not say) after one operation timeout; retried",
    ),
    (
        "firstseen_publish_topics_created_total",
        "counter",
        "Topics the publisher created through the admin API because the broker had not got them and would not create them (allowAutoTopicCreation off)",
    ),
    (
        "firstseen_publish_unfenced_total",
        "counter",
        "Exclusive producers taken without waiting for an earlier producer's pending writes (no pulsar.admin_url)",
    ),
    (
        "firstseen_oversize_total",
        "counter",
        "Messages over a dedup.max_* bound (payload, message, topic, properties), per upstream",
    ),
    (
        "firstseen_key_fallbacks_total",
        "counter",
        "Messages a JSON field key could not be made for (not JSON, or a field missing), per policy: bytes (byte key) or dead-letter",
    ),
    (
        "firstseen_dead_letter_total",
        "counter",
        "Messages written to the dead-letter directory, per reason",
    ),
    (
        "firstseen_upstream_disconnects_total",
        "counter",
        "Upstream connection failures, per upstream",
    ),
    (
        "firstseen_admin_refused_total",
        "counter",
        "Admin API requests refused: no or a wrong admin credential (the admin token, or the cluster secret without one), or the credential over plain HTTP from a non-loopback client",
    ),
    (
        "firstseen_http_tls_refused_total",
        "counter",
        "HTTPS connections refused before a request: failed or timed-out TLS handshakes, or too many at once",
    ),
    (
        "firstseen_set_aside_total",
        "counter",
        "Messages the publisher sent as a marker because the broker would refuse them (over pulsar.max_message_bytes); each is kept in the set-aside store",
    ),
    (
        "firstseen_set_aside_evicted_total",
        "counter",
        "Set-aside messages evicted by newer ones past outbox.set_aside_max_bytes",
    ),
    (
        "firstseen_dead_letter_not_kept_total",
        "counter",
        "Unrouted messages acked and not kept: past dead_letter.unrouted_max_bytes",
    ),
    (
        "firstseen_dead_letter_removed_total",
        "counter",
        "Dead-letter files removed to keep the store within its quota and retention",
    ),
    (
        "firstseen_dead_letter_bytes",
        "gauge",
        "Bytes the dead-letter store holds",
    ),
    (
        "firstseen_dead_letter_files",
        "gauge",
        "Files the dead-letter store holds",
    ),
    (
        "firstseen_http_connections_closed_total",
        "counter",
        "HTTP(S) connections closed to keep clients from holding the API: too many from one address or in all, or idle too long",
    ),
    (
        "firstseen_peer_refused_total",
        "counter",
        "Peer connections refused (handshake, TLS, bad frames)",
    ),
    (
        "firstseen_peer_connects_total",
        "counter",
        "Outgoing peer connection attempts (one long-lived connection per peer; more means reconnects)",
    ),
    (
        "firstseen_peer_dial_failures_total",
        "counter",
        "Outgoing peer connection attempts that failed",
    ),
    (
        "firstseen_peer_unreachable",
        "gauge",
        "1 while dials to that member fail, 0 once one gets through again",
    ),
    (
        "firstseen_peer_wrong_node_total",
        "counter",
        "Outgoing peer connections refused because another member answered at the address dialled (a stale address, a reused IP or a relay)",
    ),
    (
        "firstseen_peer_accepted_total",
        "counter",
        "Incoming peer connections authenticated",
    ),
    (
        "firstseen_elections_started_total",
        "counter",
        "Elections this node started after winning a pre-vote",
    ),
    (
        "firstseen_upstream_connected",
        "gauge",
        "1 while the upstream connection is up, per upstream",
    ),
    (
        "firstseen_backpressure",
        "gauge",
        "1 while the outbox is over its quota, or the disk below its reserve, and acks are held",
    ),
    (
        "firstseen_outbox_messages",
        "gauge",
        "Messages committed but not yet confirmed in Pulsar",
    ),
    (
        "firstseen_outbox_bytes",
        "gauge",
        "Payload and topic bytes in the outbox (the quota's measure)",
    ),
    ("firstseen_window_keys", "gauge", "Keys in the dedup window"),
    ("firstseen_raft_term", "gauge", "Current Raft term"),
    ("firstseen_raft_is_leader", "gauge", "1 on the leader"),
    (
        "firstseen_raft_leader_id",
        "gauge",
        "Node id of the leader this node knows (0 if none)",
    ),
    (
        "firstseen_raft_applied_index",
        "gauge",
        "Last Raft log index applied to the state machine",
    ),
    (
        "firstseen_snapshot_bytes",
        "gauge",
        "Size of the current snapshot file",
    ),
    (
        "firstseen_disk_bytes",
        "gauge",
        "Bytes sled uses on disk (state and log)",
    ),
    (
        "firstseen_disk_free_bytes",
        "gauge",
        "Free bytes on the data directory's filesystem",
    ),
    (
        "firstseen_disk_low",
        "gauge",
        "1 while free disk space is below node.disk_reserve_bytes: nothing is written, acks are held",
    ),
    (
        "firstseen_disk_syncs_total",
        "counter",
        "fdatasync rounds that made a sled database stable, per db (log or state)",
    ),
    (
        "firstseen_coverage_seen_ratio",
        "gauge",
        "Per member and zone: share of the window's keys it delivered",
    ),
    (
        "firstseen_coverage_first_ratio",
        "gauge",
        "Per member and zone: share of the window's keys it delivered first",
    ),
    (
        "firstseen_commit_seconds",
        "histogram",
        "Time from proposing a batch to its commit",
    ),
    (
        "firstseen_disk_sync_seconds",
        "histogram",
        "Time for sled's flush and the fdatasync after it, per db",
    ),
    (
        "firstseen_stage_seconds",
        "histogram",
        "Per message, time spent in each stage: receive (upstream hand-over to the batch's proposal), commit (proposal to commit, on the receiving node), publish (applied on the leader to handed to the producer), receipt (handed to Pulsar's receipt)",
    ),
    (
        "firstseen_commit_leg_seconds",
        "histogram",
        "The commit path's legs, each where it happens: forward (a follower's forward, sent to answered), queue (leader: a batch reached the coalescer to its entry proposed), entry (leader: proposed to committed and applied), flush (an append written to synced), to_send (leader: an entry written to the first append that carries it sent), append and heartbeat (leader: an append with and without entries, sent to answered), follower_append (follower: an append with entries received to answered), apply (one entry applied)",
    ),
    (
        "firstseen_raft_appends_total",
        "counter",
        "Appends the leader sent to followers, per kind: entries, empty (a heartbeat or a new commit index, waited for), unawaited (empty, sent without waiting for the reply because the follower answered within half a heartbeat)",
    ),
    (
        "firstseen_raft_append_streams_total",
        "counter",
        "Pipelined append streams the leader opened to followers (cluster level 4): openraft opens one per replication session and one per heartbeat, so a steady count rising with the heartbeats is normal, and a faster one means streams ending on refusals, conflicts or a changed connection",
    ),
    (
        "firstseen_publish_batch_seconds",
        "histogram",
        "Time to send a publish batch and receive every receipt",
    ),
    (
        "firstseen_batch_messages",
        "histogram",
        "Observations per committed batch",
    ),
    (
        "firstseen_raft_log_entries_total",
        "counter",
        "Raft log entries appended to this node's log",
    ),
    (
        "firstseen_raft_log_flushes_total",
        "counter",
        "Group-commit syncs of the Raft log (sled's flush, then fdatasync); one covers every append queued before it",
    ),
    (
        "firstseen_raft_log_truncations_total",
        "counter",
        "Conflicting log tails removed (a deposed leader's entries); each is also logged. Rising steadily means a livelock",
    ),
    (
        "firstseen_raft_slow_appends_total",
        "counter",
        "Appends from the leader that took this node longer than a heartbeat to take: the leader has given up on each and sends it again",
    ),
    (
        "firstseen_raft_abstaining",
        "gauge",
        "1 while this node refuses every vote and does not campaign: its damaged Raft log was set aside and it has not yet applied up to the leader's read index; 0 once it votes again",
    ),
    (
        "firstseen_log_set_aside_total",
        "counter",
        "Damaged Raft logs this process set aside at start-up (kept as raft/log.damaged)",
    ),
    (
        "firstseen_raft_log_bytes_total",
        "counter",
        "Encoded bytes of the Raft log entries appended to this node's log",
    ),
    (
        "firstseen_disk_blob_listings_total",
        "counter",
        "Syncs that listed blobs/ because inotify could not say which blobs changed",
    ),
    (
        "firstseen_slim_resent_total",
        "counter",
        "Copies proposed without their payload that came back Missing and were proposed again whole",
    ),
];
