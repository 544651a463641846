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

    /// Learns from any receiver's ACK how many of our messages its log holds.
    pub(super) fn on_sender_ack(&mut self, header: &Header, ack: &Ack) {
        if !self.role.sender || header.status != Status::Normal {
            return;
        }
        let me = self.sender_id();
        let count = ack
            .counts
            .iter()
            .find(|(sender, _)| *sender == me)
            .map_or(0, |(_, count)| *count);
        self.send.acks.insert(header.from, (header.view, count));
        if header.view > self.send.known_view {
            self.send.known_view = header.view;
            self.send.known_members = ack.members;
        }
        self.release();
    }

    /// Forgets the messages every member of the latest view known holds: they are in every
    /// log that any later view can start from (see the safety argument).
    fn release(&mut self) {
        let view = self.send.known_view;
        let acked = super::members_of(self.send.known_members)
            .into_iter()
            .map(|node| match self.send.acks.get(&node) {
                Some(&(acked_view, count)) if acked_view == view => count,
                _ => 0,
            })
            .min()
            .unwrap_or(0);
        assert!(
            acked <= self.send.next_seq,
            "acked {acked} messages never sent"
        );
        while let Some(entry) = self.send.in_flight.first_entry() {
            if *entry.key() >= acked {
                break;
            }
            entry.remove();
        }
        self.send.nacked.retain(|&seq| seq >= acked);
    }

    pub(super) fn on_nack(&mut self, sender: SenderId, from: u64, to: u64) {
        if sender != self.sender_id() {
            return;
        }
        let to = to.min(self.send.next_seq);
        let seqs: Vec<u64> = self
            .send
            .in_flight
            .range(from..to)
            .map(|(&seq, _)| seq)
            .collect();
        self.send.nacked.extend(seqs);
    }

    fn retransmission_due(&self, seq: u64, flight: &Flight, now: Micros) -> bool {
        let since = now.saturating_sub(flight.sent_at);
        since >= self.config.retransmit_after_us
            || (self.send.nacked.contains(&seq) && since >= self.config.retransmit_after_us / 4)
    }

    /// A DATA packet: messages due for retransmission first, then new ones while the window
    /// allows, as many as fit the MTU (one, without aggregation); with our ACK if we receive.
    pub(super) fn data_packet(&mut self, now: Micros) -> Option<Transmit> {
        if !self.role.sender {
            return None;
        }
        let mut budget =
            self.config.packet_bytes_max() - packet::HEADER_LEN - packet::DATA_FIXED_LEN;
        let ack = (self.role.receiver && self.status == Status::Normal)
            .then(|| self.ack())
            .filter(|ack| packet::ack_len(ack) <= budget / 2);
        if let Some(ack) = &ack {
            budget -= packet::ack_len(ack);
        }
        let one = !self.config.aggregate;
        let mut messages: Vec<(u64, Bytes)> = Vec::new();
        let mut take = |messages: &mut Vec<(u64, Bytes)>, seq: u64, message: &Bytes| {
            let cost = packet::MESSAGE_OVERHEAD + message.len();
            if cost > budget || (one && !messages.is_empty()) {
                return false;
            }
            budget -= cost;
            messages.push((seq, message.clone()));
            true
        };
        let due: Vec<u64> = self
            .send
            .in_flight
            .iter()
            .filter(|(&seq, flight)| self.retransmission_due(seq, flight, now))
            .map(|(&seq, _)| seq)
            .collect();
        for seq in due {
            let flight = self.send.in_flight.get_mut(&seq).expect("due is in flight");
            if !take(&mut messages, seq, &flight.message) {
                break;
            }
            flight.sent_at = now;
            self.send.nacked.remove(&seq);
            self.stats.retransmitted += 1;
        }
        while self.send.in_flight.len() < self.config.window_messages as usize {
            let Some(message) = self.send.queue.front() else {
                break;
            };
            let seq = self.send.next_seq;
            if !take(&mut messages, seq, message) {
                break;
            }
            let message = self.send.queue.pop_front().expect("front exists");
            self.send.in_flight.insert(
                seq,
                Flight {
                    message,
                    sent_at: now,
                },
            );
            self.send.next_seq += 1;
            self.stats.messages_sent += 1;
        }
        assert!(self.send.in_flight.len() <= self.config.window_messages as usize);
        if messages.is_empty() {
            return None;
        }
        if ack.is_some() {
            self.ack_sent();
        }
        Some(self.packet(Destination::All, Body::Data { ack, messages }))
    }
}
