//! Plain data that crosses the Raft log and the state machine.
//!
//! Everything here is serialised into log entries, so a change of shape is a
//! change of the on-disk and on-wire format.

use serde::{Deserialize, Serialize};

/// How long a key stays in the dedup window: the leader's
/// `dedup.window_secs`, stamped into every observing entry so that nodes
/// whose configs differ still expire identically. A type of its own so that
/// it cannot trade places with the stamp beside it; in the log it is the
/// bare count of milliseconds it always was (`serde(transparent)`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Window(u64);

impl Window {
    pub const fn from_ms(ms: u64) -> Self {
        Window(ms)
    }

    pub const fn as_ms(self) -> u64 {
        self.0
    }
}

/// The dedup key of a message: a blake3 digest (32 bytes).
pub type Key = [u8; 32];

/// A raft node id, also used to attribute observations to zones.
pub type NodeId = u64;

/// Which rule made a key: the route's kind of key. Keys of different kinds
/// are different messages even when their bytes are equal: a payload
/// crafted on a `payload` route hashes to a `topic+payload` key of another
/// route (blake3 of "a/b\0…" is both), and without the kind one made the
/// other a duplicate, acked and never published. From cluster level 2 the
/// window tells keys apart by kind and by Pulsar topic
/// ([`crate::window::identity`]).
///
/// One byte in the log (bincode would spend four on an enum).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "u8", from = "u8")]
pub enum KeyKind {
    /// `blake3(topic ‖ 0x00 ‖ payload)`, and the fallback of a field key.
    TopicPayload,
    /// `blake3(payload)`.
    Payload,
    /// The canonical JSON fields of the route.
    Fields,
    /// Not known: a copy proposed by a node before the cluster reached
    /// level 2 (its batch carried no kinds). Kept in the window by its bare
    /// key, as level 1 does.
    #[default]
    Unknown,
}

impl From<KeyKind> for u8 {
    fn from(k: KeyKind) -> u8 {
        match k {
            KeyKind::TopicPayload => 0,
            KeyKind::Payload => 1,
            KeyKind::Fields => 2,
            KeyKind::Unknown => 255,
        }
    }
}

impl From<u8> for KeyKind {
    fn from(b: u8) -> KeyKind {
        match b {
            0 => KeyKind::TopicPayload,
            1 => KeyKind::Payload,
            2 => KeyKind::Fields,
            _ => KeyKind::Unknown,
        }
    }
}

impl KeyKind {
    /// The kinds a copy of unknown kind may have been stored under.
    pub const KNOWN: [KeyKind; 3] = [KeyKind::TopicPayload, KeyKind::Payload, KeyKind::Fields];
}

/// One copy of an upstream message, as a bridge node received it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// Dedup key, computed by the ingesting node from the route's key spec.
    pub key: Key,
    /// MQTT topic the message was published on; kept as a Pulsar property.
    pub mqtt_topic: String,
    /// Pulsar topic chosen by the route. Carried in the entry (rather than
    /// recomputed on apply) so that nodes with different route tables can
    /// never disagree on where a message goes.
    pub pulsar_topic: String,
    /// The MQTT payload, unchanged. Encoded as one run of bytes: as a
    /// sequence, bincode wrote it one byte at a time, which in a debug build
    /// made a 1.3 MB append take about 200 ms to encode and decode, twice
    /// openraft's budget for the whole append. The bytes on disk and on the
    /// wire are the same either way (test `bytes_are_encoded_as_before`).
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// QoS the message arrived with; kept for audits.
    pub qos: u8,
    /// Whether the broker flagged it retained.
    pub retain: bool,
    /// Node that received this copy: coverage per zone is counted from it.
    pub node: NodeId,
    /// Local receive time at that node (ms since epoch). Informational only:
    /// nothing in the state machine depends on a follower's clock.
    pub received_ms: u64,
}

/// What an MQTT 5 publish carries besides its payload, kept so that every
/// node publishes the same message to Pulsar (docs/configuration.md,
/// "MQTT 5 properties in Pulsar"). Not part of the dedup key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Properties {
    /// User properties, in the order they came; a name may repeat.
    pub user: Vec<(String, String)>,
    pub content_type: Option<String>,
    /// 0: unspecified bytes, 1: UTF-8.
    pub payload_format: Option<u8>,
    /// Seconds the message had left before it expired, as the broker sent it.
    pub message_expiry_secs: Option<u32>,
    pub response_topic: Option<String>,
    #[serde(with = "serde_bytes")]
    pub correlation_data: Option<Vec<u8>>,
}

