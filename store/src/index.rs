//! The in-memory key index of the window, and the node bits it uses.
//!
//! On disk the window is packed records in time order (see [`crate::record`]),
//! which is cheap to write and expire but cannot answer "has this key been
//! seen?". This index answers it. It is rebuilt from the records when the
//! store opens, so it never holds anything the disk does not, and it is only
//! changed after the sled transaction of an entry commits.

use std::collections::HashMap;

use crate::record::{MAX_NODE_BITS, UNTRACKED};
use crate::{Key, NodeId};

/// Where a key of the window lives, and what is known about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Window record holding the key.
    pub rec: u64,
    /// Topic sequence of its first copy.
    pub seq: u64,
    /// Bits of the nodes that have delivered a copy.
    pub mask: u64,
    /// Position of the key in its record.
    pub item: u32,
    /// Bit of the node whose copy came first.
    pub node_bit: u8,
}

/// Every key in the window. About 64 bytes per key plus the map's slack.
#[derive(Debug, Default)]
pub struct Index {
    map: HashMap<Key, Slot>,
}

impl Index {
    pub fn get(&self, key: &Key) -> Option<&Slot> {
        self.map.get(key)
    }

    pub fn get_mut(&mut self, key: &Key) -> Option<&mut Slot> {
        self.map.get_mut(key)
    }

    pub fn insert(&mut self, key: Key, slot: Slot) {
        self.map.insert(key, slot);
    }

    /// Removes `key` if it still lives in record `rec`: a key that expired
    /// and was seen again lives in a newer record and stays.
    pub fn remove_from(&mut self, key: &Key, rec: u64) -> Option<Slot> {
        match self.map.get(key) {
            Some(slot) if slot.rec == rec => self.map.remove(key),
            _ => None,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }
}

/// Which node each bit of a mask stands for. Assigned in apply order, so
/// every member assigns the same bits.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeBits {
    ids: Vec<NodeId>,
}

impl NodeBits {
    pub fn bit_of(&self, node: NodeId) -> Option<u8> {
        self.ids.iter().position(|id| *id == node).map(|b| b as u8)
    }

    pub fn node_of(&self, bit: u8) -> Option<NodeId> {
        self.ids.get(bit as usize).copied()
    }

    /// The bit of `node`, giving it one if it has none. A bit is reused only
    /// when `unused` says no key in the window refers to its node any more.
    /// Returns [`UNTRACKED`] when every bit is taken.
    pub fn assign(&mut self, node: NodeId, unused: impl Fn(NodeId) -> bool) -> u8 {
        if let Some(bit) = self.bit_of(node) {
            return bit;
        }
        if self.ids.len() < MAX_NODE_BITS {
            self.ids.push(node);
            return (self.ids.len() - 1) as u8;
        }
        match self.ids.iter().position(|id| unused(*id)) {
            Some(reuse) => {
                self.ids[reuse] = node;
                reuse as u8
            }
            None => UNTRACKED,
        }
    }

    /// Node ids of the bits set in `mask`.
    pub fn nodes_in(&self, mask: u64) -> impl Iterator<Item = NodeId> + '_ {
        (0..MAX_NODE_BITS as u8)
            .filter(move |b| mask & (1 << b) != 0)
            .filter_map(|b| self.node_of(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_are_stable_and_reused_only_when_unused() {
        let mut bits = NodeBits::default();
        assert_eq!(bits.assign(7, |_| false), 0);
        assert_eq!(bits.assign(9, |_| false), 1);
        assert_eq!(bits.assign(7, |_| false), 0);
        for n in 100..162 {
            bits.assign(n, |_| false);
        }
        assert_eq!(bits.assign(500, |_| false), UNTRACKED);
        assert_eq!(bits.assign(500, |n| n == 9), 1);
        assert_eq!(bits.node_of(1), Some(500));
        assert_eq!(bits.nodes_in(0b11).collect::<Vec<_>>(), vec![7, 500]);
    }

    #[test]
    fn removal_respects_the_newer_record() {
        let mut index = Index::default();
        let slot = Slot {
            rec: 2,
            seq: 1,
            mask: 1,
            item: 0,
            node_bit: 0,
        };
        index.insert([1; 32], slot);
        assert_eq!(index.remove_from(&[1; 32], 1), None);
        assert_eq!(index.remove_from(&[1; 32], 2), Some(slot));
        assert!(index.is_empty());
    }
}
