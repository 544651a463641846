//! The sender's side: the window of own messages (local flow control), packing deferred
//! messages into MTU-sized packets, retransmission on timeout and on NACK.

use super::{Flight, Node, Resend};
use crate::packet::{self, Ack, Body, Header};
use crate::{Destination, Micros, SenderId, Status, Transmit};
use bytes::Bytes;

impl Node {
    pub(super) fn sender_id(&self) -> SenderId {
        SenderId {
            node: self.id,
            incarnation: self.incarnation,
        }
    }

    /// Learns from any receiver's ACK how many of our messages it UTO-delivered, and how
    /// many its log holds (the window).
    pub(super) fn on_sender_ack(&mut self, header: &Header, ack: &Ack, now: Micros) {
        if !self.role.sender || header.status != Status::Normal {
            return;
        }
        self.send.known_view = self.send.known_view.max(header.view);
        let me = self.sender_id();
        let mine = ack.counts.iter().find(|counts| counts.sender == me);
        let delivered = mine.map_or(0, |counts| counts.delivered);
        self.release(delivered);
        if header.view < self.send.held_view {
            return;
        }
        if header.view > self.send.held_view {
            self.send.held_view = header.view;
            self.send.held_by.clear();
        }
        self.send.held_members = ack.members;
        let held = mine.map_or(0, |counts| counts.held);
        self.send.held_by.insert(header.from, held);
        self.release_window(self.held_now(), now);
    }

    /// How many of our messages every member of the latest view we heard of holds now.
    fn held_now(&self) -> u64 {
        super::members_of(self.send.held_members)
            .into_iter()
            .map(|node| self.send.held_by.get(&node).copied().unwrap_or(0))
            .min()
            .unwrap_or(0)
    }

    /// Frees the window slots of our messages `..held`: every member holds them, so they
    /// no longer queue in the network. We keep them until delivered: a member may still
    /// set one aside and lose it in a view change. The oldest one freed, if sent once,
    /// times how long every member takes to hold a message (see `retransmit_timeout_us`).
    fn release_window(&mut self, held: u64, now: Micros) {
        let held = held.min(self.send.next_seq);
        let mut sample = None;
        while self.send.held_by_all < held {
            let seq = self.send.held_by_all;
            self.send.held_by_all += 1;
            let flight = self.send.in_flight.get(&seq).expect("undelivered");
            if sample.is_none() && !flight.sent_again {
                sample = Some(now.saturating_sub(flight.sent_at));
            }
            take_one(&mut self.send.packets_in_flight, flight.packet);
        }
        if let Some(sample) = sample {
            self.send.hold_us = Some(match self.send.hold_us {
                None => sample,
                Some(smoothed) => (7 * smoothed + sample) / 8,
            });
        }
    }

    /// Forgets our messages `..delivered`: some node UTO-delivered them, so they are in the
    /// log of every later view (I5) and no member needs them from us again.
    pub(super) fn release(&mut self, delivered: u64) {
        // A count past what we sent comes from a confused peer (or an earlier incarnation of
        // ours under the same number): it releases nothing we did not send.
        let delivered = delivered.min(self.send.next_seq);
        while let Some(entry) = self.send.in_flight.first_entry() {
            if *entry.key() >= delivered {
                break;
            }
            let seq = *entry.key();
            let flight = entry.remove();
            if seq >= self.send.held_by_all {
                take_one(&mut self.send.packets_in_flight, flight.packet);
            }
            take_one(&mut self.send.packets_retained, flight.packet);
        }
        self.send.held_by_all = self.send.held_by_all.max(delivered);
        self.send.nacked.retain(|&seq, _| seq >= delivered);
    }

    /// A NACK is answered at the next transmit, except for messages sent again less than
    /// a round trip ago: another receiver's NACK of the loss, or our own broadcast coming
    /// back past it, already answered. A receiver's NACK of a loss travels one trip through
    /// the sequencer link's queue after the sender itself found the loss, so with half a
    /// round trip most losses at a full queue were sent twice (simulator, 5 nodes with the
    /// lab's trunk queue: 1 KiB messages 0.707 of the link, 0.794 with a round trip).
    pub(super) fn on_nack(&mut self, sender: SenderId, from: u64, to: u64, now: Micros) {
        if sender != self.sender_id() {
            return;
        }
        let to = to.min(self.send.next_seq);
        let recent = self.round_trip_us();
        let seqs: Vec<u64> = self
            .send
            .in_flight
            .range(from..to)
            .filter(|(_, flight)| now.saturating_sub(flight.sent_at) >= recent)
            .map(|(&seq, _)| seq)
            .collect();
        for seq in seqs {
            self.send.nacked.entry(seq).or_insert(Resend::Nacked);
        }
    }

