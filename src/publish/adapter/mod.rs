//! The publisher's ports as a node has them (`super::port`; the simulation
//! has models of them instead):
//!
//! - `broker`: Pulsar for a new term ([`PulsarBroker`]): the client, the
//!   admin API's checks of the broker, our producers' credentials and TLS.
//! - `session`: Pulsar for one term ([`PulsarSession`]): a topic's
//!   exclusive producer, the wait for a predecessor's pending writes, the
//!   tail read, sending; `outgoing` how a message goes into an entry
//!   (body, properties, proof); `sort` the client's errors sorted into the
//!   publisher's by code and variant.
//! - `consensus`: the group through openraft and the proposer
//!   ([`RaftGroup`]): leadership, the lease, the read barrier, receipts,
//!   set-aside records and rebases.
//! - `outbox`: the outbox over the replicated state and the Raft log
//!   ([`StateOutbox`]).

mod broker;
mod consensus;
mod outbox;
mod outgoing;
mod session;
mod sort;

pub use broker::PulsarBroker;
pub use consensus::RaftGroup;
pub use outbox::StateOutbox;
pub use session::PulsarSession;
