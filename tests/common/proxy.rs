//! A TCP fault proxy for the cluster tests, in the spirit of toxiproxy.
//!
//! One proxy sits in front of each node's peer port (and, for upstream
//! faults, in front of Mosquitto for one node). Nodes make their outgoing
//! peer connections from their own loopback address (127.a.b.1x), so a proxy
//! knows which node a connection comes from. Cutting a node refuses and
//! tears down every connection from or to it; healing lets them through
//! again.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Sources currently cut, shared by every proxy of a test.
#[derive(Clone, Default)]
pub struct Faults {
    cut: Arc<Mutex<BTreeSet<IpAddr>>>,
    /// Bumped on every change so proxies drop connections that are now cut.
    generation: Arc<watch::Sender<u64>>,
}

impl Faults {
    pub fn new() -> Self {
        let (tx, _) = watch::channel(0);
        Self {
            cut: Default::default(),
            generation: Arc::new(tx),
        }
    }

    pub fn cut(&self, ip: IpAddr) {
        self.cut.lock().unwrap().insert(ip);
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn heal(&self, ip: IpAddr) {
        self.cut.lock().unwrap().remove(&ip);
        self.generation.send_modify(|g| *g += 1);
    }

    fn is_cut(&self, ip: &IpAddr) -> bool {
        self.cut.lock().unwrap().contains(ip)
    }
}

/// A proxy on 127.0.0.1 forwarding to `target`, which belongs to `owner`
/// (the node behind it; cutting the owner cuts everything through it).
pub struct Proxy {
    pub port: u16,
    _runtime: tokio::runtime::Runtime,
}

impl Proxy {
    pub fn start(target: SocketAddr, owner: IpAddr, faults: Faults) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let port = listener.local_addr().unwrap().port();
        runtime.spawn(async move {
            loop {
                let Ok((client, from)) = listener.accept().await else {
                    continue;
                };
                let faults = faults.clone();
                tokio::spawn(async move {
                    let blocked = |f: &Faults| f.is_cut(&owner) || f.is_cut(&from.ip());
                    if blocked(&faults) {
                        return; // dropping the socket refuses the connection
                    }
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let mut changes = faults.generation.subscribe();
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let pipe = async {
                        tokio::select! {
                            _ = tokio::io::copy(&mut cr, &mut sw) => {}
                            _ = tokio::io::copy(&mut sr, &mut cw) => {}
                        }
                    };
                    let watch_cut = async {
                        loop {
                            if changes.changed().await.is_err() || blocked(&faults) {
                                break;
                            }
                        }
                    };
                    tokio::select! {
                        _ = pipe => {}
                        _ = watch_cut => {}
                    }
                });
            }
        });
        Self {
            port,
            _runtime: runtime,
        }
    }
}
