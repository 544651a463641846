//! A receiver's pause after a loss: it stops appending at the point where it notices that
//! its log may differ from the others' (a gap in a sender's numbering, or the leader's ACK
//! conflicting with its log), holds what arrives, and resumes once the gap fills or the
//! leader's order for the disputed positions arrives. The repair then replaces only the
//! positions appended between the lost message's place and the pause, a bounded number,
//! instead of everything appended until the repair arrives.

use super::{Node, Pause};
use crate::log::chain;
use crate::{Micros, MsgId, NodeId, SenderId, Status};

impl Node {
    /// Pauses our log at its end; `conflict`: the leader's ACK of that length conflicts
    /// with our log.
    pub(super) fn pause(&mut self, conflict: Option<u64>, now: Micros) {
        if !self.role.receiver || self.status != Status::Normal {
            return;
        }
        match &mut self.receive.pause {
            Some(pause) => {
                pause.conflict = match (pause.conflict, conflict) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            }
            None => {
                self.stats.pauses += 1;
                self.receive.pause = Some(Pause {
                    since: now,
                    conflict,
                });
            }
        }
    }

    /// When a pause ends if nothing ends it sooner: four round trips after it began, time
    /// for a NACK and its answer, or for the leader's repair, twice.
    pub(super) fn pause_due(&self) -> Option<Micros> {
        let pause = self
            .receive
            .pause
            .filter(|_| self.status == Status::Normal)?;
        Some(pause.since + 4 * self.round_trip_us())
    }

    /// Ends the pause: what is held and can be appended is, in the order of
    /// [`Node::replay_order`].
    pub(super) fn resume(&mut self, now: Micros) {
        self.receive.pause = None;
        let log = &self.receive.log;
        self.receive
            .lost_before
            .retain(|&sender, &mut (before, _)| log.count(sender) < before);
        for id in self.replay_order() {
            let (arrival, message) = self.take_held(id).expect("held");
            self.append(id, message, arrival, now);
        }
    }

    /// A pause ends once every gap is filled and nothing says our order differs from the
    /// leader's: at once at the leader (its order is the reference); at a member, unless
    /// the leader's ACKs say that its order past our log is another (then its repair is on
    /// its way, and ends the pause).
    /// A member paused by a conflict resumes once an ACK of the leader as long as the
    /// conflicting one agrees with our log and what we would append.
    pub(super) fn resume_if_settled(&mut self, now: Micros) {
        let Some(pause) = self.receive.pause else {
            return;
        };
        // A leader's ACK past our log contradicted what we would append: no ACK of the
        // leader (whose log is fixed in a view) can agree now; its order or the timeout
        // ends the pause.
        if pause.conflict == Some(u64::MAX) || !self.gaps_filled() {
            return;
        }
        if self.leader() == self.id {
            self.resume(now);
            return;
        }
        let leader = self.leader();
        self.stats.pause_checks += 1;
        match self.agreement(leader, &self.replay_order(), pause.conflict.unwrap_or(0)) {
            Some(false) => self.pause(Some(u64::MAX), now),
            Some(true) => self.resume(now),
            None if pause.conflict.is_none() => self.resume(now),
            None => {}
        }
    }

    /// Every message held is its sender's next or follows one held without a hole.
    fn gaps_filled(&self) -> bool {
        self.receive.pending.iter().all(|(&sender, held)| {
            let next = self.receive.log.count(sender);
            let first = held.keys().next().copied();
            let last = held.keys().next_back().copied();
            first == Some(next) && last.map(|last| last - next + 1) == Some(held.len() as u64)
        })
    }

    /// Each held sender's run from its next message without a hole, each message with the
    /// earliest place in arrival order of itself and its later messages.
    fn held_runs(&self) -> Vec<(u64, SenderId, u64)> {
        let mut keyed = Vec::new();
        for (&sender, held) in &self.receive.pending {
            let next = self.receive.log.count(sender);
            let run_start = keyed.len();
            let lost = self.receive.lost_before.get(&sender).copied();
            let run = (next..).zip(held.range(next..));
            for (_, (&seq, &(arrival, _))) in run.take_while(|(want, (&seq, _))| seq == *want) {
                // A message we knew lost when `noticed` messages had arrived goes there.
                let place = match lost {
                    Some((before, noticed)) if seq < before => arrival.min(noticed),
                    _ => arrival,
                };
                keyed.push((place, sender, seq));
            }
            let mut earliest = u64::MAX;
            for key in keyed[run_start..].iter_mut().rev() {
                earliest = earliest.min(key.0);
                key.0 = earliest;
            }
        }
        keyed
    }

    /// What is held, in the order it is appended: each sender's messages from its next on
    /// without a hole, by place in arrival order, except that a message that filled a gap
    /// goes just before the first of its sender's later messages that arrived before it
    /// (where the others, who did not lose it, appended it at the latest: the place we
    /// paused at, for a loss noticed by the gap). A receiver that lost nothing appends in
    /// arrival order, so this is the order every receiver's log takes past a loss that
    /// only one of them, or all of them, suffered.
    pub(super) fn replay_order(&self) -> Vec<MsgId> {
        let mut keyed = self.held_runs();
        keyed.sort_unstable();
        keyed
            .into_iter()
            .map(|(_, sender, seq)| MsgId { sender, seq })
            .collect()
    }

    /// Whether `node`'s ACKs at least `at_least` long agree with our log followed by
    /// `order`: `Some(false)` if one contradicts it, `Some(true)` if one agrees and none
    /// contradicts, `None` if none can be compared.
    fn agreement(&self, node: NodeId, order: &[MsgId], at_least: u64) -> Option<bool> {
        let peer = self.receive.peers.get(&node)?;
        let log = &self.receive.log;
        let end = log.end();
        let hashes = chain_of(log.hash_at(end).expect("end is known"), order);
        let mut agrees = None;
        for &(len, hash) in peer.history.iter().chain(peer.latest.iter()) {
            let ours = if len <= end {
                log.hash_at(len)
            } else {
                hashes.get((len - end - 1) as usize).copied()
            };
            match ours {
                Some(ours) if len >= at_least => {
                    if ours != hash {
                        return Some(false);
                    }
                    agrees = Some(true);
                }
                _ => {}
            }
        }
        agrees
    }
}

/// The hash chain from `hash` over `order`: the hash after each message.
fn chain_of(mut hash: u64, order: &[MsgId]) -> Vec<u64> {
    order
        .iter()
        .map(|&id| {
            hash = chain(hash, id);
            hash
        })
        .collect()
}
