//! The receiver's side of the fast path: appending in arrival order (PO), ACKs, UTO delivery
//! once every member's ACK matches, NACKs of gaps, and the leader's order where logs differ.

use super::{Node, Peer};
use crate::packet::{Ack, Body, Header, RepairEntry, SenderCounts};
use crate::{Destination, Event, Micros, MsgId, NodeId, SenderId, Status, Transmit};
use crate::{ACK_HISTORY_MAX, REPAIR_PACKETS_MAX};
use bytes::Bytes;
use std::collections::BTreeMap;

impl Node {
    pub(super) fn on_data(&mut self, sender: SenderId, messages: Vec<(u64, Bytes)>, now: Micros) {
        if !self.role.receiver
            || self.latest_incarnation.get(&sender.node) != Some(&sender.incarnation)
        {
            return;
        }
        match self.status {
            Status::Normal => {
                for (seq, message) in messages {
                    self.offer(MsgId { sender, seq }, message, now);
                }
            }
            // Held until the new view's log is known, then appended after it.
            Status::ViewChange => {
                for (seq, message) in messages {
                    self.hold(MsgId { sender, seq }, message);
                }
            }
            Status::Joining | Status::Sender => {}
        }
    }

    /// Keeps a message past a gap of its sender's numbering, within the window's reach.
    fn hold(&mut self, id: MsgId, message: Bytes) -> bool {
        let next = self.receive.log.count(id.sender);
        let per_packet = (self.config.packet_bytes_max() / crate::packet::MESSAGE_OVERHEAD) as u64;
        let reach = 2 * u64::from(self.config.window_packets) * per_packet;
        if id.seq < next || id.seq - next >= reach {
            return false;
        }
        let arrival = self.next_arrival();
        self.receive
            .pending
            .entry(id.sender)
            .or_default()
            .insert(id.seq, (arrival, message));
        true
    }

    fn next_arrival(&mut self) -> u64 {
        self.receive.arrivals += 1;
        self.receive.arrivals
    }

    fn offer(&mut self, id: MsgId, message: Bytes, now: Micros) {
        let next = self.receive.log.count(id.sender);
        if !self.receive.leader_order.is_empty() {
            if id.seq >= next && self.hold(id, message) {
                self.follow_leader_order(now);
            }
        } else if id.seq < next {
            self.stats.duplicates += 1;
        } else if let Some(pause) = self.receive.pause {
            if self.hold(id, message) {
                if id.seq > next {
                    self.nack_gap(id.sender, now);
                }
                // A pause for the leader's conflicting ACK (within our log, which the
                // leader's fixed log then contradicts at every longer ACK) ends by its
                // order, a leader ACK (checked as it arrives) or the timeout, not by an
                // arrival: checking it here cost a sort and a hash chain over everything
                // held at every arrival, quadratic in a pause.
                if pause.conflict.is_none() {
                    self.resume_if_settled(now);
                }
            }
        } else if id.seq == next {
            let arrival = self.next_arrival();
            self.append(id, message, arrival, now);
            self.drain_pending(id.sender, now);
        } else {
            // A new gap (not one we already hold messages past): the lost messages have a
            // place in the others' logs that we may have appended other messages at;
            // pause here, so that the repair is of those positions only.
            let new_gap = !self.receive.pending.contains_key(&id.sender);
            if self.hold(id, message) {
                if new_gap {
                    self.pause(None, now);
                }
                self.nack_gap(id.sender, now);
            }
        }
    }

    pub(super) fn append(&mut self, id: MsgId, message: Bytes, arrival: u64, now: Micros) {
        let optimistic = super::membership::application_bytes(&message);
        let position = self.receive.log.append_arrived(id, message, arrival);
        assert_eq!(
            position, self.receive.optimistic_end,
            "PO positions are reported in order"
        );
        self.receive.optimistic_end = position + 1;
        self.events.push_back(Event::Optimistic {
            position,
            id,
            message: optimistic,
        });
        self.receive.ack_owed += 1;
        if self.receive.ack_owed >= self.config.ack_every_messages {
            self.receive.ack_now = true;
        } else if self.receive.ack_due.is_none() {
            self.receive.ack_due = Some(self.ack_due_after(now));
        }
    }

