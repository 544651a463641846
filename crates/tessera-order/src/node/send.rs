//! The sender's side: the window of own messages (local flow control), packing deferred
//! messages into MTU-sized packets, retransmission on timeout and on NACK.

use super::{Flight, Node};
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

    /// Learns from any receiver's ACK how many of our messages it UTO-delivered.
    pub(super) fn on_sender_ack(&mut self, header: &Header, ack: &Ack) {
        if !self.role.sender || header.status != Status::Normal {
            return;
        }
        self.send.known_view = self.send.known_view.max(header.view);
        let me = self.sender_id();
        let delivered = ack
            .counts
            .iter()
            .find(|(sender, _)| *sender == me)
            .map_or(0, |(_, count)| *count);
        self.release(delivered);
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
            let flight = entry.remove();
            let left = self
                .send
                .packets_in_flight
                .get_mut(&flight.packet)
                .expect("its packet is in flight");
            *left -= 1;
            if *left == 0 {
                self.send.packets_in_flight.remove(&flight.packet);
            }
        }
        self.send.nacked.retain(|&seq| seq >= delivered);
    }

    /// A NACK is answered at the next transmit, except for messages sent again less than
    /// half a round trip ago: another receiver's NACK of the loss already answered.
    pub(super) fn on_nack(&mut self, sender: SenderId, from: u64, to: u64, now: Micros) {
        if sender != self.sender_id() {
            return;
        }
        let to = to.min(self.send.next_seq);
        let recent = self.round_trip_us() / 2;
        let seqs: Vec<u64> = self
            .send
            .in_flight
            .range(from..to)
            .filter(|(_, flight)| now.saturating_sub(flight.sent_at) >= recent)
            .map(|(&seq, _)| seq)
            .collect();
        self.send.nacked.extend(seqs);
    }

    fn retransmission_due(&self, seq: u64, flight: &Flight, now: Micros) -> bool {
        let since = now.saturating_sub(flight.sent_at);
        since >= self.config.retransmit_after_us || self.send.nacked.contains(&seq)
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
        assert!(self.send.packets_in_flight.len() <= self.config.window_packets as usize);
        if packer.messages.is_empty() {
            return None;
        }
        if ack.is_some() {
            self.ack_sent();
            self.stats.acks_piggybacked += 1;
        }
        self.stats.data_packets_sent += 1;
        let messages = packer.messages;
        Some(self.packet(Destination::All, Body::Data { ack, messages }))
    }

    fn pack_retransmissions(&mut self, packer: &mut Packer, now: Micros) {
        let due: Vec<u64> = self
            .send
            .in_flight
            .iter()
            .filter(|(&seq, flight)| self.retransmission_due(seq, flight, now))
            .map(|(&seq, _)| seq)
            .collect();
        for seq in due {
            let flight = self.send.in_flight.get_mut(&seq).expect("due is in flight");
            if !packer.take(seq, &flight.message) {
                break;
            }
            flight.sent_at = now;
            self.send.nacked.remove(&seq);
            self.stats.retransmitted += 1;
        }
    }

    /// New messages take one window slot, the packet's; retransmissions ride along free.
    fn pack_new(&mut self, packer: &mut Packer, now: Micros) {
        let packet = self.send.next_packet;
        let mut fresh = 0;
        while self.send.packets_in_flight.len() < self.config.window_packets as usize {
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
            };
            self.send.in_flight.insert(self.send.next_seq, flight);
            self.send.next_seq += 1;
            self.stats.messages_sent += 1;
            fresh += 1;
        }
        if fresh > 0 {
            self.send.packets_in_flight.insert(packet, fresh);
            self.send.next_packet += 1;
        }
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
