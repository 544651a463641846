//! Round-trip time estimation (Jacobson and Karels) and the retransmission timeout, the
//! smallest of the latest samples (the path's own round trip, without the queues and busy
//! hosts that come and go), and how long the peer holds its ACKs (its ACK delay and its
//! host's lateness, which round-trip samples leave out).

use crate::Micros;

/// Samples above this are taken for clock garbage (a wrapped or forged echo) and ignored.
pub const RTT_SAMPLE_US_MAX: Micros = 60_000_000;

/// How many of the latest samples [`RttEstimator::recent_min_us`] looks at.
pub const RECENT_SAMPLES: usize = 8;

/// [`RttEstimator::hold_peak_us`] is the longest hold of the current window of this length
/// and the one before: a stalled peer's host (1% of its wake-ups, milliseconds late) is
/// seen many times in it at a stream's rate, and the peak is forgotten within two windows
/// once the host is quiet.
pub const HOLD_PEAK_WINDOW_US: Micros = 500_000;

/// [`RttEstimator::hold_peak_wait_us`] waits for the hold peak and this fraction of it
/// again (1/2): a peak is the longest of the stalls a stream happened to see, and the next
/// stall is often a little longer. In test `mirror`'s unfair mix (readers at 0.5, 0.25 and
/// 0.125 of the port on a host stalled on 1% of its wake-ups by up to 5 ms), most timers
/// the slowest reader's server found spurious had waited for a peak of 3-4.4 ms and the
/// ACK came 4.2-5.4 ms after its packet: it resent 0.09-0.40% of its packets, 0.05-0.14%
/// with the margin. Waiting twice as long for a late ACK does not cut them further in a
/// way that pays for the longer wait after a real loss.
pub const HOLD_PEAK_MARGIN_DIVISOR: Micros = 2;

/// Smoothed RTT and its mean deviation, from timestamp echoes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RttEstimator {
    srtt_us: Option<Micros>,
    rttvar_us: Micros,
    rto_us: Micros,
    rto_us_min: Micros,
    rto_us_max: Micros,
    /// The latest samples, a ring; `recent_count` of them are filled.
    recent: [Micros; RECENT_SAMPLES],
    recent_count: usize,
    recent_next: usize,
    /// The peer's smoothed hold time of an ACK and its mean deviation, µs.
    hold_us: Option<Micros>,
    holdvar_us: Micros,
    /// The longest hold since `hold_peak_since`, and the longest of the window before.
    hold_peak_us: Micros,
    hold_peak_prev_us: Micros,
    hold_peak_since: Micros,
}

impl RttEstimator {
    /// An estimator with no samples yet: the RTO is `rto_us_initial`.
    pub fn new(rto_us_initial: Micros, rto_us_min: Micros, rto_us_max: Micros) -> RttEstimator {
        assert!(rto_us_min >= 1 && rto_us_min <= rto_us_initial && rto_us_initial <= rto_us_max);
        RttEstimator {
            srtt_us: None,
            rttvar_us: 0,
            rto_us: rto_us_initial,
            rto_us_min,
            rto_us_max,
            recent: [0; RECENT_SAMPLES],
            recent_count: 0,
            recent_next: 0,
            hold_us: None,
            holdvar_us: 0,
            hold_peak_us: 0,
            hold_peak_prev_us: 0,
            hold_peak_since: 0,
        }
    }

    /// Folds in how long the peer held a packet before acknowledging it (the ACK delay it
    /// reports: from the packet's arrival at its host to the ACK's sending), as
    /// [`RttEstimator::on_sample`] folds in round trips; `now` moves the peak's windows.
    pub fn on_hold(&mut self, held_us: Micros, now: Micros) {
        if held_us > RTT_SAMPLE_US_MAX {
            return;
        }
        let elapsed = now.saturating_sub(self.hold_peak_since);
        if elapsed >= HOLD_PEAK_WINDOW_US {
            // A window or more passed: the current one becomes the one before (or, after two
            // or more, nothing is left of either).
            self.hold_peak_prev_us = if elapsed < 2 * HOLD_PEAK_WINDOW_US {
                self.hold_peak_us
            } else {
                0
            };
            self.hold_peak_us = 0;
            self.hold_peak_since = now;
        }
        self.hold_peak_us = self.hold_peak_us.max(held_us);
        match self.hold_us {
            None => {
                self.hold_us = Some(held_us);
                self.holdvar_us = held_us / 2;
            }
            Some(hold_us) => {
                self.holdvar_us = (3 * self.holdvar_us + hold_us.abs_diff(held_us)) / 4;
                self.hold_us = Some((7 * hold_us + held_us) / 8);
            }
        }
    }

