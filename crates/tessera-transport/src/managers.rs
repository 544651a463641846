//! The replicas of a replicated manager as a client or a storage server knows them, kept
//! up to date from the group itself (issue 17).
//!
//! A peer starts with the addresses it was given (`cluster.toml`, `--cluster`,
//! `TESSERA_CLUSTER`); a request goes to the *current* replica and moves on to the next
//! when that one does not answer or cannot order ([`ManagerReplicas::fail_over`]). The group
//! changes (`tessera manager add|remove`), so a peer that started with one more than once
//! *learns* it: it asks a replica for `ReplicaGroup` (the members and their addresses as
//! that replica applied them) and takes the members as its list
//! ([`ManagerReplicas::learn`]). It learns on its first answer, after a failover, at most
//! every [`GROUP_REFRESH`] otherwise, and, when a whole round of replicas failed, from any
//! replica that still answers (a removed replica answers with the group that removed it).
//! A peer given one address takes the manager for one that is not replicated, and never asks.

use crate::Transport;
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tessera_wire::{ManagerRequest, ManagerResponse};
use tokio::time::Instant;

/// Longest a peer of a replicated manager goes on a list without asking for the group again
/// (while it makes requests: the list is refreshed after an answer, not by a timer).
pub const GROUP_REFRESH: Duration = Duration::from_secs(2);

/// The manager's replicas (one address for a manager that is not replicated) and the one
/// requests go to now.
pub struct ManagerReplicas {
    /// The replicas' addresses, never empty.
    addrs: Mutex<Vec<SocketAddr>>,
    /// Index (modulo the list's length) of the replica requests go to.
    current: AtomicUsize,
    /// Whether the manager is replicated: given several addresses.
    replicated: bool,
    /// Whether the list follows the group ([`ManagerReplicas::fixed`]: not).
    learns: bool,
    /// When the group was last asked for (`None`: never).
    learned_at: Mutex<Option<Instant>>,
    /// A failover happened since the group was last asked for.
    moved: AtomicBool,
}

impl ManagerReplicas {
    /// The replicas at `addrs` (not empty), the first current.
    pub fn new(addrs: Vec<SocketAddr>) -> ManagerReplicas {
        assert!(!addrs.is_empty(), "a peer of the manager needs its address");
        ManagerReplicas {
            replicated: addrs.len() > 1,
            learns: true,
            addrs: Mutex::new(addrs),
            current: AtomicUsize::new(0),
            learned_at: Mutex::new(None),
            moved: AtomicBool::new(false),
        }
    }

    /// The replicas at `addrs`, a list that never follows the group (the simulator's
    /// clients: with learning, its checker found a read of a client's own write answered
    /// stale, five replicas with 2% loss, seed 6; not understood yet).
    pub fn fixed(addrs: Vec<SocketAddr>) -> ManagerReplicas {
        ManagerReplicas {
            learns: false,
            ..ManagerReplicas::new(addrs)
        }
    }

    /// Whether the manager is replicated (several addresses were given).
    pub fn replicated(&self) -> bool {
        self.replicated
    }