    /// A DATA packet: messages due for retransmission first, then new ones while the window
    /// allows, as many as fit the MTU (one, without aggregation); with our ACK if we receive.
    pub(super) fn data_packet(&mut self, now: Micros) -> Option<Transmit> {
        if !self.role.sender {
            return None;
        }
        let mut packer = Packer {
            budget: self.config.packet_bytes_max() - packet::HEADER_LEN - packet::DATA_FIXED_LEN,
            one: !self.config.aggregate,
            messages: Vec::new(),
        };
        let ack = (self.role.receiver && self.status == Status::Normal)
            .then(|| self.ack())
            .filter(|ack| packet::ack_len(ack) <= packer.budget / 2);
        if let Some(ack) = &ack {
            packer.budget -= packet::ack_len(ack);
        }
        self.pack_retransmissions(&mut packer, now);
        self.pack_new(&mut packer, now);
        self.time_window_full(now);
        assert!(self.send.packets_in_flight.len() <= self.config.window_packets as usize);
        if packer.messages.is_empty() {
            return None;
        }
        if let Some(ack) = &ack {
            self.lease_acking(&ack.counts, now);
            self.ack_sent(true, now);
            self.stats.acks_piggybacked += 1;
        }
        self.stats.data_packets_sent += 1;
        let messages = packer.messages;
        let seqs = messages.iter().map(|(seq, _)| *seq).collect();
        let transmit = self.packet(Destination::All, Body::Data { ack, messages });
        if self.send.unreturned.len() == crate::rtt::SENT_REMEMBERED_MAX {
            self.send.unreturned.pop_front();
        }
        let checksum = packet::identity(&transmit.contents);
        self.send.unreturned.push_back((checksum, seqs));
        Some(transmit)
    }

    /// An own broadcast came back: DATA packets sent before it and not back (`lost`) were
    /// lost on the way, to every node or to us: send their messages again at once. A lost
    /// last packet would otherwise wait for the retransmission timeout, since no later
    /// message of ours shows anyone a gap.
    pub(super) fn own_returned(&mut self, bytes: &[u8], lost: &[u32]) {
        let checksum = packet::identity(bytes);
        let unreturned = std::mem::take(&mut self.send.unreturned);
        for (sum, seqs) in unreturned {
            if lost.contains(&sum) {
                for seq in seqs {
                    if self.send.in_flight.contains_key(&seq) {
                        self.send.nacked.entry(seq).or_insert(Resend::Unreturned);
                    }
                }
            } else if sum != checksum {
                self.send.unreturned.push_back((sum, seqs));
            }
        }
    }

    /// An own packet came back through the network, after others that did not (`lost`)
    /// or not: halves the window, or grows it when a window of DATA packets came back
    /// (see [`crate::Config::window_packets_min`]).
    pub(super) fn adapt_window(&mut self, lost: bool, data: bool, now: Micros) {
        let window = self.send.window_packets_now;
        if lost {
            let cut = (window / 2).max(self.config.window_packets_min);
            if now >= self.send.window_cut_until && cut < window {
                self.send.window_packets_now = cut;
                self.send.window_returned = 0;
                self.send.window_cut_until = now + self.round_trip_us();
                self.stats.window_cuts += 1;
            }
            return;
        }
        if !data {
            return;
        }
        self.send.window_returned += 1;
        if self.send.window_returned >= window {
            self.send.window_returned = 0;
            self.send.window_packets_now = (window + 1).min(self.config.window_packets);
        }
    }

    fn time_window_full(&mut self, now: Micros) {
        let full = self.send.packets_in_flight.len() >= self.send.window_packets_now as usize
            && !self.send.queue.is_empty();
        if let Some(since) = self.send.window_full_since.take() {
            self.stats.window_full_us += now - since;
        }
        if full {
            self.send.window_full_since = Some(now);
        }
    }

