//! MQTT topic filters and routes: which Pulsar topic and key spec a message gets.

pub use crate::key::KeySpec;

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

/// A compiled route.
#[derive(Debug, Clone)]
pub struct Route {
    pub filter: String,
    pub pulsar_topic: String,
    pub key: KeySpec,
}

impl Route {
    /// The config's routes, in the order they are tried.
    pub fn all(routes: &[super::config::RouteConfig]) -> std::sync::Arc<Vec<Route>> {
        std::sync::Arc::new(
            routes
                .iter()
                .map(|r| Route {
                    filter: r.filter.clone(),
                    pulsar_topic: r.pulsar_topic.clone(),
                    key: r.key.clone(),
                })
                .collect(),
        )
    }
}

/// The first route whose filter matches `topic`.
pub fn route_for<'a>(routes: &'a [Route], topic: &str) -> Option<&'a Route> {
    routes.iter().find(|r| matches(&r.filter, topic))
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

    #[test]
    fn first_matching_route_wins() {
        let routes = vec![
            Route {
                filter: "/hfp/v1/journey/#".into(),
                pulsar_topic: "j".into(),
                key: KeySpec::TOPIC_PAYLOAD,
            },
            Route {
                filter: "#".into(),
                pulsar_topic: "all".into(),
                key: KeySpec::PAYLOAD,
            },
        ];
        assert_eq!(
            route_for(&routes, "/hfp/v1/journey/x")
                .unwrap()
                .pulsar_topic,
            "j"
        );
        assert_eq!(
            route_for(&routes, "/hfp/v1/deadrun/x")
                .unwrap()
                .pulsar_topic,
            "all"
        );
    }
}