/// Observations on their way to the log, with their MQTT 5 properties and
/// key kinds: what a batcher proposes and a follower forwards.
/// `properties` is empty when no observation has any, else as long as
/// `observations`; `kinds` is as long as `observations`.
///
/// `kinds` is not part of this type's encoding: a batch forwarded to a
/// leader of a release before kinds (`Request::Forward`) is what it always
/// was, and one forwarded at cluster level 2 carries them beside it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub observations: Vec<Observation>,
    pub properties: Vec<Option<Box<Properties>>>,
    #[serde(skip)]
    pub kinds: Vec<KeyKind>,
}

impl Batch {
    /// Adds a copy of unknown kind.
    pub fn push(&mut self, o: Observation, p: Option<Box<Properties>>) {
        self.push_kind(o, p, KeyKind::Unknown)
    }

    /// Adds a copy whose key is of `kind`.
    pub fn push_kind(&mut self, o: Observation, p: Option<Box<Properties>>, kind: KeyKind) {
        if p.is_some() && self.properties.len() < self.observations.len() {
            self.properties.resize(self.observations.len(), None);
        }
        self.kinds.resize(self.observations.len(), KeyKind::Unknown);
        self.observations.push(o);
        self.kinds.push(kind);
        if p.is_some() || !self.properties.is_empty() {
            self.properties.push(p);
        }
    }

    /// The kind of copy `pos`.
    pub fn kind(&self, pos: usize) -> KeyKind {
        self.kinds.get(pos).copied().unwrap_or_default()
    }

