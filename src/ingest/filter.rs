//! MQTT topic filters: their syntax, which the config checks, and how they
//! match a topic, which routing uses. Pure, and apart from both so that the
//! config section and the routes do not import each other.

/// Whether `filter` is a valid MQTT topic filter: `#` only as the last whole
/// level, `+` only as a whole level, not empty, no NUL.
pub fn filter_is_valid(filter: &str) -> bool {
    if filter.is_empty() || filter.contains('\0') {
        return false;
    }
    let levels: Vec<&str> = filter.split('/').collect();
    for (i, level) in levels.iter().enumerate() {
        if level.contains('#') && (*level != "#" || i != levels.len() - 1) {
            return false;
        }
        if level.contains('+') && *level != "+" {
            return false;
        }
    }
    true
}

/// Whether `topic` matches `filter` (MQTT 3.1.1 §4.7). Topics starting with
/// `$` are not matched by a leading wildcard.
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_like_mqtt() {
        assert!(matches("/hfp/v1/#", "/hfp/v1/journey/ongoing/bus"));
        assert!(matches("/hfp/v1/#", "/hfp/v1"));
        assert!(matches("a/+/c", "a/b/c"));
        assert!(!matches("a/+/c", "a/b/d"));
        assert!(!matches("a/+", "a/b/c"));
        assert!(matches("#", "anything/at/all"));
        assert!(!matches("#", "$SYS/broker"));
        assert!(matches("a/b", "a/b"));
        assert!(!matches("a/b", "a/b/c"));
        // Topics with spaces (HSL headsigns) are ordinary levels.
        assert!(matches(
            "/hfp/v1/journey/+/bus/#",
            "/hfp/v1/journey/ongoing/bus/0018/00640/1057/1/Munkkiniemi/07:32"
        ));
    }

    #[test]
    fn invalid_filters_are_refused() {
        assert!(filter_is_valid("a/#"));
        assert!(filter_is_valid("+/b/+"));
        assert!(!filter_is_valid(""));
        assert!(!filter_is_valid("a/#/b"));
        assert!(!filter_is_valid("a/b#"));
        assert!(!filter_is_valid("a+/b"));
    }
}
