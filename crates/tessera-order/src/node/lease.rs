//! Read leases ([`Config::read_leases`](crate::Config::read_leases)): when a member may answer
//! a read from its own state without ordering it, and the rule of view changes that makes
//! that safe. The argument is in the crate documentation ("Read leases").

use super::{bit, Node};
use crate::{Micros, NodeId, SenderId, Status};
use std::collections::BTreeMap;

/// Own messages' first sends remembered at most (past that the oldest are forgotten: a
/// lease then leans on a later message, never on an earlier time than it may).
const SENT_REMEMBERED_MAX: usize = 1 << 14;

/// What a node keeps for read leases.
#[derive(Debug, Default)]
pub(super) struct LeaseState {
    /// When each own message not yet known held by every member was first sent, by number.
    sent: BTreeMap<u64, Micros>,
    /// Our lease's start in the current view: when the latest own message every other
    /// member ACKed was proposed.
    from: Option<Micros>,
    /// Per sender, the most of its messages an ACK of ours counted in a view it was a
    /// member of.
    acked: BTreeMap<SenderId, u64>,
    /// Per node, when such an ACK of ours last counted more of its messages than before.
    fresh: BTreeMap<NodeId, Micros>,
    /// The members of the last view we were normal in.
    last_members: u64,
    /// When this node started (a restarted one enters no view before `+ suspect_after_us`).
    started: Micros,
}

impl LeaseState {
    /// For a node that starts at `now`.
    pub(super) fn new(now: Micros) -> LeaseState {
        LeaseState {
            started: now,
            ..LeaseState::default()
        }
    }
}

impl Node {
    fn lease_on(&self) -> bool {
        self.config.read_leases
    }

    /// Until when (exclusive) this member may answer reads from its own state: `None` if it
    /// holds no lease now (not normal, no own message every other member ACKed in this view
    /// yet, or leases off). See the module doc of `node/lease.rs` (the crate's "Read
    /// leases").
    pub fn read_lease_ends(&self) -> Option<Micros> {
        if !self.lease_on() || self.status != Status::Normal {
            return None;
        }
        if self.members & !bit(self.id) == 0 {
            // Alone in the view: no view can leave us out without our vote.
            return Some(Micros::MAX);
        }
        let lease_us = self.config.suspect_after_us / 4 * 3;
        self.lease.from.map(|from| from + lease_us)
    }

    /// We sent our message number `seq` for the first time at `now`.
    pub(super) fn lease_sent(&mut self, seq: u64, now: Micros) {
        if self.lease_on() {
            self.lease.sent.insert(seq, now);
            if self.lease.sent.len() > SENT_REMEMBERED_MAX {
                self.lease.sent.pop_first();
            }
        }
    }

    /// Another member's ACK in our view came: our lease starts where the least of the
    /// members' counts of our messages stands.
    pub(super) fn lease_acked_by_member(&mut self) {
        if !self.lease_on() {
            return;
        }
        let own = SenderId {
            node: self.id,
            incarnation: self.incarnation,
        };
        let others = super::members_of(self.members)
            .into_iter()
            .filter(|&node| node != self.id);
        let least = others
            .map(|node| {
                let peer = self.receive.peers.get(&node);
                peer.and_then(|peer| peer.held.get(&own))
                    .copied()
                    .unwrap_or(0)
            })
            .min()
            .unwrap_or(0);
        // Every member holds our messages `0..least` (the counts are FIFO prefixes): the
        // latest of them we remember gives the lease's start.
        let lease = &mut self.lease;
        let Some((&seq, &sent)) = lease.sent.range(..least).next_back() else {
            return;
        };
        lease.from = lease.from.max(Some(sent));
        lease.sent = lease.sent.split_off(&seq);
    }

    /// An ACK of ours with these per-sender counts leaves at `now`. Only members of our
    /// view count: a lease leans on ACKs in the view it holds in, and a node out of the view
    /// (removed, or left out) may go on sending, which must not keep every later view
    /// waiting for it. (A count first reached while its sender was out of our view is
    /// counted, with the time, once it is a member again.)
    pub(super) fn lease_acking(&mut self, counts: &[crate::packet::SenderCounts], now: Micros) {
        if !self.lease_on() {
            return;
        }
        let members = self.members;
        let counted = counts.iter().filter(|c| members & bit(c.sender.node) != 0);
        for counts in counted {
            let count = counts.held.max(counts.delivered);
            let before = self.lease.acked.entry(counts.sender).or_insert(0);
            if count > *before {
                *before = count;
                self.lease.fresh.insert(counts.sender.node, now);
            }
        }
    }

    /// We became normal in a view: no lease until the members ACK our messages in it.
    pub(super) fn lease_entered_view(&mut self) {
        self.lease.from = None;
        self.lease.last_members = self.members;
    }

    /// When we may enter a view with `members` (a START-VIEW's, or ours as its leader):
    /// `None` at once, else not before the time returned.
    pub(super) fn lease_entry_wait(&self, members: u64, now: Micros) -> Option<Micros> {
        if !self.lease_on() {
            return None;
        }
        let wait = self.config.suspect_after_us;
        let not_before = if self.last_normal.is_none() {
            self.lease.started + wait
        } else {
            let left_out = self.lease.last_members & !members & !bit(self.id);
            super::members_of(left_out)
                .into_iter()
                .filter_map(|node| self.lease.fresh.get(&node))
                .map(|&fresh| fresh + wait)
                .max()
                .unwrap_or(0)
        };
        (now < not_before).then_some(not_before)
    }
}
