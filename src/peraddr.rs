//! Caps on what clients may hold at once, shared by the listeners that face
//! the network (the HTTP API and the peer port).
//!
//! - **Per address group.** A global cap alone lets one host take every slot
//!   and keep everyone else, members included, out; with a cap per client
//!   below it, a flood from one client leaves room for the rest. A client
//!   is an IPv4 address, or an IPv6 /64: one host is routinely given a
//!   whole /64, and a cap per exact IPv6 address would cap nothing.
//! - **In all.** A few groups together must not hold more than the
//!   listener can serve (file descriptors, tasks, TLS states).
//! - **A reserve for members** ([`Admission`], the peer port): members'
//!   connections take slots of their own, which nothing from another
//!   address can hold. Without it, nine addresses with eight slots each
//!   held all 64 handshake slots of a peer port, and a restarted member
//!   could not get back in while they kept them full.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};

/// The client an address belongs to, for the caps: an IPv4 address, or the
/// /64 network of an IPv6 one (an IPv4-mapped IPv6 address is its IPv4).
pub fn client_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Why a connection got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// Its client (address or /64) holds its cap already.
    Client,
    /// Every slot is taken.
    All,
}

/// Counts what each client holds, up to `per_client`, and what all hold,
/// up to `total`.
pub struct PerAddress {
    per_client: usize,
    total: usize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    by_client: HashMap<IpAddr, usize>,
    all: usize,
}

impl PerAddress {
    /// Caps per client only.
    pub fn new(per_client: usize) -> Arc<Self> {
        Self::with_total(per_client, usize::MAX)
    }

    pub fn with_total(per_client: usize, total: usize) -> Arc<Self> {
        Arc::new(Self {
            per_client,
            total,
            held: Mutex::new(Held::default()),
        })
    }

    /// A slot for one more from `ip`, or why not.
    pub fn take(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, Full> {
        let client = client_of(ip);
        let mut h = firstseen_store::lock::lock(&self.held);
        if h.all >= self.total {
            return Err(Full::All);
        }
        let n = h.by_client.entry(client).or_insert(0);
        if *n >= self.per_client {
            return Err(Full::Client);
        }
        *n += 1;
        h.all += 1;
        Ok(Slot {
            table: self.clone(),
            client,
        })
    }

    /// Slots held now, in all.
    pub fn held(&self) -> usize {
        firstseen_store::lock::lock(&self.held).all
    }
}

/// One place in a [`PerAddress`], given back when dropped.
pub struct Slot {
    table: Arc<PerAddress>,
    client: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut h = firstseen_store::lock::lock(&self.table.held);
        h.all = h.all.saturating_sub(1);
        if let Some(n) = h.by_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                h.by_client.remove(&self.client);
            }
        }
    }
}

/// Most member addresses remembered; the oldest is forgotten past it.
const KNOWN_MEMBERS: usize = 64;

/// The peer port's admission: a reserve for the addresses members connect
/// from, and capped slots for everyone else.
///
/// A member's address is learned when a connection from it proves the
/// cluster secret (and can be given at start from the configured members).
/// A source address cannot be forged over TCP without being on the path, so
/// a flood from elsewhere can hold only the general slots. Learned rather
/// than taken from the members' configured addresses: those are where a
/// member is dialled, not where it dials from (a proxy, a NAT, a second
/// interface).
pub struct Admission {
    general: Arc<PerAddress>,
    members: Arc<PerAddress>,
    known: Mutex<VecDeque<IpAddr>>,
}

impl Admission {
    /// `per_client` and `total` for everyone else; `per_member` for each
    /// member address, apart from them.
    pub fn new(per_client: usize, total: usize, per_member: usize) -> Self {
        Self {
            general: PerAddress::with_total(per_client, total),
            members: PerAddress::new(per_member),
            known: Mutex::new(VecDeque::new()),
        }
    }

    /// Whether `ip` is a member's address, as far as this node knows.
    pub fn is_member(&self, ip: IpAddr) -> bool {
        firstseen_store::lock::lock(&self.known).contains(&ip)
    }

