//! A cap on what one client address may hold at once, shared by the
//! listeners that face the network (the HTTP API and the peer port). A
//! global cap alone lets one host take every slot and keep everyone else,
//! members included, out; with a per-address cap below it, a flood from one
//! address leaves room for the rest.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Counts what each address holds, up to `cap`.
pub struct PerAddress {
    cap: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

impl PerAddress {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// A slot for one more from `ip`, or `None` when it holds `cap` already.
    pub fn take(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let mut m = firstseen_store::sync::lock(&self.held);
        let n = m.entry(ip).or_insert(0);
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(Slot {
            table: self.clone(),
            ip,
        })
    }
}

/// One place in a [`PerAddress`], given back when dropped.
pub struct Slot {
    table: Arc<PerAddress>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut m = firstseen_store::sync::lock(&self.table.held);
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_is_capped_and_others_are_not() {
        let t = PerAddress::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = t.take(a).unwrap();
        let _second = t.take(a).unwrap();
        assert!(t.take(a).is_none());
        assert!(t.take(b).is_some());
        drop(first);
        assert!(t.take(a).is_some(), "a slot given back is free again");
        assert!(
            t.held.lock().unwrap().get(&b).is_none(),
            "emptied entries go"
        );
    }
}
