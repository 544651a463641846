//! The replica group of a replicated manager, kept in the replicated state (issue 17 item 3).
//!
//! The group starts as the replicas of `--peers` (ids 1 to n, all members). Adding or
//! removing a replica is two ordered steps: [`Command::AddReplica`](crate::command::Command)
//! records the new replica's address (every replica then tells its order driver where the
//! new node listens), and the order's own group change (`tessera-order`'s
//! [`GroupChange`], one node at a time) makes it a member, or removes one, at the position
//! where it is UTO-delivered. Every replica applies that change to its store at that
//! position, by the order's rule ([`ReplicaGroup::apply`] is `GroupRecord::apply` on the
//! members), so the stores agree on the group at every position, and a replica that
//! restarts takes its group and its peers' addresses from its store, not from `--peers`.
//!
//! Stored: `replicas` (id -> address, every replica ever known) and in `meta`
//! `group_epoch` (the order's group epoch: changes applied since the whole group last
//! started, when the order counts from 0 again) and `group_members` (bit `id - 1` set for
//! each member). A store without them holds the initial group of `--peers`.

use crate::store::Failure;
use crate::Manager;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use tessera_order::{Group, GroupChange};
use tessera_wire::ManagerError;

/// `replicas`: replica id -> the address it listens at.
pub(crate) const REPLICAS: TableDefinition<u16, &str> = TableDefinition::new("replicas");
/// Key in `meta` of the order's group epoch.
const KEY_GROUP_EPOCH: &str = "group_epoch";
/// Key in `meta` of the members, bit `id - 1` per member.
const KEY_GROUP_MEMBERS: &str = "group_members";

/// A replicated manager's group as its store records it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaGroup {
    /// Group changes applied since the whole group last started.
    pub epoch: u32,
    /// Members, bit `id - 1` each.
    pub members: u64,
    /// The address of every replica known (members and others), by id.
    pub addresses: BTreeMap<u16, String>,
}

impl ReplicaGroup {
    /// The group of `--peers`: replica `i` at the `i`-th address, every one a member.
    pub fn initial(peers: &[SocketAddr]) -> ReplicaGroup {
        let addresses: BTreeMap<u16, String> = (1..)
            .zip(peers)
            .map(|(id, addr)| (id, addr.to_string()))
            .collect();
        let members = addresses
            .keys()
            .fold(0u64, |mask, &id| mask | bit(id).unwrap_or(0));
        ReplicaGroup {
            epoch: 0,
            members,
            addresses,
        }
    }

    /// Whether replica `id` is a member.
    pub fn contains(&self, id: u16) -> bool {
        bit(id).is_some_and(|bit| self.members & bit != 0)
    }

    /// The members' ids, in order.
    pub fn member_ids(&self) -> Vec<u16> {
        (1..=64u16).filter(|&id| self.contains(id)).collect()
    }

    /// The members and their addresses (empty for one whose address is not known).
    pub fn members(&self) -> Vec<(u16, String)> {
        let address = |id| self.addresses.get(&id).cloned().unwrap_or_default();
        self.member_ids()
            .into_iter()
            .map(|id| (id, address(id)))
            .collect()
    }

    /// The group as the order runs it: every member sends and receives.
    pub fn order_group(&self) -> Group {
        Group::from_masks(self.members, self.members)
    }

    /// The group after `change` (the order's rule: it names the next epoch and leaves a
    /// member), or `None`: the order ignores it too.
    pub fn apply(&self, change: &GroupChange) -> Option<ReplicaGroup> {
        if change.epoch != self.epoch.checked_add(1)? {
            return None;
        }
        let bit = bit(change.node.0.checked_add(1)?)?;
        let members = if change.role.receiver {
            self.members | bit
        } else {
            self.members & !bit
        };
        (members != 0).then(|| ReplicaGroup {
            epoch: change.epoch,
            members,
            addresses: self.addresses.clone(),
        })
    }
}

/// The member bit of replica `id` (1..=64).
fn bit(id: u16) -> Option<u64> {
    (1..=64).contains(&id).then(|| 1u64 << (id - 1))
}

