//! The one-shot commands of the `firstseen` binary, and `run`. `main.rs`
//! parses the arguments and calls one of these; each returns the exit code:
//! 0 success, 1 a check found problems (invalid config, verify found
//! duplicates or gaps), 2 the command could not run.
//!
//! - [`node`]: `run` (a node until SIGINT or SIGTERM) and `check-config`.
//! - [`verify`]: `verify`, the topic audit.
//! - [`compare`]: `compare`, two topics side by side (a shadow run).
//! - [`api`]: the HTTP client the admin and status commands share, and the
//!   rule for where the admin credential may travel.
//! - [`members`]: `members add|remove` and `upgrade`.
//! - [`status`]: the `status` command.
//! - [`recover`]: `recover --force-new-cluster`, a lone survivor made a
//!   cluster of one.

pub mod api;
pub mod compare;
pub mod members;
pub mod node;
pub mod recover;
pub mod status;
pub mod verify;