    /// When an ACK owed since `now` goes: at once if the node is idle, i.e. our last fresh
    /// ACK packet went at least [`Node::ack_delay_now`] ago and the sequencer link's queue adds
    /// less than `ack_delay_us` to that delay (the ACK answers a lone packet, or the first
    /// of a burst, and nothing is gained by waiting); else, as always, the delay after
    /// `now`, so that under load one ACK covers several packets. The driver polls its node
    /// after a whole batch of datagrams, so an ACK "at once" still covers every packet
    /// that arrived with the first. In the lab at 10% load every DATA packet's ACK waited
    /// its 20 us, each a sleep and a wake-up of every receiver's thread on shared CPUs.
    /// (Sending at once whenever the last ACK was a delay ago, queue or not, cost the
    /// simulator's 5-node run of 1 KiB messages with the lab's trunk queue 0.880 of the
    /// link against 0.903: the first packet of every burst got an ACK of its own.)
    ///
    /// Idle but not quiet (an ACK packet went less than the delay ago), the ACK goes as
    /// soon as the delay since that one has passed, not the delay after this append: at
    /// most one ACK packet per delay either way, but the second packet of a burst (in the
    /// lab every node proposes on the same millisecond, and the five DATA packets reach a
    /// receiver spread over tens of microseconds as its CPUs let their senders run)
    /// waited a whole delay and a timer wake-up after it arrived. Under load nothing
    /// changes: the queue's share applies as before, and the first append after an ACK
    /// comes right after it.
    fn ack_due_after(&self, now: Micros) -> Micros {
        let delay = self.ack_delay_now();
        let queued = delay - self.config.ack_delay_us >= self.config.ack_delay_us;
        if queued || !self.config.ack_at_once_when_idle {
            return now + delay;
        }
        match self.receive.ack_fresh_at {
            Some(last) if now < last + delay => last + delay,
            _ => now,
        }
    }

    /// How long an ACK waits for more appends: `ack_delay_us`, and under load a share of
    /// the sequencer link's queue. Every ACK crosses the link and wakes every node; with
    /// packets of 1 KiB messages arriving a jumbo frame's 70 us apart, a delay of 20 us
    /// sent one per packet from every receiver (5.4 ACK packets per DATA packet at 5
    /// nodes, 12% of the link). A queue of milliseconds is already in every UTO latency
    /// and the senders' windows cover it, so waiting a share of it costs little and lets
    /// one ACK cover several packets; with the queue empty (low load) the delay is
    /// `ack_delay_us` as before.
    /// In the simulator's lab-like 5-node run of 1 KiB messages the payload UTO-delivered
    /// was 0.861 of the link with no such wait, 0.939 with an eighth of the queue (the
    /// default `ack_queue_divisor`), 0.946 with a quarter (ACK packets per DATA packet
    /// 5.44, 1.72, 1.36).
    pub(super) fn ack_delay_now(&self) -> Micros {
        let queue = match self.config.ack_queue_divisor {
            0 => 0,
            divisor => self.rtt.queue_us() / divisor,
        };
        self.config.ack_delay_us + queue.min(self.config.retransmit_after_us / 8)
    }

    fn drain_pending(&mut self, sender: SenderId, now: Micros) {
        loop {
            let next = self.receive.log.count(sender);
            let Some(held) = self.receive.pending.get_mut(&sender) else {
                return;
            };
            held.retain(|&seq, _| seq >= next);
            let Some((arrival, message)) = held.remove(&next) else {
                if held.is_empty() {
                    self.receive.pending.remove(&sender);
                }
                return;
            };
            self.append(MsgId { sender, seq: next }, message, arrival, now);
        }
    }

    pub(super) fn drain_all_pending(&mut self, now: Micros) {
        let senders: Vec<SenderId> = self.receive.pending.keys().copied().collect();
        for sender in senders {
            self.drain_pending(sender, now);
        }
    }

