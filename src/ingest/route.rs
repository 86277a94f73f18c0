//! Routes: which Pulsar topic and key spec a message gets, the first route
//! whose filter matches its topic.

use super::filter::matches;
pub use crate::key::KeySpec;

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

/// The routes a node uses now, which a reload may replace while it runs
/// (`crate::node::reload`). Each message reads them once.
#[derive(Debug, Default)]
pub struct LiveRoutes(std::sync::RwLock<std::sync::Arc<Vec<Route>>>);

impl LiveRoutes {
    pub fn new(routes: std::sync::Arc<Vec<Route>>) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self(std::sync::RwLock::new(routes)))
    }

    /// The routes now.
    pub fn current(&self) -> std::sync::Arc<Vec<Route>> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Replaces them: the next message goes by the new ones.
    pub fn replace(&self, routes: std::sync::Arc<Vec<Route>>) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = routes;
    }
}