    /// Appends every copy of `other`, in order.
    pub fn extend(&mut self, other: Batch) {
        let kinds: Vec<KeyKind> = (0..other.len()).map(|i| other.kind(i)).collect();
        let Batch {
            observations,
            properties,
            ..
        } = other;
        if properties.is_empty() {
            for (o, k) in observations.into_iter().zip(kinds) {
                self.push_kind(o, None, k);
            }
        } else {
            for ((o, p), k) in observations.into_iter().zip(properties).zip(kinds) {
                self.push_kind(o, p, k);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.observations.len()
    }

    pub fn is_empty(&self) -> bool {
        self.observations.is_empty()
    }

    /// The log entry for this batch, stamped by the leader.
    pub fn into_command(self, stamped_ms: u64, window: Window) -> Command {
        Command::observe(stamped_ms, window, self.observations, self.properties)
    }

    /// The log entry for this batch with the copies at `slim` (ascending)
    /// proposed without their payload; a plain one when there are none.
    pub fn into_slim_command(self, stamped_ms: u64, window: Window, slim: Vec<u32>) -> Command {
        if slim.is_empty() {
            return self.into_command(stamped_ms, window);
        }
        Command::ObserveSlim {
            stamped_ms,
            window,
            observations: self.observations,
            properties: self.properties,
            slim,
        }
    }

    /// The log entry for this batch at cluster level `level`: from level 2
    /// [`Command::ObserveKinds`], which carries each copy's kind; below it
    /// the commands every release reads.
    pub fn into_command_at(
        self,
        level: u32,
        stamped_ms: u64,
        window: Window,
        slim: Vec<u32>,
    ) -> Command {
        if level < crate::level::KINDS {
            return self.into_slim_command(stamped_ms, window, slim);
        }
        let kinds = (0..self.len()).map(|i| self.kind(i)).collect();
        Command::ObserveKinds {
            stamped_ms,
            window,
            observations: self.observations,
            properties: self.properties,
            slim,
            kinds,
        }
    }
}

/// A command in the Raft log. One log entry holds exactly one command.
///
/// New variants go at the end: bincode numbers variants by position, so an
/// old entry keeps decoding as what it was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A batch of observations from one node.
    Observe {
        /// Leader's clock when it proposed the batch (ms since epoch). The
        /// state machine's window clock only moves forward from it, so expiry
        /// is a function of the log alone (G5), whatever the node clocks do.
        stamped_ms: u64,
        /// Dedup window in force when the leader proposed the entry. Stamped
        /// into the entry so that nodes whose configs differ still expire
        /// identically.
        window: Window,
        /// The copies, in the order the node received them.
        observations: Vec<Observation>,
    },
    /// The publisher's receipt: everything up to `seq` on `pulsar_topic` is
    /// in Pulsar, so every node may trim its outbox up to there.
    Published { pulsar_topic: String, seq: u64 },
    /// [`Command::Observe`] with MQTT 5 properties: `properties[i]` belongs
    /// to `observations[i]`. Proposed only when some observation has any,
    /// so the log of a cluster without MQTT 5 upstreams is as before.
    ObserveWithProperties {
        stamped_ms: u64,
        window: Window,
        observations: Vec<Observation>,
        properties: Vec<Option<Box<Properties>>>,
    },
    /// [`Command::ObserveWithProperties`] where the copies at `slim` (in
    /// ascending order) carry only their key, node, times and flags: the
    /// leader held their key already, so apply never reads their payload.
    /// A slim copy of a key the state does not hold is [`Outcome::Missing`].
    ObserveSlim {
        stamped_ms: u64,
        window: Window,
        observations: Vec<Observation>,
        properties: Vec<Option<Box<Properties>>>,
        slim: Vec<u32>,
    },
    /// The cluster's level rises to `level` (`crate::level`): the leader
    /// proposes it once every member runs a release that has it, and from
    /// this entry on every node applies and writes that level's formats.
    /// Never goes back. A node whose release is older than `level` stops
    /// at this entry with an error that says so.
    Level { level: u32 },
    /// [`Command::ObserveSlim`] with each copy's key kind (`kinds[i]` is
    /// `observations[i]`'s), from cluster level 2. A slim copy keeps its
    /// Pulsar topic: the window tells keys apart by topic and kind.
    ObserveKinds {
        stamped_ms: u64,
        window: Window,
        observations: Vec<Observation>,
        properties: Vec<Option<Box<Properties>>>,
        slim: Vec<u32>,
        kinds: Vec<KeyKind>,
    },
    /// From cluster level 2: message `seq` of `pulsar_topic` goes to Pulsar
    /// as a marker (the broker would refuse it), so every node keeps the
    /// message itself in its replicated set-aside store, where nothing but
    /// other set-aside messages can evict it (oldest first, past
    /// `keep_bytes`, the leader's `outbox.set_aside_max_bytes`, stamped so
    /// that every node keeps the same). Committed before the marker is sent.
    SetAside(Box<SetAside>),
    /// The cluster's generation becomes `generation`: appended by
    /// `firstseen recover --force-new-cluster` after the membership of the
    /// survivor alone, one above the survivor's own, so that the cluster it
    /// starts tells its messages from those of the cluster it came from
    /// (each message's proof covers it). Never goes back. Only a recovered
    /// cluster has one: a node of a release without generations cannot
    /// read the entry, and members are added to a recovered cluster with
    /// the release that recovered it.
    Generation { generation: u64 },
    /// A recovered cluster continues a topic after the messages its lost
    /// members published and it never received (issue 49): their keys go
    /// into the window, the outbox messages of one of those keys are
    /// published already and leave the outbox, the others are numbered on
    /// after the highest of them, and so is the topic's counter. Proposed
    /// by a leader of a newer generation, from a tail read, before it
    /// publishes anything on the topic. Only a recovered cluster proposes
    /// one (see [`Command::Generation`]).
    Rebase(Box<Rebase>),
}

/// What [`Command::Rebase`] carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rebase {
    pub pulsar_topic: String,
    /// The topic's last assigned sequence when the leader read its outbox:
    /// `drop` names nothing above it. Copies first seen after the read are
    /// dropped by apply, which finds them in the window (see
    /// `state::rebase`), and by the leader's second read.
    pub assigned: u64,
    /// The proven messages of an older generation of the cluster above the
    /// topic's committed watermark, as (sequence, key).
    pub older: Vec<(u64, Key)>,
    /// The outbox's sequences (at most `assigned`) whose message has a key
    /// among `older`'s: in Pulsar already.
    pub drop: Vec<u64>,
}

/// What [`Command::SetAside`] carries, and what the store keeps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAside {
    pub pulsar_topic: String,
    pub seq: u64,
    /// Why it is not in the topic itself.
    pub reason: String,
    pub message: OutboxMessage,
    /// The store's bound in bytes (of payloads and topics).
    pub keep_bytes: u64,
}