    /// Asks `sender` for its messages from the first we lack up to the first we hold (or
    /// `to`), at most once per two round trips (its answer needs one).
    fn nack_range(&mut self, sender: SenderId, to: Option<u64>, now: Micros) {
        let from = self.receive.log.count(sender);
        let held = self.first_held(sender, from);
        let to = match (held, to) {
            (Some(held), _) if held == from => return,
            (Some(held), _) => held,
            (None, Some(to)) => to,
            (None, None) => return,
        };
        if to <= from {
            return;
        }
        let last = self.receive.nacked_at.get(&sender).copied();
        if last.is_some_and(|at| now < at + 2 * self.round_trip_us()) {
            return;
        }
        self.receive.nacked_at.insert(sender, now);
        if sender == self.sender_id() {
            // We lost our own broadcast on its way back: send it again, as for a NACK (it
            // is in flight: nobody delivered a message that we, a member, do not hold).
            self.on_nack(sender, from, to, now);
            return;
        }
        self.stats.nacks_sent += 1;
        self.queue(
            Destination::Node(sender.node),
            Body::Nack { sender, from, to },
        );
    }

    fn nack_gap(&mut self, sender: SenderId, now: Micros) {
        self.nack_range(sender, None, now);
    }

    /// When a gap we NACKed is still open two round trips later: the NACK or its answer may
    /// be lost, and a sender whose window the gap holds full sends nothing that would make
    /// us NACK again.
    pub(super) fn nack_due(&self) -> Option<Micros> {
        if !self.role.receiver || self.status != Status::Normal {
            return None;
        }
        let again = 2 * self.round_trip_us();
        let following = self
            .receive
            .leader_order
            .front()
            .map(|entry| entry.id.sender);
        self.receive
            .pending
            .keys()
            .chain(following.as_ref())
            .map(|sender| {
                let at = self.receive.nacked_at.get(sender).copied().unwrap_or(0);
                at + again
            })
            .min()
    }

    /// NACKs every gap not NACKed for two round trips.
    pub(super) fn nack_gaps(&mut self, now: Micros) {
        self.nack_leader_order(now);
        let following = self
            .receive
            .leader_order
            .front()
            .map(|entry| entry.id.sender);
        let again = 2 * self.round_trip_us();
        let mut senders: Vec<SenderId> = self.receive.pending.keys().copied().collect();
        senders.extend(following);
        for sender in senders {
            // Only the senders whose check is due: stamping the others would put off, for
            // as long as some other sender's check keeps coming due first, the NACK again
            // of a gap whose NACK or answer was lost (a window held full for milliseconds).
            let at = self.receive.nacked_at.get(&sender).copied().unwrap_or(0);
            if now < at + again {
                continue;
            }
            self.nack_gap(sender, now);
            // Checked even when nothing was missing (a message held only to follow the
            // leader's order), so that the check is not due again at once.
            self.receive.nacked_at.insert(sender, now);
        }
    }

    /// Another member holds or delivered messages of a sender that we hold nowhere: NACK
    /// them. Its ACK crossed the sequencer link after the DATA that carried them, so in a
    /// FIFO network they were lost on our way (a sender's lost last packet shows us no gap).
    fn nack_counted(&mut self, counts: &[SenderCounts], now: Micros) {
        for &SenderCounts {
            sender,
            delivered,
            held,
        } in counts
        {
            let count = delivered.max(held);
            let latest = self.latest_incarnation.get(&sender.node) == Some(&sender.incarnation);
            let ours = self.receive.log.count(sender);
            if latest && count > ours && self.held_through(sender, ours) < count {
                self.nack_range(sender, Some(count), now);
            }
        }
    }

    /// The ACK's node sent `sent` messages before it, some of which we hold nowhere: they
    /// were lost on our way (in a FIFO network); a new gap pauses our log, as one that a
    /// later message shows (`offer`), without waiting for that message.
    fn nack_sent(&mut self, header: &Header, sent: u64, now: Micros) {
        let sender = SenderId {
            node: header.from,
            incarnation: header.incarnation,
        };
        let ours = self.receive.log.count(sender);
        if self.latest_incarnation.get(&sender.node) != Some(&sender.incarnation)
            || sent <= ours
            || self.held_through(sender, ours) >= sent
        {
            return;
        }
        if !self.receive.pending.contains_key(&sender) && self.receive.leader_order.is_empty() {
            self.pause(None, now);
            let arrivals = self.receive.arrivals;
            self.receive.lost_before.insert(sender, (sent, arrivals));
        }
        self.nack_range(sender, Some(sent), now);
    }