    /// The replicas' addresses as known now.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.addrs.lock().unwrap().clone()
    }

    /// How many replicas are known.
    pub fn len(&self) -> usize {
        self.addrs.lock().unwrap().len()
    }

    /// Never: the list is never empty (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The replica requests go to now, with its index.
    pub fn current(&self) -> (usize, SocketAddr) {
        let addrs = self.addrs.lock().unwrap();
        let index = self.current.load(Ordering::SeqCst) % addrs.len();
        (index, addrs[index])
    }

    /// Moves on from replica `index` (unless another request already did).
    pub fn fail_over(&self, index: usize) {
        let next = (index + 1) % self.len();
        let _ = (self.current).compare_exchange(index, next, Ordering::SeqCst, Ordering::SeqCst);
        self.moved.store(true, Ordering::SeqCst);
    }

    /// Whether the group should be asked for now (see the module doc); if so, it counts as
    /// asked from `now`, so that concurrent requests do not all ask.
    pub fn begin_learning(&self, now: Instant) -> bool {
        if !self.replicated || !self.learns {
            return false;
        }
        let mut learned_at = self.learned_at.lock().unwrap();
        let due = match *learned_at {
            None => true,
            Some(at) => {
                self.moved.load(Ordering::SeqCst)
                    || now.saturating_duration_since(at) >= GROUP_REFRESH
            }
        };
        if due {
            *learned_at = Some(now);
            self.moved.store(false, Ordering::SeqCst);
        }
        due
    }

    /// Takes the group `members` (id, address) that replica `answering` gave as the list:
    /// their parseable addresses, `answering` current if it is among them. A list with no
    /// address is ignored. Whether the list changed.
    pub fn learned(&self, answering: SocketAddr, members: &[(u16, String)], now: Instant) -> bool {
        *self.learned_at.lock().unwrap() = Some(now);
        self.moved.store(false, Ordering::SeqCst);
        let learned: Vec<SocketAddr> = members
            .iter()
            .filter_map(|(_, addr)| addr.parse().ok())
            .collect();
        if learned.is_empty() {
            return false;
        }
        let mut addrs = self.addrs.lock().unwrap();
        if *addrs == learned {
            return false;
        }
        let index = learned.iter().position(|&a| a == answering).unwrap_or(0);
        *addrs = learned;
        self.current.store(index, Ordering::SeqCst);
        true
    }

    /// Asks replica `addr` for the group and learns it; whether it answered with one (an
    /// answer without a group, or none, still counts as asked: no peer asks again at once).
    pub async fn learn(&self, transport: &dyn Transport, addr: SocketAddr) -> bool {
        let asked = crate::call::<_, ManagerResponse>(
            transport,
            addr,
            &ManagerRequest::ReplicaGroup,
            Bytes::new(),
        )
        .await;
        let now = Instant::now();
        match asked {
            Ok((ManagerResponse::ReplicaGroup { members, .. }, _)) if !members.is_empty() => {
                if self.learned(addr, &members, now) {
                    tracing::info!("the manager's replicas are now {:?}", self.addrs());
                }
                true
            }
            _ => {
                *self.learned_at.lock().unwrap() = Some(now);
                false
            }
        }
    }

    /// After a round in which no replica answered: learns the group from the first replica
    /// that gives one, if any does.
    pub async fn learn_from_any(&self, transport: &dyn Transport) -> bool {
        if !self.replicated || !self.learns {
            return false;
        }
        for addr in self.addrs() {
            if self.learn(transport, addr).await {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// A peer fails over round the list, learns a new group with the answering replica
    /// current, and is due to ask again after a failover or the refresh time.
    #[test]
    fn the_list_follows_the_group() {
        let replicas = ManagerReplicas::new(vec![addr(1), addr(2), addr(3)]);
        let start = Instant::now();
        assert!(replicas.begin_learning(start), "never asked");
        assert!(!replicas.begin_learning(start), "asked already");
        assert_eq!(replicas.current(), (0, addr(1)));
        replicas.fail_over(0);
        replicas.fail_over(0);
        assert_eq!(replicas.current(), (1, addr(2)), "one move per failure");
        let members = [(2, addr(2).to_string()), (3, addr(3).to_string())];
        let members = [&members[..], &[(4, addr(4).to_string())]].concat();
        assert!(replicas.learned(addr(3), &members, start));
        assert_eq!(replicas.addrs(), vec![addr(2), addr(3), addr(4)]);
        assert_eq!(replicas.current(), (1, addr(3)), "the answering replica");
        assert!(!replicas.begin_learning(start + GROUP_REFRESH / 2));
        replicas.fail_over(1);
        assert!(replicas.begin_learning(start), "moved");
        assert!(replicas.begin_learning(start + GROUP_REFRESH));
        assert!(!replicas.learned(addr(4), &[(9, "not an address".into())], start));
        assert_eq!(replicas.addrs().len(), 3, "an empty group is ignored");
    }

    /// A manager given by one address is not replicated: its peers never ask for a group.
    #[test]
    fn one_address_never_asks() {
        let replicas = ManagerReplicas::new(vec![addr(1)]);
        assert!(!replicas.replicated());
        assert!(!replicas.begin_learning(Instant::now()));
    }
}
