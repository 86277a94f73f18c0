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

/// Why `topic` is not a name [`canonical`] maps to the topic the broker
/// would take it for, if it is not. The broker drops empty parts (`fs/`
/// and `/fs` are `fs` to it) and reads the scheme in any case, which
/// [`canonical`] does not, and must not start to (its answer is a
/// replicated rule): such names are refused where a config is checked, so
/// that two spellings of one topic cannot get past the check that one topic
/// has one name.
pub fn problem(topic: &str) -> Option<&'static str> {
    if topic.is_empty() || topic.contains('\0') || topic.trim() != topic {
        return Some("must be a Pulsar topic name, without spaces around it");
    }
    let (parts, full) = match topic.split_once("://") {
        Some((scheme, rest)) => {
            if scheme != "persistent" && scheme != "non-persistent" {
                return Some(
                    "the scheme must be `persistent://` or `non-persistent://`, in lower case",
                );
            }
            (rest.split('/').collect::<Vec<_>>(), true)
        }
        None => (topic.split('/').collect::<Vec<_>>(), false),
    };
    if parts.iter().any(|p| p.is_empty()) {
        return Some(
            "has an empty part (a `/` at an end, or two together): write the name without it",
        );
    }
    match (full, parts.len()) {
        (true, n) if n >= 3 => None,
        (true, _) => Some("a full name is `persistent://tenant/namespace/name`"),
        (false, 1 | 3) => None,
        (false, _) => {
            Some("write `name`, `tenant/namespace/name` or `persistent://tenant/namespace/name`")
        }
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

    /// Names the broker reads otherwise than [`canonical`] does are
    /// refused; the three spellings and the full names are not.
    #[test]
    fn names_canonical_would_misread_are_refused() {
        for ok in [
            "fs",
            "public/default/fs",
            "persistent://public/default/fs",
            "non-persistent://t/n/x",
            "persistent://prop/cluster/ns/x",
        ] {
            assert_eq!(problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            " fs",
            "fs/",
            "/fs",
            "public//fs",
            "public/fs",
            "PERSISTENT://public/default/fs",
            "pulsar://public/default/fs",
            "persistent://public/default/",
            "persistent://public/fs",
        ] {
            assert!(problem(bad).is_some(), "{bad:?} was not refused");
        }
    }

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
