//! The cluster secret, as a key: what authenticates the peers, names the
//! cluster's producers and proves its Pulsar messages. A leaf: the peer
//! protocol, the publisher and the HTTP API all derive what they need from
//! it, and it imports none of them.

/// The MAC key derived from the cluster secret.
#[derive(Clone)]
pub struct ClusterKey([u8; 32]);

impl ClusterKey {
    /// Derives the key from the secret file's contents (trailing newline
    /// ignored). An empty secret is refused by config validation.
    pub fn from_secret(secret: &[u8]) -> Self {
        let trimmed = secret.strip_suffix(b"\n").unwrap_or(secret);
        Self(blake3::derive_key("firstseen cluster secret v1", trimmed))
    }

    /// Whether `secret` (as an operator presents it to the admin API) is the
    /// cluster secret. Compares derived keys in constant time.
    pub fn matches_secret(&self, secret: &[u8]) -> bool {
        let other = Self::from_secret(secret);
        blake3::Hash::from(self.0) == blake3::Hash::from(other.0)
    }

    /// This cluster's id, as its producers' names carry it (16 hex
    /// digits): the same on every node, another for a cluster with another
    /// secret, and saying nothing about the secret. A secret rotated while
    /// messages wait unpublished makes the tail written under the old one
    /// foreign (docs/operations.md, "Security").
    pub fn cluster_id(&self) -> String {
        let h = blake3::keyed_hash(&self.0, b"firstseen cluster id");
        hex::encode(&h.as_bytes()[..8])
    }

    /// A key of its own for `context`, derived from this one: what the
    /// cluster proves its Pulsar messages with, say. Knowing it says
    /// nothing about this key or the secret.
    pub fn derive(&self, context: &str) -> [u8; 32] {
        *blake3::keyed_hash(&self.0, context.as_bytes()).as_bytes()
    }

    /// The key itself, for the MACs built on it (the peer protocol's).
    pub(crate) fn keyed(&self) -> &[u8; 32] {
        &self.0
    }
}

impl ClusterKey {
    /// The key of the secret in file `path`, the file named in the error
    /// by its setting (`cluster.secret_file`).
    pub fn read(setting: &str, path: &std::path::Path) -> Result<Self, crate::Error> {
        let raw = std::fs::read(path).map_err(|source| crate::Error::SettingFile {
            key: setting.into(),
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self::from_secret(&raw))
    }
}