    pub(super) fn on_ack(&mut self, header: &Header, ack: &Ack, own: bool, now: Micros) {
        if self
            .peer_role(header.from)
            .is_some_and(|role| role.receiver)
        {
            self.on_sender_ack(header, ack, now);
        }
        let current = self.role.receiver
            && self.status == Status::Normal
            && header.status == Status::Normal
            && header.view == self.view;
        if own || !current || !self.is_member(header.from) {
            return;
        }
        let peer = self.receive.peers.entry(header.from).or_default();
        peer.delivered = ack.commit;
        peer.held.clear();
        peer.held
            .extend(ack.counts.iter().map(|counts| (counts.sender, counts.held)));
        if peer.history.len() == ACK_HISTORY_MAX {
            peer.history.pop_front();
        }
        peer.history.push_back((ack.len, ack.hash));
        peer.latest = Some((ack.len, ack.hash));
        self.lease_acked_by_member();
        self.verify(header.from, now);
        self.nack_counted(&ack.counts, now);
        self.nack_sent(header, ack.sent, now);
        if header.from == self.leader() {
            self.drop_orphans(ack.len, ack.hash);
            self.resume_if_settled(now);
        }
    }

    /// Our log goes on past the leader's, which matches ours up to there, with messages only
    /// of crashed senders (earlier incarnations): nobody can retransmit them to the leader,
    /// so they would wait there for ever. Past our commit point they are past every delivered
    /// position (the delivered prefix is the leader's), so dropping them is safe.
    fn drop_orphans(&mut self, leader_len: u64, leader_hash: u64) {
        let log = &self.receive.log;
        let stale = leader_len < self.receive.commit;
        if stale || leader_len >= log.end() || log.hash_at(leader_len) != Some(leader_hash) {
            return;
        }
        let orphans = (leader_len..log.end()).all(|position| {
            let sender = log.get(position).expect("within the log").id.sender;
            self.latest_incarnation
                .get(&sender.node)
                .is_some_and(|&latest| latest > sender.incarnation)
        });
        if orphans {
            self.truncate(leader_len);
        }
    }

    /// Compares a member's remembered ACKs with our log where it is long enough.
    fn verify(&mut self, node: NodeId, now: Micros) {
        let log = &self.receive.log;
        let Some(peer) = self.receive.peers.get_mut(&node) else {
            return;
        };
        let end = log.end();
        let mut conflict = None;
        peer.history.retain(|&(len, hash)| {
            if len > end {
                return true;
            }
            match log.hash_at(len) {
                Some(ours) if ours == hash => peer.matched = peer.matched.max(len),
                Some(_) => conflict = Some(conflict.map_or(len, |at: u64| at.min(len))),
                None => {}
            }
            false
        });
        let Some(conflict) = conflict else {
            return;
        };
        if self.leader() == self.id {
            self.repair(node, now);
        } else if node == self.leader() {
            // Our log differs from the leader's: what we append now would be replaced too.
            self.pause(Some(conflict), now);
        }
    }

    /// After any input: compare ACKs, advance the commit point, deliver, forget.
    pub(super) fn progress(&mut self, now: Micros) {
        if self.reconfigure_due() {
            self.start_view_change(self.view + 1, now);
        }
        if !self.role.receiver || self.status != Status::Normal {
            return;
        }
        let peers: Vec<NodeId> = self.receive.peers.keys().copied().collect();
        for node in peers {
            self.verify(node, now);
        }
        let mut commit = self.receive.log.end();
        for node in super::members_of(self.members) {
            if node != self.id {
                commit = commit.min(self.receive.peers.get(&node).map_or(0, |peer| peer.matched));
            }
        }
        if commit > self.receive.commit {
            self.receive.commit = commit;
        }
        self.deliver();
        self.forget();
    }

    pub(super) fn deliver(&mut self) {
        let mut run = crate::log::SenderRun::default();
        // While fetching, the positions up to the view's log come first.
        while self.receive.fetch.is_none()
            && self.receive.delivered < self.receive.commit
            && self.epoch_open()
        {
            let position = self.receive.delivered;
            let entry = self
                .receive
                .log
                .get(position)
                .expect("committed positions are retained");
            let id = entry.id;
            // An application message (the common case) is a slice of the log's bytes.
            let event = if entry.message.first() == Some(&crate::MESSAGE_APPLICATION) {
                Event::Deliver {
                    position,
                    id,
                    message: entry.message.slice(1..),
                }
            } else {
                let message = entry.message.clone();
                // A group change may start a view change: the counts as they were.
                run.flush(&mut self.receive.delivered_counts);
                self.delivery(position, id, &message)
            };
            self.events.push_back(event);
            run.count(id.sender, &mut self.receive.delivered_counts);
            self.receive.delivered += 1;
            self.stats.delivered += 1;
        }
        run.flush(&mut self.receive.delivered_counts);
        if self.role.sender {
            let mine = self
                .receive
                .delivered_counts
                .get(&self.sender_id())
                .copied();
            self.release(mine.unwrap_or(0));
        }
    }

