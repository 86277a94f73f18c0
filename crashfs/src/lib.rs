//! firstseen-crashfs: a FUSE passthrough filesystem for crash-consistency
//! tests, in the spirit of Jepsen's LazyFS.
//!
//! - [`journal`]: the pure core. Per file, the writes made since its last
//!   `fsync`/`fdatasync`, kept as undo records; a power cut replays them
//!   backwards, optionally tearing each file's last write at a random byte.
//! - [`names`]: the namespace's core. Every create, unlink, rmdir and
//!   rename since its directory's last fsync; a power cut undoes them.
//! - [`fs`]: the FUSE side, a passthrough of one backing directory with a
//!   quota for full-disk tests, and a freeze that stalls writes and syncs
//!   until a thaw.
//!
//! The binary mounts it and takes commands on a Unix socket
//! (`lose-power`, `lose-power-torn SEED`, `quota BYTES|off`, `freeze`,
//! `thaw`, `status`, `unmount`); see `src/main.rs` and docs/reliability.md.

pub mod fs;
pub mod journal;
pub mod names;