    fn pack_retransmissions(&mut self, packer: &mut Packer, now: Micros) {
        let held = self.held_now();
        // Due: NACKed, or not held by some member after the retransmission timeout
        // (messages every member holds wait for delivery, not for the network). So the
        // NACKed are looked up and only those not yet held scanned, not every message kept
        // until delivery (up to `RETAINED_WINDOWS` windows of them, at every packet).
        let mut due: Vec<u64> = self
            .send
            .nacked
            .keys()
            .copied()
            .filter(|seq| self.send.in_flight.contains_key(seq))
            .collect();
        let timeout = self.retransmit_timeout_us();
        due.extend(
            self.send
                .in_flight
                .range(held..)
                .filter(|(_, flight)| now.saturating_sub(flight.sent_at) >= timeout)
                .map(|(&seq, _)| seq),
        );
        due.sort_unstable();
        due.dedup();
        let mut timed_out = false;
        for seq in due {
            let flight = self.send.in_flight.get_mut(&seq).expect("due is in flight");
            if !packer.take(seq, &flight.message) {
                break;
            }
            flight.sent_at = now;
            flight.sent_again = true;
            let counter = match self.send.nacked.remove(&seq) {
                Some(Resend::Nacked) => &mut self.stats.retransmitted_nacked,
                Some(Resend::Unreturned) => &mut self.stats.retransmitted_unreturned,
                None => {
                    timed_out = true;
                    &mut self.stats.retransmitted_timeout
                }
            };
            *counter += 1;
            self.stats.retransmitted += 1;
        }
        // A timeout that fired doubles the next (TCP's back-off): a message sent again
        // gives no sample, so a timeout too short for the members would otherwise resend
        // every window for good.
        if timed_out {
            self.send.hold_us = Some(timeout);
        }
    }

    /// How long a message may stay not held by some member before it goes again:
    /// `retransmit_after_us`, or, if longer, twice the time every member took to hold our
    /// messages lately (smoothed by eighths, as TCP smooths its round trip, and timed on
    /// messages sent once only; at most [`RETRANSMIT_STRETCH_MAX`] times the setting). In
    /// the lab's 5-node closed loops of 64-byte messages the receivers could not keep up
    /// (CPU), 16 jumbo packets of ~130 messages per sender waited in their socket buffers
    /// for about as long as the 50 ms timeout, and 40,000-140,000 messages a run went again
    /// on it though none was lost (no queue or socket dropped a frame): every receiver
    /// then took each as a duplicate.
    fn retransmit_timeout_us(&self) -> Micros {
        let after = self.config.retransmit_after_us;
        let hold = self.send.hold_us.unwrap_or(0);
        (2 * hold).clamp(after, RETRANSMIT_STRETCH_MAX * after)
    }

    /// New messages take one window slot, the packet's; retransmissions ride along free.
    fn pack_new(&mut self, packer: &mut Packer, now: Micros) {
        let packet = self.send.next_packet;
        let mut fresh = 0;
        let window = self.send.window_packets_now as usize;
        let retained_max = crate::RETAINED_WINDOWS * self.config.window_packets as usize;
        while self.send.packets_in_flight.len() < window
            && self.send.packets_retained.len() < retained_max
        {
            let Some(message) = self.send.queue.front() else {
                break;
            };
            if !packer.take(self.send.next_seq, message) {
                break;
            }
            let message = self.send.queue.pop_front().expect("front exists");
            let flight = Flight {
                message,
                sent_at: now,
                packet,
                sent_again: false,
            };
            self.send.in_flight.insert(self.send.next_seq, flight);
            self.lease_sent(self.send.next_seq, now);
            self.send.next_seq += 1;
            self.stats.messages_sent += 1;
            fresh += 1;
        }
        if fresh > 0 {
            self.send.packets_in_flight.insert(packet, fresh);
            self.send.packets_retained.insert(packet, fresh);
            self.send.next_packet += 1;
        }
    }
}

/// The retransmission timeout stretches with the measured round trip up to this many times
/// `retransmit_after_us` (see `Node::retransmit_timeout_us`).
const RETRANSMIT_STRETCH_MAX: Micros = 8;

/// One message of `packet` out of a per-packet count; the packet goes when none is left.
fn take_one(packets: &mut std::collections::BTreeMap<u64, u32>, packet: u64) {
    let left = packets.get_mut(&packet).expect("its packet is counted");
    *left -= 1;
    if *left == 0 {
        packets.remove(&packet);
    }
}

/// Messages gathered for one DATA packet, within its byte budget.
struct Packer {
    budget: usize,
    /// Without aggregation: one message per packet.
    one: bool,
    messages: Vec<(u64, Bytes)>,
}

impl Packer {
    fn take(&mut self, seq: u64, message: &Bytes) -> bool {
        let cost = packet::MESSAGE_OVERHEAD + message.len();
        if cost > self.budget || (self.one && !self.messages.is_empty()) {
            return false;
        }
        self.budget -= cost;
        self.messages.push((seq, message.clone()));
        true
    }
}