    /// Drops positions every member delivered, past `log_retain_entries`.
    fn forget(&mut self) {
        let mut floor = self.receive.delivered;
        for node in super::members_of(self.members) {
            if node != self.id {
                floor = floor.min(
                    self.receive
                        .peers
                        .get(&node)
                        .map_or(0, |peer| peer.delivered),
                );
            }
        }
        self.receive.floor = floor;
        let below = floor.saturating_sub(self.config.log_retain_entries);
        if below > self.receive.log.start() {
            self.receive.log.forget_below(below);
        }
    }

    /// The leader's order from `from` on: keep our log up to its first difference from
    /// `entries`, take the leader's from there (I3). Entries without bytes name messages we
    /// hold: in our log past the difference (set aside) or held back past a gap. What we
    /// set aside and do not find in the leader's order is appended again after it, in the
    /// order it arrived (which is the leader's order past its entries, unless we lost more).
    pub(super) fn on_entries(
        &mut self,
        header: &Header,
        from: u64,
        prev_hash: u64,
        entries: Vec<RepairEntry>,
        now: Micros,
    ) {
        let current = self.status == Status::Normal
            && header.view == self.view
            && header.status == Status::Normal
            && header.from == self.leader()
            && self.id != header.from;
        if !current {
            return;
        }
        let order = &self.receive.leader_order;
        if !order.is_empty() && from == self.receive.log.end() + order.len() as u64 {
            // The next packet of the repair we follow.
            self.receive.leader_order.extend(entries);
            self.follow_leader_order(now);
            return;
        }
        if self.receive.log.hash_at(from) != Some(prev_hash) {
            return;
        }
        self.receive.leader_order.clear();
        let mut position = from;
        let mut entries = entries.into_iter();
        while let Some(entry) = entries.next() {
            match self.receive.log.get(position) {
                Some(ours) if ours.id == entry.id => {
                    position += 1;
                    continue;
                }
                Some(_) => self.set_aside(position),
                None => {}
            }
            if self.receive.log.count(entry.id.sender) != entry.id.seq {
                break;
            }
            if entry.message.is_none() && !self.holds(entry.id) {
                // We lack it after all (lost where no gap showed it): ask its sender, who
                // keeps it until delivered, and wait for it before the rest of the order.
                self.stats.repair_bytes_missing += 1;
                self.receive.leader_order = std::iter::once(entry).chain(entries).collect();
                self.nack_leader_order(now);
                break;
            }
            let (arrival, held) = match self.take_held(entry.id) {
                Some((arrival, held)) => (arrival, Some(held)),
                None => (self.next_arrival(), None),
            };
            let message = entry.message.or(held).expect("held");
            self.append(entry.id, message, arrival, now);
            position += 1;
        }
        if self.receive.leader_order.is_empty() {
            self.append_held_in_arrival_order(now);
        }
        // An ACK of exactly the prefix the leader sent, which it can check even when our
        // log goes on past its own (a message of a crashed sender that it never got, or
        // what we appended again past its order, perhaps not quite in its order).
        if position < self.receive.log.end() {
            let mut ack = self.ack();
            ack.len = position;
            ack.hash = self
                .receive
                .log
                .hash_at(position)
                .expect("position within the log");
            self.lease_acking(&ack.counts, now);
            self.queue(Destination::All, Body::Ack(ack));
            self.stats.ack_packets_sent += 1;
        }
        self.receive.ack_now = true;
    }

    /// The first message of `sender` from `count` on that we hold nowhere: those below are
    /// in our log or held back (set aside, or waiting for the leader's order).
    fn held_through(&self, sender: SenderId, count: u64) -> u64 {
        let Some(held) = self.receive.pending.get(&sender) else {
            return count;
        };
        // Most often what is held is one run without a hole from `count` (a pause holds
        // every arrival): known from its ends and length without a walk over it, which
        // every ACK we send or receive would otherwise take.
        if let (Some((&first, _)), Some((&last, _))) =
            (held.first_key_value(), held.last_key_value())
        {
            if first == count && last - first + 1 == held.len() as u64 {
                return last + 1;
            }
        }
        let mut next = count;
        for (&seq, _) in held.range(count..) {
            if seq != next {
                break;
            }
            next += 1;
        }
        next
    }