    /// How long past the round trip an ACK may come because the peer held it: its smoothed
    /// hold time and four deviations, at most the RTO's maximum (0 before any sample). On a
    /// busy host the peer's wake-ups are late by as much as the round trip or more, and a
    /// timer that did not wait for them fired before the ACK of a packet that had arrived.
    pub fn hold_allowance_us(&self) -> Micros {
        self.hold_us
            .map_or(0, |hold_us| hold_us + 4 * self.holdvar_us)
            .min(self.rto_us_max)
    }

    /// The longest hold of the last one to two [`HOLD_PEAK_WINDOW_US`], at most the RTO's
    /// maximum. The allowance above follows the holds' mean and deviation, which a peer
    /// stalled on 1% of its wake-ups barely moves; a timer that waits only for it fires in
    /// every stall, before the ACKs of packets that arrived.
    pub fn hold_peak_us(&self) -> Micros {
        self.hold_peak_us
            .max(self.hold_peak_prev_us)
            .min(self.rto_us_max)
    }

    /// What a granted sender's timer waits past the RTO for its peer's stalls: the hold
    /// peak and [`HOLD_PEAK_MARGIN_DIVISOR`] of it again, at most the RTO's maximum.
    pub fn hold_peak_wait_us(&self) -> Micros {
        let peak = self.hold_peak_us();
        (peak + peak / HOLD_PEAK_MARGIN_DIVISOR).min(self.rto_us_max)
    }

    /// Folds one RTT sample in: srtt += (r - srtt)/8, rttvar += (|r - srtt| - rttvar)/4,
    /// rto = srtt + 4 rttvar, clamped.
    pub fn on_sample(&mut self, sample_us: Micros) {
        if sample_us > RTT_SAMPLE_US_MAX {
            return;
        }
        self.recent[self.recent_next] = sample_us;
        self.recent_next = (self.recent_next + 1) % RECENT_SAMPLES;
        self.recent_count = (self.recent_count + 1).min(RECENT_SAMPLES);
        match self.srtt_us {
            None => {
                self.srtt_us = Some(sample_us);
                self.rttvar_us = sample_us / 2;
            }
            Some(srtt_us) => {
                let deviation = srtt_us.abs_diff(sample_us);
                self.rttvar_us = (3 * self.rttvar_us + deviation) / 4;
                self.srtt_us = Some((7 * srtt_us + sample_us) / 8);
            }
        }
        let srtt_us = self.srtt_us.unwrap_or(sample_us);
        self.rto_us =
            (srtt_us + (4 * self.rttvar_us).max(1)).clamp(self.rto_us_min, self.rto_us_max);
    }

    /// The smoothed RTT, if there was a sample.
    pub fn srtt_us(&self) -> Option<Micros> {
        self.srtt_us
    }

    /// The smallest of the latest [`RECENT_SAMPLES`] samples, once there were that many:
    /// what the round trip is when nothing delays it. Unlike srtt it does not follow a
    /// passing queue or a host that was not scheduled, only a round trip that stays long;
    /// a few first samples say too little (a session's first round trips at N = 64 in
    /// `tessera lab incast` were 6 ms and more, while most later ones were under 1 ms).
    pub fn recent_min_us(&self) -> Option<Micros> {
        if self.recent_count < RECENT_SAMPLES {
            return None;
        }
        self.recent.iter().copied().min()
    }

    /// The retransmission timeout without backoff.
    pub fn rto_us(&self) -> Micros {
        self.rto_us
    }