    /// Notes `ip` as an address a member connects from.
    pub fn learn(&self, ip: IpAddr) {
        let mut k = firstseen_store::lock::lock(&self.known);
        if let Some(at) = k.iter().position(|i| *i == ip) {
            k.remove(at);
        } else if k.len() >= KNOWN_MEMBERS {
            k.pop_front();
        }
        k.push_back(ip);
    }

    /// A slot for a connection from `ip`: from the members' reserve when it
    /// is a member's address, else from the general slots.
    pub fn take(&self, ip: IpAddr) -> Result<Slot, Full> {
        if self.is_member(ip) {
            self.members.take(ip)
        } else {
            self.general.take(ip)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn one_address_is_capped_and_others_are_not() {
        let t = PerAddress::new(2);
        let a = ip("10.0.0.1");
        let b = ip("10.0.0.2");
        let first = t.take(a).unwrap();
        let _second = t.take(a).unwrap();
        assert_eq!(t.take(a).err(), Some(Full::Client));
        assert!(t.take(b).is_ok());
        drop(first);
        assert!(t.take(a).is_ok(), "a slot given back is free again");
        assert!(
            !t.held.lock().unwrap().by_client.contains_key(&b),
            "emptied entries go"
        );
    }

    /// A host with an IPv6 /64 has 2^64 addresses: capped per exact
    /// address, it was not capped at all.
    #[test]
    fn an_ipv6_64_is_one_client_and_a_mapped_ipv4_is_its_ipv4() {
        let t = PerAddress::new(2);
        let _a = t.take(ip("2001:db8:1:2::1")).unwrap();
        let _b = t.take(ip("2001:db8:1:2:ffff::9")).unwrap();
        assert_eq!(t.take(ip("2001:db8:1:2::77")).err(), Some(Full::Client));
        assert!(t.take(ip("2001:db8:1:3::1")).is_ok(), "another /64");
        assert_eq!(client_of(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
    }

    #[test]
    fn the_total_caps_every_client_together() {
        let t = PerAddress::with_total(2, 3);
        let held: Vec<_> = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
            .iter()
            .map(|a| t.take(ip(a)).unwrap())
            .collect();
        assert_eq!(t.take(ip("10.0.0.4")).err(), Some(Full::All));
        assert_eq!(t.held(), 3);
        drop(held);
        assert_eq!(t.held(), 0);
        assert!(t.take(ip("10.0.0.4")).is_ok());
    }

    /// Nine addresses fill every general slot; a member's address still
    /// gets in, from its own reserve, and only once it is known.
    #[test]
    fn members_have_a_reserve_that_a_flood_cannot_hold() {
        let a = Admission::new(8, 64, 4);
        let flood: Vec<_> = (2..=10)
            .flat_map(|i| (0..8).map(move |_| ip(&format!("127.0.0.{i}"))))
            .filter_map(|addr| a.take(addr).ok())
            .collect();
        assert_eq!(flood.len(), 64, "the flood holds every general slot");
        let member = ip("127.0.0.1");
        assert_eq!(a.take(member).err(), Some(Full::All), "not yet known");
        a.learn(member);
        let held: Vec<_> = (0..4).map(|_| a.take(member).unwrap()).collect();
        assert_eq!(
            a.take(member).err(),
            Some(Full::Client),
            "its reserve is capped too"
        );
        drop(held);
        // The reserve is not for anyone else.
        assert_eq!(a.take(ip("127.0.0.11")).err(), Some(Full::All));
    }

    #[test]
    fn known_members_are_bounded_and_the_oldest_is_forgotten() {
        let a = Admission::new(1, 1, 1);
        for i in 0..(KNOWN_MEMBERS as u32 + 1) {
            a.learn(IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)));
        }
        assert!(!a.is_member(ip("10.0.0.0")));
        assert!(a.is_member(ip("10.0.0.1")));
        // Learning again refreshes an address.
        a.learn(ip("10.0.0.1"));
        a.learn(ip("10.1.0.0"));
        assert!(a.is_member(ip("10.0.0.1")));
    }
}