    /// The first message of `sender` from `from` on that we hold back.
    fn first_held(&self, sender: SenderId, from: u64) -> Option<u64> {
        let held = self.receive.pending.get(&sender)?;
        held.range(from..).next().map(|(&seq, _)| seq)
    }

    /// NACKs the messages of the leader's order we follow that we lack, from its first:
    /// all of that sender's in it (the sender answers only what it still keeps).
    fn nack_leader_order(&mut self, now: Micros) {
        let Some(first) = self.receive.leader_order.front().map(|entry| entry.id) else {
            return;
        };
        if self.holds(first) {
            return;
        }
        // Paced as `nack_range` paces it, checked before the scan of the leader's order
        // (called for every message that arrives while we follow it).
        let again = 2 * self.round_trip_us();
        let nacked_at = self.receive.nacked_at.get(&first.sender).copied();
        if nacked_at.is_some_and(|at| now < at + again) {
            return;
        }
        let last = self
            .receive
            .leader_order
            .iter()
            .filter(|entry| entry.id.sender == first.sender)
            .map(|entry| entry.id.seq)
            .max()
            .unwrap_or(first.seq);
        self.nack_range(first.sender, Some(last + 1), now);
    }

    fn holds(&self, id: MsgId) -> bool {
        self.receive
            .pending
            .get(&id.sender)
            .is_some_and(|held| held.contains_key(&id.seq))
    }

    /// Appends the leader's order we follow as far as we hold its messages; once done,
    /// what else we hold, in arrival order.
    fn follow_leader_order(&mut self, now: Micros) {
        while let Some(entry) = self.receive.leader_order.front_mut() {
            let id = entry.id;
            if self.receive.log.count(id.sender) != id.seq {
                // Not the leader's order from our end after all: drop it.
                self.receive.leader_order.clear();
                break;
            }
            let message = entry.message.take();
            let held = self.take_held(id);
            let arrival = held.as_ref().map(|held| held.0);
            let Some(message) = held.map(|held| held.1).or(message) else {
                self.nack_leader_order(now);
                return;
            };
            let arrival = arrival.unwrap_or_else(|| self.next_arrival());
            self.receive.leader_order.pop_front();
            self.append(id, message, arrival, now);
        }
        self.append_held_in_arrival_order(now);
    }

    /// Takes `id`'s place in arrival order and bytes out of the messages held back, if
    /// there.
    pub(super) fn take_held(&mut self, id: MsgId) -> Option<(u64, Bytes)> {
        let held = self.receive.pending.get_mut(&id.sender)?;
        let taken = held.remove(&id.seq)?;
        if held.is_empty() {
            self.receive.pending.remove(&id.sender);
        }
        Some(taken)
    }

    /// Moves our positions `at..` out of the log into the messages held back, each with its
    /// position as its place in arrival order.
    fn set_aside(&mut self, at: u64) {
        let end = self.receive.log.end();
        for position in at..end {
            let entry = self.receive.log.get(position).expect("within the log");
            let (id, held) = (entry.id, (entry.arrival, entry.message.clone()));
            self.receive
                .pending
                .entry(id.sender)
                .or_default()
                .insert(id.seq, held);
        }
        self.truncate(at);
    }

    /// The leader's order we followed is done: the pause (if any) ends, and what is held
    /// back and can be appended is, in arrival order ([`Node::replay_order`]); the rest
    /// stays held.
    fn append_held_in_arrival_order(&mut self, now: Micros) {
        self.resume(now);
    }