    /// The retransmission timeout after `backoffs` doublings, at most the maximum.
    pub fn rto_us_backed_off(&self, backoffs: u32) -> Micros {
        let factor = 1u64.checked_shl(backoffs).unwrap_or(u64::MAX);
        self.rto_us.saturating_mul(factor).min(self.rto_us_max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_sample_sets_srtt_and_half_variance() {
        let mut rtt = RttEstimator::new(2_000, 300, 200_000);
        assert_eq!(rtt.rto_us(), 2_000);
        rtt.on_sample(1_000);
        assert_eq!(rtt.srtt_us(), Some(1_000));
        assert_eq!(rtt.rto_us(), 3_000);
    }

    #[test]
    fn steady_samples_converge_and_clamp_at_the_floor() {
        let mut rtt = RttEstimator::new(2_000, 300, 200_000);
        for _ in 0..100 {
            rtt.on_sample(100);
        }
        assert_eq!(rtt.srtt_us(), Some(100));
        assert_eq!(rtt.rto_us(), 300);
        assert_eq!(rtt.rto_us_backed_off(3), 2_400);
        assert_eq!(rtt.rto_us_backed_off(40), 200_000);
        assert_eq!(rtt.rto_us_backed_off(100), 200_000);
    }

    #[test]
    fn the_hold_allowance_follows_a_late_peer_and_comes_back() {
        let mut rtt = RttEstimator::new(2_000, 300, 200_000);
        assert_eq!(rtt.hold_allowance_us(), 0);
        for _ in 0..50 {
            rtt.on_hold(100, 0);
        }
        assert_eq!(rtt.hold_allowance_us(), 100);
        // A peer whose host wakes 0-300 µs late: the allowance covers most of its holds.
        let holds: Vec<Micros> = (0..200u64).map(|i| 100 + (i * 37) % 300).collect();
        for &held in &holds {
            rtt.on_hold(held, 0);
        }
        let covered = holds
            .iter()
            .filter(|&&held| held <= rtt.hold_allowance_us())
            .count();
        assert!(
            covered * 100 >= holds.len() * 95,
            "{covered} of {}",
            holds.len()
        );
        // A stall of 5 ms raises it; prompt ACKs bring it back.
        rtt.on_hold(5_000, 0);
        assert!(rtt.hold_allowance_us() >= 5_000);
        for _ in 0..100 {
            rtt.on_hold(100, 0);
        }
        assert!(rtt.hold_allowance_us() < 200, "{}", rtt.hold_allowance_us());
        rtt.on_hold(u64::MAX, 0);
        assert!(rtt.hold_allowance_us() <= 200_000);
    }

    #[test]
    fn the_hold_peak_remembers_a_rare_stall_for_one_to_two_windows() {
        let mut rtt = RttEstimator::new(2_000, 300, 200_000);
        assert_eq!(rtt.hold_peak_us(), 0);
        let mut now = 0;
        for i in 0..1_000u64 {
            now = i * 100;
            rtt.on_hold(if i == 10 { 4_000 } else { 100 }, now);
        }
        // The stall barely moves the mean's allowance, but the peak keeps it.
        assert!(
            rtt.hold_allowance_us() < 1_000,
            "{}",
            rtt.hold_allowance_us()
        );
        assert_eq!(rtt.hold_peak_us(), 4_000);
        assert_eq!(
            rtt.hold_peak_wait_us(),
            6_000,
            "the peak and half of it again"
        );
        rtt.on_hold(100, now + HOLD_PEAK_WINDOW_US);
        assert_eq!(rtt.hold_peak_us(), 4_000, "still in the window before");
        rtt.on_hold(100, now + 2 * HOLD_PEAK_WINDOW_US);
        assert_eq!(rtt.hold_peak_us(), 100);
        rtt.on_hold(3_000, now + 5 * HOLD_PEAK_WINDOW_US);
        rtt.on_hold(100, now + 8 * HOLD_PEAK_WINDOW_US);
        assert_eq!(rtt.hold_peak_us(), 100, "two windows or more passed");
    }

    #[test]
    fn absurd_samples_are_ignored() {
        let mut rtt = RttEstimator::new(2_000, 300, 200_000);
        rtt.on_sample(u32::MAX as u64);
        assert_eq!(rtt.srtt_us(), None);
        assert_eq!(rtt.recent_min_us(), None);
    }

    #[test]
    fn the_recent_minimum_needs_a_full_window_and_forgets_a_short_sample_only_after_it() {
        let mut rtt = RttEstimator::new(2_000, 300, 200_000);
        assert_eq!(rtt.recent_min_us(), None);
        rtt.on_sample(100);
        for _ in 0..RECENT_SAMPLES - 2 {
            rtt.on_sample(5_000);
            assert_eq!(rtt.recent_min_us(), None, "too few samples yet");
        }
        rtt.on_sample(5_000);
        assert_eq!(rtt.recent_min_us(), Some(100));
        rtt.on_sample(4_000);
        assert_eq!(rtt.recent_min_us(), Some(4_000));
        // srtt followed the long samples meanwhile.
        assert!(rtt.srtt_us().unwrap() > 2_000);
    }
}
