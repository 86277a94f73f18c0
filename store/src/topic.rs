//! Pulsar topic names. The broker takes a topic in three spellings:
//! `fs`, `public/default/fs` and `persistent://public/default/fs` are one
//! topic. Everything that names a topic for the cluster (the window's
//! identity of a copy, the outbox, sequences, publishers, proofs, `verify`)
//! must agree on one name for it, or one topic becomes two with two
//! sequences and two publishers fighting for its exclusive producer.
//!
//! From cluster level 3 (`NAMES`, in [`crate::level`]) the state names topics by
//! [`canonical`]; this function is then part of the replicated rules, and
//! its answer for a given name must never change.

use std::borrow::Cow;

/// A topic as the broker names it: `my-topic` is
/// `persistent://public/default/my-topic`, and `tenant/ns/my-topic` is
/// `persistent://tenant/ns/my-topic`. A name with a scheme is taken as it is.
pub fn canonical(topic: &str) -> Cow<'_, str> {
    if topic.contains("://") {
        Cow::Borrowed(topic)
    } else if topic.matches('/').count() == 2 {
        Cow::Owned(format!("persistent://{topic}"))
    } else {
        Cow::Owned(format!("persistent://public/default/{topic}"))
    }
}

/// Whether `a` and `b` name the same topic.
pub fn same(a: &str, b: &str) -> bool {
    canonical(a) == canonical(b)
}

/// The other spellings of the topic `topic` (any spelling): the names,
/// other than its canonical one, that [`canonical`] maps to the same topic.
/// Empty for a topic that has no short spelling (non-persistent, or a name
/// whose last part holds a `/`).
pub fn other_spellings(topic: &str) -> Vec<String> {
    let full = canonical(topic);
    let mut out = Vec::new();
    if let Some(rest) = full.strip_prefix("persistent://") {
        out.push(rest.to_string());
        if let Some(short) = rest.strip_prefix("public/default/") {
            out.push(short.to_string());
        }
    }
    out.retain(|s| canonical(s) == full);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_spellings_are_one_topic() {
        for s in ["fs", "public/default/fs", "persistent://public/default/fs"] {
            assert_eq!(canonical(s), "persistent://public/default/fs");
            assert!(same(s, "fs"));
        }
        assert_eq!(canonical("t/n/x"), "persistent://t/n/x");
        assert_eq!(
            canonical("non-persistent://t/n/x"),
            "non-persistent://t/n/x"
        );
        assert!(!same("fs", "t/n/fs"));
        assert_eq!(
            other_spellings("fs"),
            vec!["public/default/fs".to_string(), "fs".to_string()]
        );
        assert_eq!(
            other_spellings("persistent://t/n/x"),
            vec!["t/n/x".to_string()]
        );
        assert!(other_spellings("non-persistent://t/n/x").is_empty());
        for s in other_spellings("persistent://public/default/fs") {
            assert!(same(&s, "fs"));
        }
    }
}
