//! Several firstseen nodes forming one Raft group, each in its own "zone":
//! its own loopback address, a fault proxy in front of its peer port and a
//! fault proxy in front of its MQTT connection.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use super::proxy::{Faults, Proxy};
use super::*;

/// A loopback subnet 127.a.b.0/24 of one test cluster, chosen at random so
/// that clusters of tests running in parallel never share addresses (a
/// node's outgoing connections take ports on its own address).
#[derive(Clone, Copy)]
pub struct Net(u8, u8);

impl Net {
    fn random() -> Self {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
            ^ std::process::id().rotate_left(16);
        Net(1 + (n % 250) as u8, ((n >> 8) % 250) as u8)
    }

    /// Node `id`'s address: its peer traffic comes from here.
    pub fn node_ip(&self, id: u64) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, self.0, self.1, 10 + id as u8))
    }

    /// The owner address of node `id`'s upstream proxy (cut it to drop only
    /// that node's MQTT connection).
    pub fn upstream_ip(&self, id: u64) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, self.0, self.1, 100 + id as u8))
    }
}

pub struct TestCluster {
    pub nodes: Vec<Node>,
    pub faults: Faults,
    pub secret: TempDir,
    _proxies: Vec<Proxy>,
    mqtt_port: u16,
    pulsar: Pulsar,
    topic: String,
    members: Vec<MemberConfig>,
    net: Net,
}

impl TestCluster {
    /// Starts `n` nodes (ids 1..=n, zones zone-a, zone-b, …) on one upstream
    /// and one Pulsar topic. `tweak` adjusts each node's spec.
    pub fn start(
        mqtt: &Mosquitto,
        pulsar: &Pulsar,
        topic: &str,
        n: u64,
        tweak: impl Fn(&mut NodeSpec),
    ) -> Self {
        let secret = TempDir::new().unwrap();
        std::fs::write(
            secret.path().join("cluster.secret"),
            "test-cluster-secret-of-more-than-32-bytes\n",
        )
        .unwrap();
        let faults = Faults::new();
        let net = Net::random();
        let mut proxies = Vec::new();
        let mut plan = Vec::new();
        let mut members = Vec::new();
        for id in 1..=n {
            let peer_port = free_port_on(net.node_ip(id));
            let http_port = free_port();
            let listen = SocketAddr::new(net.node_ip(id), peer_port);
            let peer_proxy = Proxy::start(listen, net.node_ip(id), faults.clone());
            let mqtt_proxy = Proxy::start(
                SocketAddr::from(([127, 0, 0, 1], mqtt.port)),
                net.upstream_ip(id),
                faults.clone(),
            );
            members.push(MemberConfig {
                id,
                zone: zone(id),
                addr: SocketAddr::from(([127, 0, 0, 1], peer_proxy.port)).to_string(),
                http: SocketAddr::from(([127, 0, 0, 1], http_port)).to_string(),
            });
            plan.push((id, listen, http_port, mqtt_proxy.port));
            proxies.push(peer_proxy);
            proxies.push(mqtt_proxy);
        }
        let mut nodes = Vec::new();
        for (id, listen, http_port, mqtt_port) in plan {
            let mut spec = member_spec(
                id,
                mqtt_port,
                pulsar,
                topic,
                listen,
                &secret.path().join("cluster.secret"),
            );
            spec.config.cluster.members = members.clone();
            spec.http_port = Some(http_port);
            tweak(&mut spec);
            nodes.push(Node::start(spec));
        }
        Self {
            nodes,
            faults,
            secret,
            _proxies: proxies,
            mqtt_port: mqtt.port,
            pulsar: pulsar.clone(),
            topic: topic.to_string(),
            members,
            net,
        }
    }

    /// Starts node `id` outside the initial members: it waits, empty, to be
    /// added. Returns its (peer address, http address) for `members add`.
    pub fn start_joiner(&mut self, id: u64, tweak: impl Fn(&mut NodeSpec)) -> (String, String) {
        let peer_port = free_port_on(self.net.node_ip(id));
        let http_port = free_port();
        let listen = SocketAddr::new(self.net.node_ip(id), peer_port);
        let peer_proxy = Proxy::start(listen, self.net.node_ip(id), self.faults.clone());
        let mqtt_proxy = Proxy::start(
            SocketAddr::from(([127, 0, 0, 1], self.mqtt_port)),
            self.net.upstream_ip(id),
            self.faults.clone(),
        );
        let addr = SocketAddr::from(([127, 0, 0, 1], peer_proxy.port)).to_string();
        let http = SocketAddr::from(([127, 0, 0, 1], http_port)).to_string();
        let mut spec = member_spec(
            id,
            mqtt_proxy.port,
            &self.pulsar,
            &self.topic,
            listen,
            &self.secret_file(),
        );
        spec.config.cluster.members = self.members.clone();
        spec.http_port = Some(http_port);
        tweak(&mut spec);
        self._proxies.push(peer_proxy);
        self._proxies.push(mqtt_proxy);
        self.nodes.push(Node::start(spec));
        (addr, http)
    }