    /// Drops our positions `at..`; never a delivered one (I3).
    fn truncate(&mut self, at: u64) {
        assert!(
            at >= self.receive.commit,
            "node {:?} would replace position {at} below its commit point {}",
            self.id,
            self.receive.commit
        );
        self.stats.positions_replaced += self.receive.log.end() - at;
        self.receive.log.truncate(at);
        for peer in self.receive.peers.values_mut() {
            peer.matched = peer.matched.min(at);
            // An ACK is evidence of the member's log whenever it is compared (as one that
            // waited in `history` for our log to grow): the delivered prefix never moves.
            if let Some(latest) = peer.latest.filter(|ack| !peer.history.contains(ack)) {
                if peer.history.len() == ACK_HISTORY_MAX {
                    peer.history.pop_front();
                }
                peer.history.push_back(latest);
            }
        }
        if self.receive.optimistic_end > at {
            self.receive.optimistic_end = at;
            self.events.push_back(Event::Revoked { from: at });
        }
    }

    /// Leader: sends `node` our entries from the last position it agreed with us to the end
    /// of our log, in up to [`REPAIR_PACKETS_MAX`] ENTRIES packets. One packet per round
    /// is not enough under load: the member goes on appending in its own order past what
    /// one packet repaired, so it would fall further behind every round.
    fn repair(&mut self, node: NodeId, now: Micros) {
        // The trip as it is now: at the start of a burst the queue fills faster than
        // samples come back, and repairs paced by the trip of the empty queue would be
        // judged unanswered before any answer could return, and resent with every byte.
        let round_trip = self.rtt.round_trip_us_now(
            now,
            self.config.rtt_floor_us,
            self.config.retransmit_after_us / 4,
        );
        let ceiling = self.config.retransmit_after_us;
        let log = &self.receive.log;
        let Some(peer) = self.receive.peers.get_mut(&node) else {
            return;
        };
        // ACKs the member sent before our last repair reached it still conflict: repairs
        // wait two round trips, doubled after every repair it left unanswered (its
        // `matched` did not move) up to the retransmission timeout (a member that crashed
        // and is not yet suspected), against a storm.
        let answered = peer.matched > peer.matched_at_repair;
        if answered {
            peer.repairs_unanswered = 0;
        }
        let pause = (2 * round_trip)
            .saturating_mul(1 << peer.repairs_unanswered.min(16))
            .min(ceiling);
        if peer.repaired_at.is_some_and(|at| now < at + pause) {
            return;
        }
        // The bytes go for crashed senders (only we can give them) and, once two repairs
        // went unanswered, for all the member did not hold. A live sender answers the
        // member's NACK of the rest (its retransmission is on its way when this arrives).
        let unanswered = !answered && peer.repaired_at.is_some();
        let desperate = unanswered && peer.repairs_unanswered >= 1;
        let latest = &self.latest_incarnation;
        let held = &peer.held;
        let lacks = |id: MsgId| {
            if latest.get(&id.sender.node) != Some(&id.sender.incarnation) {
                return true;
            }
            desperate && held.get(&id.sender).is_none_or(|&held| id.seq >= held)
        };
        let mut from = peer.matched.max(log.start()).max(self.receive.view_start);
        let mut packets = Vec::new();
        while packets.len() < REPAIR_PACKETS_MAX {
            let entries = log.repair_entries(from, lacks, self.config.repair_bytes_max);
            if entries.is_empty() {
                break;
            }
            let prev_hash = log.hash_at(from).expect("from is retained");
            self.stats.repair_entries += entries.len() as u64;
            self.stats.repair_payloads += entries
                .iter()
                .filter(|entry| entry.message.is_some())
                .count() as u64;
            let next = from + entries.len() as u64;
            packets.push(Body::Entries {
                from,
                prev_hash,
                entries,
            });
            from = next;
        }
        if packets.is_empty() {
            return;
        }
        if unanswered {
            peer.repairs_unanswered += 1;
        }
        peer.repaired_at = Some(now);
        peer.matched_at_repair = peer.matched;
        for body in packets {
            self.stats.repairs_sent += 1;
            self.queue(Destination::Node(node), body);
        }
    }

    /// Leader: members that have not matched, since the last check, the log we had then
    /// get our entries (they lost a message whose sender is gone or sent nothing after it,
    /// or diverged). A check is due four round trips and a heartbeat interval after the
    /// last: time for any member to have ACKed what we held then.
    pub(super) fn repair_laggards(&mut self, now: Micros) {
        let before = std::mem::replace(&mut self.receive.end_at_check, self.receive.log.end());
        let stuck: Vec<NodeId> = self
            .receive
            .peers
            .iter()
            .filter(|(_, peer)| peer.matched < before)
            .map(|(&node, _)| node)
            .collect();
        for node in stuck {
            self.repair(node, now);
        }
    }

