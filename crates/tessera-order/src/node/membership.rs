//! Group changes: which group a view runs, learning of newer groups, and what a delivered
//! change does (the view that delivered it delivers nothing past it; the next view runs
//! the new group).

use super::{bit, Node};
use crate::packet::{Body, Header};
use crate::{
    Destination, Event, GroupChange, GroupRecord, Micros, MsgId, NodeId, Role, Status,
    MESSAGE_APPLICATION,
};
use bytes::Bytes;

/// Receivers that make a majority of `receivers` (a bit set).
pub(super) fn majority(receivers: u64) -> usize {
    receivers.count_ones() as usize / 2 + 1
}

impl Node {
    /// The role of a peer in the group of our view or the newest we know (a receiver of
    /// the previous group still votes in the view change that installs ours); `None`: not
    /// in the group, its packets are stale.
    pub(super) fn peer_role(&self, node: NodeId) -> Option<Role> {
        if usize::from(node.0) >= crate::GROUP_NODES_MAX {
            return None;
        }
        let bit = bit(node);
        let mut role = Role {
            sender: false,
            receiver: false,
        };
        for record in [&self.membership.record, &self.membership.known] {
            role.sender |= record.senders & bit != 0;
            role.receiver |= (record.receivers | record.previous_receivers) & bit != 0;
        }
        (role.sender || role.receiver).then_some(role)
    }

    /// Receivers whose DO-VIEW-CHANGE counts: those of our view's group and of the one
    /// before it.
    pub(super) fn voters(&self) -> u64 {
        self.membership.record.receivers | self.membership.record.previous_receivers
    }

    /// Whether the votes of receivers holding state make a majority of our view's group.
    /// (Groups change by one receiver at a time, so a majority of this group meets every
    /// majority of the one before: see the crate docs.)
    pub(super) fn quorum(&self, holding: u64) -> bool {
        let receivers = self.membership.record.receivers;
        (holding & receivers).count_ones() as usize >= majority(receivers)
    }

    /// A peer's header named an older group epoch than the newest we know: tell it, at
    /// most every two round trips.
    pub(super) fn tell_group(&mut self, header: &Header, now: Micros) {
        let ours = self.membership.known.epoch as u8;
        let behind = ours.wrapping_sub(header.epoch) as i8 > 0;
        let pause = 2 * self.round_trip_us();
        let told = self.membership.told_at.get(&header.from).copied();
        if !behind || told.is_some_and(|at| now < at + pause) {
            return;
        }
        self.membership.told_at.insert(header.from, now);
        let record = self.membership.known;
        self.queue(Destination::Node(header.from), Body::Group(record));
    }

    /// A group newer than any we knew: a member's view runs an older group, so it changes
    /// view (the new view runs this one); a node changing view starts again with it.
    pub(super) fn learn_group(&mut self, record: GroupRecord, now: Micros) {
        if !self.know_group(record) {
            return;
        }
        match self.status {
            Status::Normal | Status::ViewChange => self.start_view_change(self.view + 1, now),
            Status::Joining | Status::Sender => self.set_record(record),
        }
    }

    /// Remembers `record` if it is newer than the newest known; whether it was.
    pub(super) fn know_group(&mut self, record: GroupRecord) -> bool {
        if record.epoch <= self.membership.known.epoch {
            return false;
        }
        self.membership.known = record;
        self.events.push_back(Event::Group(record));
        true
    }

    /// Runs `record` from now on (the view we change to or adopt), with our role in it.
    pub(super) fn set_record(&mut self, record: GroupRecord) {
        self.know_group(record);
        self.membership.record = record;
        self.group = record.group();
        let bit = bit(self.id);
        self.role = Role {
            sender: record.senders & bit != 0,
            // A receiver of the previous group votes in the view change that removes it;
            // a node that holds nothing waits to be added.
            receiver: (record.receivers | record.previous_receivers) & bit != 0
                || self.last_normal.is_none(),
        };
    }

    /// A START-VIEW (of a view we are not a member of) runs a group without us, after we
    /// had been a member: the application is told (it should stop this node). The node
    /// goes on asking to join, unheard by the group, so that if a later group adds it back
    /// the members that know it tell it so.
    pub(super) fn check_removed(&mut self, record: &GroupRecord) {
        let gone = record.receivers & bit(self.id) == 0 && record.senders & bit(self.id) == 0;
        if gone && self.last_normal.is_some() && !self.membership.removed {
            self.membership.removed = true;
            self.events.push_back(Event::Removed);
        }
        if !gone {
            self.membership.removed = false;
        }
    }

    /// A member whose view runs an older group than one it knows changes view.
    pub(super) fn reconfigure_due(&self) -> bool {
        self.role.receiver
            && self.status == Status::Normal
            && self.membership.known.epoch > self.membership.record.epoch
    }

    /// Whether this view may deliver more: not past a change to the next epoch.
    pub(super) fn epoch_open(&self) -> bool {
        self.membership.delivered_epoch <= self.membership.record.epoch
    }

    /// The event for the message delivered at `position`; a group change that makes the
    /// epoch after our view's closes the view to further deliveries (the next one runs it).
    pub(super) fn delivery(&mut self, position: u64, id: MsgId, message: &Bytes) -> Event {
        if message.first() == Some(&MESSAGE_APPLICATION) {
            return Event::Deliver {
                position,
                id,
                message: message.slice(1..),
            };
        }
        let Some(change) = GroupChange::decode(message) else {
            // Not a message this code makes: its place is taken, its bytes delivered.
            return Event::Deliver {
                position,
                id,
                message: message.clone(),
            };
        };
        let membership = &mut self.membership;
        if change.epoch == membership.delivered_epoch + 1 {
            if membership.delivered_epoch < membership.record.epoch {
                // A change whose group our view already runs (we deliver behind it).
                membership.delivered_epoch += 1;
            } else if let Some(next) = membership.record.apply(&change) {
                membership.delivered_epoch += 1;
                self.stats.group_changes += 1;
                self.know_group(next);
            }
        }
        Event::GroupChange {
            position,
            id,
            change,
            message: message.clone(),
        }
    }
}

/// The application's bytes of a log message (as PO delivery reports them).
pub(super) fn application_bytes(message: &Bytes) -> Bytes {
    if message.first() == Some(&MESSAGE_APPLICATION) {
        message.slice(1..)
    } else {
        message.clone()
    }
}