/// One line per entry for openraft's logs, which print every entry's
/// payload: its kind and size, never the payloads themselves.
impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Observe { observations, .. }
            | Command::ObserveWithProperties { observations, .. }
            | Command::ObserveSlim { observations, .. }
            | Command::ObserveKinds { observations, .. } => {
                write!(f, "observe({} copies)", observations.len())
            }
            Command::Published { pulsar_topic, seq } => {
                write!(f, "published({pulsar_topic} up to {seq})")
            }
            Command::Level { level } => write!(f, "level({level})"),
            Command::SetAside(_) => write!(f, "set-aside"),
            Command::Generation { generation } => write!(f, "generation({generation})"),
            Command::Rebase(_) => write!(f, "rebase"),
        }
    }
}

impl Command {
    /// A batch of observations, with their properties where they have any.
    pub fn observe(
        stamped_ms: u64,
        window: Window,
        observations: Vec<Observation>,
        properties: Vec<Option<Box<Properties>>>,
    ) -> Command {
        if properties.iter().all(Option::is_none) {
            Command::Observe {
                stamped_ms,
                window,
                observations,
            }
        } else {
            Command::ObserveWithProperties {
                stamped_ms,
                window,
                observations,
                properties,
            }
        }
    }

    /// (stamp, window, observations) of an observing command.
    pub fn as_observe(&self) -> Option<(u64, Window, &[Observation])> {
        match self {
            Command::Observe {
                stamped_ms,
                window,
                observations,
            }
            | Command::ObserveWithProperties {
                stamped_ms,
                window,
                observations,
                ..
            }
            | Command::ObserveSlim {
                stamped_ms,
                window,
                observations,
                ..
            }
            | Command::ObserveKinds {
                stamped_ms,
                window,
                observations,
                ..
            } => Some((*stamped_ms, *window, observations)),
            Command::Published { .. }
            | Command::Level { .. }
            | Command::SetAside(_)
            | Command::Generation { .. }
            | Command::Rebase(_) => None,
        }
    }

    /// The properties of observation `pos`, if it has any.
    pub fn properties(&self, pos: usize) -> Option<&Properties> {
        match self {
            Command::ObserveWithProperties { properties, .. }
            | Command::ObserveSlim { properties, .. }
            | Command::ObserveKinds { properties, .. } => {
                properties.get(pos).and_then(|p| p.as_deref())
            }
            _ => None,
        }
    }

    /// The positions of slim copies, ascending; empty unless
    /// [`Command::ObserveSlim`] or [`Command::ObserveKinds`].
    pub fn slim(&self) -> &[u32] {
        match self {
            Command::ObserveSlim { slim, .. } | Command::ObserveKinds { slim, .. } => slim,
            _ => &[],
        }
    }

    /// The key kind of observation `pos`: [`KeyKind::Unknown`] in the
    /// commands from before kinds.
    pub fn kind(&self, pos: usize) -> KeyKind {
        match self {
            Command::ObserveKinds { kinds, .. } => kinds.get(pos).copied().unwrap_or_default(),
            _ => KeyKind::Unknown,
        }
    }

    /// The observations, if it carries any.
    pub fn observations(&self) -> Option<&Vec<Observation>> {
        match self {
            Command::Observe { observations, .. }
            | Command::ObserveWithProperties { observations, .. }
            | Command::ObserveSlim { observations, .. }
            | Command::ObserveKinds { observations, .. } => Some(observations),
            Command::Published { .. }
            | Command::Level { .. }
            | Command::SetAside(_)
            | Command::Generation { .. }
            | Command::Rebase(_) => None,
        }
    }

    /// The observations, to take payloads out of without copying them.
    pub fn observations_mut(&mut self) -> Option<&mut Vec<Observation>> {
        match self {
            Command::Observe { observations, .. }
            | Command::ObserveWithProperties { observations, .. }
            | Command::ObserveSlim { observations, .. }
            | Command::ObserveKinds { observations, .. } => Some(observations),
            Command::Published { .. }
            | Command::Level { .. }
            | Command::SetAside(_)
            | Command::Generation { .. }
            | Command::Rebase(_) => None,
        }
    }
}

/// A message waiting in the outbox until Pulsar has it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxMessage {
    pub key: Key,
    pub mqtt_topic: String,
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    pub node: NodeId,
    /// Window clock when the first copy was applied; becomes the event time.
    pub first_seen_ms: u64,
    /// MQTT 5 properties, for the Pulsar message.
    pub properties: Option<Box<Properties>>,
}