    /// Our log as an ACK.
    pub(super) fn ack(&self) -> Ack {
        let log = &self.receive.log;
        let mut counts: BTreeMap<SenderId, SenderCounts> = BTreeMap::new();
        let held = log
            .counts()
            .iter()
            .map(|(&sender, &count)| (sender, 0, self.held_through(sender, count)));
        let delivered = self.receive.delivered_counts.iter();
        for (sender, delivered, held) in held.chain(delivered.map(|(&s, &d)| (s, d, 0))) {
            let entry = counts.entry(sender).or_insert(SenderCounts {
                sender,
                delivered: 0,
                held: 0,
            });
            entry.delivered = entry.delivered.max(delivered);
            entry.held = entry.held.max(held);
        }
        Ack {
            len: log.end(),
            hash: log.hash_at(log.end()).expect("end is known"),
            commit: self.receive.delivered,
            members: self.members,
            sent: if self.role.sender {
                self.send.next_seq
            } else {
                0
            },
            counts: counts
                .into_values()
                .filter(|counts| {
                    let sender = counts.sender;
                    self.latest_incarnation.get(&sender.node) == Some(&sender.incarnation)
                })
                .collect(),
        }
    }

    /// An ACK went out; `fresh`: it told of appends, and goes again two round trips later
    /// unless another follows first (the last ACK of a burst, lost on its way to one
    /// member, would hold that member's deliveries until our next heartbeat), and again,
    /// each pause twice the last up to a heartbeat interval, while some member reports
    /// having delivered less than our log holds (it may lack our ACK; one that lacks
    /// messages instead costs a small packet per pause).
    pub(super) fn ack_sent(&mut self, fresh: bool, now: Micros) {
        self.receive.ack_owed = 0;
        self.receive.ack_due = None;
        self.receive.ack_now = false;
        let rounds = if fresh {
            0
        } else {
            self.receive.ack_again_rounds.saturating_add(1)
        };
        self.receive.ack_again_rounds = rounds;
        // Paced by the trip through an empty queue: under load fresh ACKs follow each other
        // sooner and this never fires; once the appends stop, the queue drains within a
        // trip, and a pause of the loaded trip would idle the network at the end of every
        // burst whose last ACK one member lost.
        // Under load the next fresh ACK waits `ack_delay_now`: the repeat waits longer.
        let pause = (2 * self.round_trip_us_min() + self.ack_delay_now())
            .saturating_mul(1 << rounds.min(16))
            .min(self.config.heartbeat_interval_us);
        let end = self.receive.log.end();
        let behind = self.receive.peers.values().any(|peer| peer.delivered < end);
        self.receive.ack_again_at = (fresh || behind).then_some(now + pause);
    }

    /// When our last fresh ACK goes again, if it does.
    pub(super) fn ack_again_due(&self) -> Option<Micros> {
        self.receive
            .ack_again_at
            .filter(|_| self.status == Status::Normal)
    }

    pub(super) fn ack_packet(&mut self, now: Micros) -> Option<Transmit> {
        let owed = self.receive.ack_now || self.receive.ack_due.is_some_and(|due| due <= now);
        let again = self.ack_again_due().is_some_and(|at| at <= now);
        if !(owed || again) || !self.role.receiver || self.status != Status::Normal {
            return None;
        }
        self.ack_packet_now(owed, now)
    }

    pub(super) fn ack_packet_now(&mut self, fresh: bool, now: Micros) -> Option<Transmit> {
        let ack = self.ack();
        if fresh {
            self.receive.ack_fresh_at = Some(now);
        }
        self.lease_acking(&ack.counts, now);
        self.ack_sent(fresh, now);
        self.stats.ack_packets_sent += 1;
        Some(self.packet(Destination::All, Body::Ack(ack)))
    }

    /// Resets what we know of the members' logs for a new view.
    pub(super) fn reset_peers(&mut self, now: Micros) {
        self.receive.peers.clear();
        for node in super::members_of(self.members) {
            if node != self.id {
                self.receive.peers.insert(node, Peer::default());
                self.last_heard.insert(node, now);
            }
        }
        self.receive.repair_check_at = now;
        self.receive.end_at_check = self.receive.log.end();
        self.receive.leader_order.clear();
        self.receive.pause = None;
        self.receive.lost_before.clear();
    }
}