impl Manager {
    /// The group this store records, if it records one (a store of the initial group
    /// records none until its first change).
    pub fn replica_group(&self) -> Result<Option<ReplicaGroup>, ManagerError> {
        let read = || -> Result<Option<ReplicaGroup>, Failure> {
            let txn = self.db.begin_read()?;
            let meta = txn.open_table(crate::store::META)?;
            let value = |key| -> Result<Option<u64>, Failure> {
                Ok(meta.get(key)?.map(|value| value.value()))
            };
            let (Some(epoch), Some(members)) = (value(KEY_GROUP_EPOCH)?, value(KEY_GROUP_MEMBERS)?)
            else {
                return Ok(None);
            };
            let mut addresses = BTreeMap::new();
            match txn.open_table(REPLICAS) {
                Ok(table) => {
                    for entry in table.iter()? {
                        let (id, addr) = entry?;
                        addresses.insert(id.value(), addr.value().to_string());
                    }
                }
                Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(error) => return Err(Failure::Store(error.into())),
            }
            Ok(Some(ReplicaGroup {
                epoch: u32::try_from(epoch).unwrap_or(u32::MAX),
                members,
                addresses,
            }))
        };
        read().map_err(ManagerError::from)
    }

    /// Records where replica `id` listens ([`crate::command::Command::AddReplica`]), before the
    /// group change that adds it.
    pub(crate) fn record_replica_addr(&mut self, id: u16, addr: &str) -> Result<(), Failure> {
        self.write(|change| {
            change.txn.open_table(REPLICAS)?.insert(id, addr)?;
            Ok(())
        })
    }

    /// Records `group` (members, epoch and every address) in the store, synced (or at the
    /// end of the batch).
    pub fn record_replica_group(&mut self, group: &ReplicaGroup) -> Result<(), ManagerError> {
        self.write(|change| {
            let meta = &mut change.tables.meta;
            meta.insert(KEY_GROUP_EPOCH, u64::from(group.epoch))?;
            meta.insert(KEY_GROUP_MEMBERS, group.members)?;
            let mut table = change.txn.open_table(REPLICAS)?;
            for (&id, addr) in &group.addresses {
                table.insert(id, addr.as_str())?;
            }
            Ok(())
        })
        .map_err(ManagerError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_order::{NodeId, Role};

    fn change(epoch: u32, id: u16, member: bool) -> GroupChange {
        GroupChange {
            epoch,
            node: NodeId(id - 1),
            role: Role {
                sender: member,
                receiver: member,
            },
        }
    }

    /// Changes apply by the order's rule: the next epoch only, never leaving no member.
    #[test]
    fn a_group_changes_one_epoch_at_a_time() {
        let peers: Vec<SocketAddr> = (1..=3)
            .map(|port| SocketAddr::from(([127, 0, 0, 1], port)))
            .collect();
        let group = ReplicaGroup::initial(&peers);
        assert_eq!(group.member_ids(), vec![1, 2, 3]);
        let added = group.apply(&change(1, 4, true)).expect("epoch 1");
        assert_eq!(added.member_ids(), vec![1, 2, 3, 4]);
        assert_eq!(group.apply(&change(2, 4, true)), None, "skips epoch 1");
        let removed = added.apply(&change(2, 2, false)).expect("epoch 2");
        assert_eq!(removed.member_ids(), vec![1, 3, 4]);
        assert_eq!(removed.order_group().receivers().len(), 3);
        assert_eq!(removed.apply(&change(2, 1, false)), None, "a taken epoch");
        let one = ReplicaGroup::initial(&peers[..1]);
        assert_eq!(one.apply(&change(1, 1, false)), None, "no member left");
    }

    /// A store records the group and every address, and a store copy carries them.
    #[test]
    fn the_store_keeps_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let mut manager = Manager::open(dir.path(), crate::ManagerConfig::default()).unwrap();
        assert_eq!(manager.replica_group().unwrap(), None);
        let peers = [SocketAddr::from(([127, 0, 0, 1], 1))];
        let mut group = ReplicaGroup::initial(&peers);
        manager.record_replica_addr(2, "127.0.0.1:2").unwrap();
        group.addresses.insert(2, "127.0.0.1:2".into());
        let group = group.apply(&change(1, 2, true)).unwrap();
        manager.record_replica_group(&group).unwrap();
        assert_eq!(manager.replica_group().unwrap(), Some(group.clone()));
        let copy = dir.path().join("copy");
        std::fs::create_dir(&copy).unwrap();
        crate::replica_core::copy_store(&manager, &copy.join("manager.redb")).unwrap();
        let copied = Manager::open_existing(&copy, crate::ManagerConfig::default()).unwrap();
        assert_eq!(copied.replica_group().unwrap(), Some(group));
    }
}