/// [`OutboxMessage`] as versions before MQTT 5 properties wrote it (inline
/// outbox records and snapshots).
#[derive(Deserialize)]
struct OutboxMessageV1 {
    key: Key,
    mqtt_topic: String,
    #[serde(with = "serde_bytes")]
    payload: Vec<u8>,
    node: NodeId,
    first_seen_ms: u64,
}

impl OutboxMessage {
    /// Decodes a stored message, of this version or the one before.
    pub fn decode(raw: &[u8]) -> Result<Self, bincode::Error> {
        match bincode::deserialize::<OutboxMessage>(raw) {
            Ok(m) => Ok(m),
            Err(e) => match bincode::deserialize::<OutboxMessageV1>(raw) {
                Ok(v1) => Ok(OutboxMessage {
                    key: v1.key,
                    mqtt_topic: v1.mqtt_topic,
                    payload: v1.payload,
                    node: v1.node,
                    first_seen_ms: v1.first_seen_ms,
                    properties: None,
                }),
                Err(_) => Err(e),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of [`Observation`] before its payload was encoded as bytes.
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct ObservationAsSequence {
        key: Key,
        mqtt_topic: String,
        pulsar_topic: String,
        payload: Vec<u8>,
        qos: u8,
        retain: bool,
        node: NodeId,
        received_ms: u64,
    }

    /// Logs, snapshots and peers written before `serde_bytes` must still be
    /// read, and be read the same: bincode 1 writes a byte run and a
    /// sequence of `u8` identically (a u64 length, then the bytes).
    #[test]
    fn bytes_are_encoded_as_before() {
        let new = Observation {
            key: [9; 32],
            mqtt_topic: "/hfp/v1/x".into(),
            pulsar_topic: "persistent://public/default/t".into(),
            payload: (0..=255u8).collect(),
            qos: 1,
            retain: true,
            node: 3,
            received_ms: 1_539_059_572_000,
        };
        let old = ObservationAsSequence {
            key: new.key,
            mqtt_topic: new.mqtt_topic.clone(),
            pulsar_topic: new.pulsar_topic.clone(),
            payload: new.payload.clone(),
            qos: new.qos,
            retain: new.retain,
            node: new.node,
            received_ms: new.received_ms,
        };
        let written_before = bincode::serialize(&old).unwrap();
        assert_eq!(bincode::serialize(&new).unwrap(), written_before);
        assert_eq!(
            bincode::deserialize::<Observation>(&written_before).unwrap(),
            new
        );
        let props = Properties {
            correlation_data: Some(vec![1, 2, 3]),
            ..Default::default()
        };
        let raw = bincode::serialize(&props).unwrap();
        assert_eq!(bincode::deserialize::<Properties>(&raw).unwrap(), props);
    }

    /// The window's type changes nothing in the log: an entry of each
    /// observing kind encodes to the bytes it did when the window was a
    /// bare `u64` (variant, stamp, window, then the rest, little-endian).
    #[test]
    fn the_window_is_written_as_the_u64_it_was() {
        let stamped = 0x0102_0304_0506_0708u64;
        let window = Window::from_ms(0x1112_1314_1516_1718);
        let mut observe = vec![0, 0, 0, 0];
        observe.extend(stamped.to_le_bytes());
        observe.extend(window.as_ms().to_le_bytes());
        observe.extend(0u64.to_le_bytes());
        let cmd = Command::observe(stamped, window, Vec::new(), Vec::new());
        let raw = bincode::serialize(&cmd).unwrap();
        assert_eq!(raw, observe);
        assert_eq!(bincode::deserialize::<Command>(&raw).unwrap(), cmd);

        let mut kinds = vec![5, 0, 0, 0];
        kinds.extend(stamped.to_le_bytes());
        kinds.extend(window.as_ms().to_le_bytes());
        for _ in 0..4 {
            kinds.extend(0u64.to_le_bytes());
        }
        let cmd =
            Batch::default().into_command_at(crate::level::KINDS, stamped, window, Vec::new());
        let raw = bincode::serialize(&cmd).unwrap();
        assert_eq!(raw, kinds);
        assert_eq!(bincode::deserialize::<Command>(&raw).unwrap(), cmd);
    }
}