    pub fn node(&mut self, id: u64) -> &mut Node {
        &mut self.nodes[(id - 1) as usize]
    }

    /// Starts replaying the capture with `args` and SIGKILLs the leader
    /// once it has published more than `after` messages. Returns the replay
    /// (still running), the killed node, the time of the kill and the node
    /// the others then elect.
    pub fn kill_leader_mid_replay(
        &mut self,
        args: &[&str],
        after: u64,
    ) -> (std::process::Child, u64, Instant, u64) {
        let old = self.wait_leader(None, Duration::from_secs(30));
        let replay = replay_cmd(self.mqtt_port, args).spawn().unwrap();
        wait_until(
            Duration::from_secs(30),
            "part of the feed published",
            || self.node(old).published() > after,
        );
        let killed_at = Instant::now();
        self.node(old).kill9();
        let rest: Vec<u64> = (1..=self.nodes.len() as u64)
            .filter(|i| *i != old)
            .collect();
        let new = self.wait_leader_among(&rest, Some(old), Duration::from_secs(30));
        (replay, old, killed_at, new)
    }

    /// The leader as the running nodes agree on it, if they do.
    pub fn leader(&self) -> Option<u64> {
        let mut seen = None;
        for n in self.nodes.iter().filter(|n| n.is_running()) {
            let l = n.status()?.leader?;
            if seen.is_some_and(|s| s != l) {
                return None;
            }
            seen = Some(l);
        }
        seen
    }

    /// Waits until the running nodes agree on a leader (other than `not`).
    pub fn wait_leader(&self, not: Option<u64>, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(l) = self.leader().filter(|l| Some(*l) != not) {
                return l;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("no agreed leader within {timeout:?}");
    }

    /// The leader that all of `ids` agree on.
    pub fn leader_among(&self, ids: &[u64]) -> Option<u64> {
        let mut seen = None;
        for id in ids {
            let l = self.nodes[(*id - 1) as usize].status()?.leader?;
            if seen.is_some_and(|s| s != l) {
                return None;
            }
            seen = Some(l);
        }
        seen
    }

    /// Waits until `ids` agree on a leader other than `not`.
    pub fn wait_leader_among(&self, ids: &[u64], not: Option<u64>, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(l) = self.leader_among(ids).filter(|l| Some(*l) != not) {
                return l;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("nodes {ids:?} agreed on no leader within {timeout:?}");
    }

    /// Waits until every running node is ready.
    pub fn wait_ready(&self) {
        for n in self.nodes.iter().filter(|n| n.is_running()) {
            n.wait_ready();
        }
    }

    /// Cuts node `id` off from its peers, in both directions.
    pub fn isolate(&self, id: u64) {
        self.faults.cut(self.net.node_ip(id));
    }

    pub fn heal(&self, id: u64) {
        self.faults.heal(self.net.node_ip(id));
    }

    /// Drops node `id`'s upstream MQTT connection (and refuses new ones).
    pub fn cut_upstream(&self, id: u64) {
        self.faults.cut(self.net.upstream_ip(id));
    }

    pub fn heal_upstream(&self, id: u64) {
        self.faults.heal(self.net.upstream_ip(id));
    }

    pub fn secret_file(&self) -> PathBuf {
        self.secret.path().join("cluster.secret")
    }

    /// `firstseen upgrade` against node `id`'s API, as an operator runs
    /// it; panics with its output if it fails.
    pub fn upgrade_via(&mut self, id: u64) {
        let out = std::process::Command::new(bin())
            .args(["upgrade", "--url"])
            .arg(format!("http://127.0.0.1:{}", self.node(id).http_port))
            .arg("--secret-file")
            .arg(self.secret_file())
            .output()
            .unwrap();
        assert!(out.status.success(), "firstseen upgrade: {out:?}");
    }
}

pub fn zone(id: u64) -> String {
    format!("zone-{}", (b'a' + (id - 1) as u8) as char)
}

/// Node `id` of a test cluster: its upstream through the proxy on
/// `mqtt_port`, its peer port `listen`, the cluster's secret.
fn member_spec(
    id: u64,
    mqtt_port: u16,
    pulsar: &Pulsar,
    topic: &str,
    listen: SocketAddr,
    secret_file: &Path,
) -> NodeSpec {
    let mqtt = format!("mqtt://{}", SocketAddr::from(([127, 0, 0, 1], mqtt_port)));
    let mut spec = NodeSpec::on(&mqtt, pulsar, topic);
    spec.config.node.id = id;
    spec.config.node.zone = zone(id);
    spec.config.cluster.listen = Some(listen);
    spec.config.cluster.secret_file = Some(secret_file.to_path_buf());
    spec
}
