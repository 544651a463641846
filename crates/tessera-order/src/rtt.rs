//! The round-trip time, measured on the node's own broadcasts: every node receives what it
//! broadcasts through the network, as everyone does, so the time from sending a packet to
//! receiving it back is one trip through the TX link, the sequencer link (with its queue)
//! and an RX link, the way a retransmission or a repair travels. Twice that, smoothed as
//! TCP smooths its RTT (RFC 6298, gain 1/8) on the way up and by halves on the way down,
//! paces NACKs, answers to them and the leader's repairs, so that loss is repaired in round
//! trips rather than in retransmission timeouts. The fast way down matters: the trip is
//! mostly the sequencer link's queue, which empties within a trip once a hole holds every
//! window full, and repairs paced by the trip of the full queue then idle the network.
//! The shortest trip sampled, the trip through an empty queue, paces what is sent once the
//! network falls quiet: the repeat of a burst's last ACK.

use crate::Micros;
use std::collections::VecDeque;

/// Own broadcasts remembered until they come back (older ones are forgotten: lost).
pub const SENT_REMEMBERED_MAX: usize = 64;

/// The smoothed round trip and the broadcasts whose return it waits for.
#[derive(Debug, Default)]
pub struct RttEstimator {
    /// Smoothed one-way trip of own broadcasts, microseconds; `None` before the first.
    one_way_us: Option<Micros>,
    /// `(identity of the packet (its checksum), when sent)`, oldest first.
    sent: VecDeque<(u32, Micros)>,
    /// Samples taken.
    samples: u64,
    /// The shortest one-way trip sampled: the trip through an empty queue.
    one_way_us_min: Option<Micros>,
}

impl RttEstimator {
    /// An own broadcast of `bytes` left at `now`.
    pub fn on_sent(&mut self, bytes: &[u8], now: Micros) {
        if self.sent.len() == SENT_REMEMBERED_MAX {
            self.sent.pop_front();
        }
        self.sent.push_back((crate::packet::identity(bytes), now));
    }

    /// An own broadcast came back at `now`: one sample, if we remember sending it. Returns
    /// the checksums of the older ones not back yet: lost (the network is FIFO but for rare
    /// reordering).
    pub fn on_returned(&mut self, bytes: &[u8], now: Micros) -> Vec<u32> {
        let checksum = crate::packet::identity(bytes);
        let Some(index) = self.sent.iter().position(|&(sum, _)| sum == checksum) else {
            return Vec::new();
        };
        let (_, sent_at) = self.sent.remove(index).expect("index is within");
        let lost = self.sent.drain(..index).map(|(sum, _)| sum).collect();
        let sample = now.saturating_sub(sent_at);
        self.one_way_us = Some(match self.one_way_us {
            None => sample,
            Some(smoothed) if sample < smoothed => (smoothed + sample) / 2,
            Some(smoothed) => (7 * smoothed + sample) / 8,
        });
        self.samples += 1;
        self.one_way_us_min = Some(self.one_way_us_min.map_or(sample, |min| min.min(sample)));
        lost
    }

    /// The round trip: twice the smoothed one-way trip, within `floor..=ceiling`
    /// (`floor` before the first sample).
    pub fn round_trip_us(&self, floor: Micros, ceiling: Micros) -> Micros {
        self.one_way_us
            .map_or(floor, |one_way| 2 * one_way)
            .clamp(floor, ceiling.max(floor))
    }

    /// The round trip through an empty queue: twice the shortest one-way trip sampled,
    /// within `floor..=ceiling` (`floor` before the first sample). What a packet sent
    /// when the network falls quiet takes.
    pub fn round_trip_us_min(&self, floor: Micros, ceiling: Micros) -> Micros {
        self.one_way_us_min
            .map_or(floor, |one_way| 2 * one_way)
            .clamp(floor, ceiling.max(floor))
    }

    /// The round trip as a packet sent at `now` would see it: the smoothed one, or, if
    /// longer, twice the age of our oldest broadcast not back yet (a lower bound on the
    /// sequencer link's queue while it grows: samples come back only once through it, so
    /// the smoothed trip lags a queue filling up, as at the start of a burst). Within
    /// `floor..=ceiling`.
    pub fn round_trip_us_now(&self, now: Micros, floor: Micros, ceiling: Micros) -> Micros {
        let waiting = self
            .sent
            .front()
            .map_or(0, |&(_, sent_at)| 2 * now.saturating_sub(sent_at));
        self.round_trip_us(floor, ceiling)
            .max(waiting)
            .clamp(floor, ceiling.max(floor))
    }

    /// The sequencer link's queue as our broadcasts see it: the smoothed one-way trip
    /// less the shortest one (0 before the first sample; no floor: the wait in a queue,
    /// not a pace for repairs).
    pub fn queue_us(&self) -> Micros {
        match (self.one_way_us, self.one_way_us_min) {
            (Some(one_way), Some(min)) => one_way.saturating_sub(min),
            _ => 0,
        }
    }

    /// Samples taken.
    pub fn samples(&self) -> u64 {
        self.samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smooths_and_clamps() {
        let mut rtt = RttEstimator::default();
        assert_eq!(rtt.round_trip_us(100, 1_000), 100);
        rtt.on_sent(b"a", 0);
        rtt.on_sent(b"b", 10);
        rtt.on_returned(b"b", 410);
        // "a" was not back when a later one was: forgotten.
        rtt.on_returned(b"a", 500);
        assert_eq!(rtt.samples(), 1);
        assert_eq!(rtt.round_trip_us(100, 10_000), 800);
        assert_eq!(rtt.round_trip_us(100, 500), 500);
        rtt.on_sent(b"c", 1_000);
        rtt.on_returned(b"c", 1_200);
        // Down by halves: the queue emptied.
        assert_eq!(rtt.round_trip_us(100, 10_000), 2 * ((400 + 200) / 2));
        rtt.on_sent(b"d", 2_000);
        rtt.on_returned(b"d", 2_700);
        // Up by eighths.
        assert_eq!(rtt.round_trip_us(100, 10_000), 2 * ((7 * 300 + 700) / 8));
        assert_eq!(rtt.round_trip_us(1_000, 10_000), 1_000);
        // The shortest trip stays, whatever the smoothed one does.
        assert_eq!(rtt.round_trip_us_min(100, 10_000), 400);
        assert_eq!(rtt.round_trip_us_min(500, 10_000), 500);
        // A broadcast not back for 900 us: the queue holds at least that much.
        rtt.on_sent(b"e", 3_000);
        assert_eq!(
            rtt.round_trip_us_now(3_100, 100, 10_000),
            2 * ((7 * 300 + 700) / 8)
        );
        assert_eq!(rtt.round_trip_us_now(3_900, 100, 10_000), 1_800);
        assert_eq!(rtt.round_trip_us_now(3_900, 100, 1_000), 1_000);
    }
}
