//! What is wrong with a config, key by key. A leaf: every stage's
//! `config.rs` adds to a [`Problems`] and imports nothing else from here.

/// One problem with a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted path of the offending key, e.g. `upstreams[0].url`.
    pub key: String,
    /// What is wrong with it, in words an operator can act on.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Every problem found so far, in the order the checks found them, so one
/// run of `check-config` shows all there is to fix.
#[derive(Debug, Default)]
pub struct Problems(Vec<Problem>);

impl Problems {
    pub fn add(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            key: key.into(),
            message: message.into(),
        });
    }

    pub fn into_vec(self) -> Vec<Problem> {
        self.0
    }
}
